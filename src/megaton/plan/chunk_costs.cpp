#include "megaton/plan/chunk_costs.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "megaton/core/error.h"
#include "megaton/plan/collective_cost.h"
#include "megaton/plan/op_counts.h"

namespace megaton::plan {

PhaseCost operator*(double k, PhaseCost c) {
  c.compute_s *= k;
  c.memory_s *= k;
  c.overhead_s *= k;
  c.comm_s *= k;
  c.flops *= k;
  return c;
}

PhaseCost& PhaseCost::operator+=(const PhaseCost& o) {
  compute_s += o.compute_s;
  memory_s += o.memory_s;
  overhead_s += o.overhead_s;
  comm_s += o.comm_s;
  flops += o.flops;
  return *this;
}

const LinkSpec& group_link(const SystemSpec& s, GroupShape g) {
  return (g.size - 1) * g.stride < s.devices_per_node ? s.intra_node : s.inter_node;
}

double collective_seconds(const SystemSpec& s, Collective c, GroupShape g, double bytes) {
  return collective_time(c, group_link(s, g), g.size, bytes);
}

Groups groups_of(const train::TrainConfig& c) {
  const int64_t tp = c.tensor_model_parallel_size, dp = std::max<int64_t>(1, c.data_parallel_size);
  const int64_t ep = c.expert_model_parallel_size;
  return {{tp, 1}, {dp, tp}, {c.pipeline_model_parallel_size, tp * dp}, {ep, 1}, {tp * dp / ep, ep}};
}

std::string compute_dtype(const train::TrainConfig& c) { return c.bf16 ? "bf16" : c.fp16 ? "fp16" : "f32"; }

namespace {

enum Phase { F, B, W };

// Charges ops to the three phases of one chunk.
class Ledger {
 public:
  Ledger(const train::TrainConfig& c, const SystemSpec& s) : c_(c), s_(s) {}
  const train::TrainConfig& config() const { return c_; }
  const SystemSpec& system() const { return s_; }
  PhaseCost& at(Phase p) { return phase(cost, p); }
  static PhaseCost& phase(ChunkCost& k, Phase p) {
    return p == F ? k.forward : p == B ? k.backward_input : k.backward_weight;
  }

  void gemm(Phase p, double m, double n, double k, const std::string& dtype) {
    if (m <= 0 || n <= 0 || k <= 0) return;
    const double flops = gemm_flops(m, n, k);
    const double eff = s_.gemm_efficiency(dtype, int64_t(m), int64_t(n), int64_t(k));
    at(p).compute_s += flops / (s_.peak(dtype) * eff);
    at(p).flops += flops;
    at(p).overhead_s += s_.op_overhead_s;
  }
  // Causal attention over `pairs` (sequence, head) pairs; the dtype's table, or f32's where the
  // system has none for it (the CPU kernels compute attention in f32 whatever the compute dtype).
  void attention(Phase p, double pairs, double seq, double qk, double v) {
    std::string dtype = compute_dtype(c_);
    bool has = false;
    for (const AttentionPoint& a : s_.attention) has = has || a.dtype == dtype;
    if (!has) dtype = "f32";
    const bool backward = p != F;
    const double flops = pairs * attention_flops(seq, qk, v, backward);
    const double eff = s_.attention_efficiency(dtype, int64_t(seq), int64_t(qk), backward);
    at(p).compute_s += flops / (s_.peak(dtype) * eff);
    at(p).flops += flops;
    at(p).overhead_s += s_.op_overhead_s;
  }
  void memory(Phase p, MemoryOp op, double bytes) {
    if (bytes <= 0) return;
    at(p).memory_s += bytes / (s_.memory_bandwidth_Bps * s_.memory_efficiency.at(op));
    at(p).overhead_s += s_.op_overhead_s;
  }
  // A collective the module waits on; `hidden_behind` seconds of compute run while it travels.
  void comm(Phase p, Collective col, GroupShape g, double bytes, double hidden_behind = 0) {
    if (g.size <= 1) return;
    at(p).comm_s += std::max(0.0, collective_seconds(s_, col, g, bytes) - hidden_behind);
  }
  ChunkCost cost;

 private:
  const train::TrainConfig& c_;
  const SystemSpec& s_;
};

enum class Split { Replicated, Column, Row };

// The shapes of one micro-batch on this rank.
struct Shapes {
  double rows;     // tokens of the micro-batch
  double sp_rows;  // rows the sequence-parallel region holds (rows / tp under sequence parallelism)
  double elem;     // bytes of an activation element
  double tp;
  bool sp;
  std::string dtype;  // of the compute-dtype GEMMs
};

Shapes shapes_of(const train::TrainConfig& c) {
  Shapes s;
  s.rows = double(c.micro_batch_size) * double(c.seq_length);
  s.tp = double(c.tensor_model_parallel_size);
  s.sp = c.sequence_parallel;
  s.sp_rows = s.sp ? s.rows / s.tp : s.rows;
  s.elem = c.bf16 || c.fp16 ? 2.0 : 4.0;
  s.dtype = compute_dtype(c);
  return s;
}

// x[rows, in] -> y[rows, out]: F y = x W^T, B dx = dy W, W dW = dy^T x (+ the bias gradient).
void linear(Ledger& L, const Shapes& sh, double rows, double in, double out, Split split, const std::string& dtype) {
  if (split == Split::Column) out /= sh.tp;
  if (split == Split::Row) in /= sh.tp;
  L.gemm(F, rows, out, in, dtype);
  L.gemm(B, rows, in, out, dtype);
  L.gemm(W, out, in, rows, dtype);
  if (L.config().model.add_bias_linear) L.memory(W, MemoryOp::Elementwise, rows * out * sh.elem);
}

// Entering a tensor-parallel region (before column-parallel linears reading `cols` per row):
// all-gather of the rows under sequence parallelism, whose B reduce-scatters; without it the input
// gradient's all-reduce in B.
void enter_region(Ledger& L, const Shapes& sh, double cols) {
  const GroupShape tp = groups_of(L.config()).tp;
  const double bytes = sh.rows * cols * sh.elem;
  if (sh.sp) {
    L.comm(F, Collective::AllGather, tp, bytes);
    L.comm(B, Collective::ReduceScatter, tp, bytes);
  } else {
    L.comm(B, Collective::AllReduce, tp, bytes);
  }
}

// Leaving it (after a row-parallel linear): the partial outputs all-reduced (reduce-scattered under
// sequence parallelism, whose B all-gathers the output gradient).
void leave_region(Ledger& L, const Shapes& sh, double cols) {
  const GroupShape tp = groups_of(L.config()).tp;
  const double bytes = sh.rows * cols * sh.elem;
  if (sh.sp) {
    L.comm(F, Collective::ReduceScatter, tp, bytes);
    L.comm(B, Collective::AllGather, tp, bytes);
  } else {
    L.comm(F, Collective::AllReduce, tp, bytes);
  }
}

void norm(Ledger& L, const Shapes& sh, double rows, double cols) {
  L.memory(F, MemoryOp::Norm, norm_bytes(rows, cols, sh.elem, false));
  L.memory(B, MemoryOp::Norm, norm_bytes(rows, cols, sh.elem, true));
  L.memory(W, MemoryOp::Norm, 2.0 * rows * cols * sh.elem);  // the weight (and bias) gradient sums
}

// A residual add (its backward passes the gradient on: one more add where the branch joins).
void residual(Ledger& L, const Shapes& sh, double cols) {
  L.memory(F, MemoryOp::Elementwise, elementwise_bytes(sh.sp_rows * cols, sh.elem));
  L.memory(B, MemoryOp::Elementwise, elementwise_bytes(sh.sp_rows * cols, sh.elem));
}

// The attention core of `heads` local heads (F, and its B).
void core_attention(Ledger& L, const Shapes& sh, double heads, double qk, double v) {
  const train::TrainConfig& c = L.config();
  const double pairs = double(c.micro_batch_size) * heads, seq = double(c.seq_length);
  L.attention(F, pairs, seq, qk, v);
  L.attention(B, pairs, seq, qk, v);
}

void self_attention(Ledger& L, const Shapes& sh) {
  const models::TransformerConfig& m = L.config().model;
  const double C = double(m.hidden_size), d = double(m.head_dim()), h = double(m.num_attention_heads);
  const double g = double(m.num_query_groups);
  // kv heads replicated when tp exceeds the groups: each rank still computes whole kv heads.
  const double local_qkv = (h / sh.tp + 2.0 * std::max(1.0, g / sh.tp)) * d;
  enter_region(L, sh, C);
  linear(L, sh, sh.rows, C, local_qkv * sh.tp, Split::Column, sh.dtype);
  if (m.position_embedding == models::PositionEmbedding::Rope) {
    const double cols = (h / sh.tp + std::max(1.0, g / sh.tp)) * d;
    L.memory(F, MemoryOp::Rope, rope_bytes(sh.rows, cols, sh.elem));
    L.memory(B, MemoryOp::Rope, rope_bytes(sh.rows, cols, sh.elem));
  }
  core_attention(L, sh, h / sh.tp, d, d);
  linear(L, sh, sh.rows, h * d, C, Split::Row, sh.dtype);
  leave_region(L, sh, C);
}

void mla_attention(Ledger& L, const Shapes& sh) {
  const models::TransformerConfig& m = L.config().model;
  const nn::MlaConfig& a = m.mla;
  const double C = double(m.hidden_size), h = double(m.num_attention_heads);
  const double qk = double(a.qk_head_dim), rope = double(a.qk_pos_emb_head_dim), v = double(a.v_head_dim);
  const double q_rank = double(a.q_lora_rank), kv_rank = double(a.kv_lora_rank);
  // The down-projections and latent norms are replicated and run on this rank's rows (its
  // sequence-parallel rows); the up-projections gather the latents.
  if (q_rank > 0) {
    linear(L, sh, sh.sp_rows, C, q_rank, Split::Replicated, sh.dtype);
    norm(L, sh, sh.sp_rows, q_rank);
    enter_region(L, sh, q_rank);
    linear(L, sh, sh.rows, q_rank, h * (qk + rope), Split::Column, sh.dtype);
  } else {
    enter_region(L, sh, C);
    linear(L, sh, sh.rows, C, h * (qk + rope), Split::Column, sh.dtype);
  }
  linear(L, sh, sh.sp_rows, C, kv_rank + rope, Split::Replicated, sh.dtype);
  norm(L, sh, sh.sp_rows, kv_rank);
  enter_region(L, sh, kv_rank + rope);
  linear(L, sh, sh.rows, kv_rank, h * (qk + v), Split::Column, sh.dtype);
  const double rope_cols = (h / sh.tp + 1.0) * rope;
  L.memory(F, MemoryOp::Rope, rope_bytes(sh.rows, rope_cols, 4.0));
  L.memory(B, MemoryOp::Rope, rope_bytes(sh.rows, rope_cols, 4.0));
  core_attention(L, sh, h / sh.tp, qk + rope, v);
  linear(L, sh, sh.rows, h * v, C, Split::Row, sh.dtype);
  leave_region(L, sh, C);
}

// A dense MLP of hidden size `ffn` split over the tensor-parallel group: fc1 -> activation -> fc2.
void dense_mlp(Ledger& L, const Shapes& sh, double ffn, bool gated) {
  const double C = double(L.config().model.hidden_size);
  enter_region(L, sh, C);
  linear(L, sh, sh.rows, C, gated ? 2.0 * ffn : ffn, Split::Column, sh.dtype);
  L.memory(F, MemoryOp::Activation, activation_bytes(sh.rows, ffn / sh.tp, sh.elem, gated, false));
  L.memory(B, MemoryOp::Activation, activation_bytes(sh.rows, ffn / sh.tp, sh.elem, gated, true));
  linear(L, sh, sh.rows, ffn, C, Split::Row, sh.dtype);
  leave_region(L, sh, C);
}

// DeepSeek-V3 / Mixtral MoE: the router on every token of the micro-batch, each tp rank sending its
// block of rows to the experts (E / ep on each rank, whole), the shared expert a tensor-parallel MLP.
// Routing is taken as balanced (the planner cannot know the router's loads).
void moe_mlp(Ledger& L, const Shapes& sh) {
  const train::TrainConfig& c = L.config();
  const nn::MoeConfig& moe = c.model.moe;
  const Groups gr = groups_of(c);
  const double C = double(c.model.hidden_size), E = double(moe.num_moe_experts), k = double(moe.moe_router_topk);
  const double ffn = double(moe.moe_ffn_hidden_size), ep = double(c.expert_model_parallel_size);
  // Router (fp32) over every row, gathered under sequence parallelism.
  if (sh.sp) {
    L.comm(F, Collective::AllGather, gr.tp, sh.rows * C * sh.elem);
    L.comm(B, Collective::ReduceScatter, gr.tp, sh.rows * C * sh.elem);
  }
  L.gemm(F, sh.rows, E, C, "f32");
  L.gemm(B, sh.rows, C, E, "f32");
  L.gemm(W, E, C, sh.rows, "f32");
  L.memory(F, MemoryOp::Elementwise, 3.0 * sh.rows * E * 4.0);  // scores, top-k, probs
  L.memory(B, MemoryOp::Elementwise, 3.0 * sh.rows * E * 4.0);
  // This rank's slots: its block of rows times k; balanced over the experts, each rank's E / ep
  // experts receive as many slots from the ep group as it sends.
  const double slots = sh.rows / sh.tp * k;
  const double dropless_rows = moe.moe_expert_capacity_factor > 0 ? std::min(1.0, moe.moe_expert_capacity_factor) : 1.0;
  const double expert_rows = slots * dropless_rows / (E / ep);
  const double local_experts = E / ep;
  for (int i = 0; i < 2; ++i) {  // permute and unpermute, and their backward
    L.memory(F, MemoryOp::Elementwise, 2.0 * slots * C * sh.elem);
    L.memory(B, MemoryOp::Elementwise, 2.0 * slots * C * sh.elem);
  }
  // Every local expert runs the same GEMMs (fc1 then fc2): one expert's, times the experts.
  Ledger expert(c, L.system());
  expert.gemm(F, expert_rows, 2 * ffn, C, sh.dtype);
  expert.gemm(B, expert_rows, C, 2 * ffn, sh.dtype);
  expert.gemm(W, 2 * ffn, C, expert_rows, sh.dtype);
  expert.gemm(F, expert_rows, C, ffn, sh.dtype);
  expert.gemm(B, expert_rows, ffn, C, sh.dtype);
  expert.gemm(W, C, ffn, expert_rows, sh.dtype);
  for (Phase p : {F, B, W}) L.at(p) += local_experts * expert.at(p);
  L.memory(F, MemoryOp::Activation, activation_bytes(slots, ffn, sh.elem, true, false));
  L.memory(B, MemoryOp::Activation, activation_bytes(slots, ffn, sh.elem, true, true));
  // The shared expert, and the token traffic it may hide.
  Ledger shared(c, L.system());
  if (moe.moe_shared_expert_intermediate_size > 0)
    dense_mlp(shared, sh, double(moe.moe_shared_expert_intermediate_size), true);
  // Of the two token transfers of each direction the engine overlaps one with the shared expert
  // (token_dispatcher.cpp: the dispatch in F, the combine's backward in B) and waits for the other
  // (the combine in F, the dispatch's backward in B); the forward first swaps the counts, blocking.
  if (ep > 1) {
    const auto hidden = [&](Phase p) { return moe.moe_shared_expert_overlap ? shared.at(p).seconds() : 0.0; };
    const double rows = sh.rows / sh.tp;
    double overlapped = 0, waited = 0, counts = 0;
    if (moe.moe_token_dispatcher_type == "alltoall") {
      overlapped = waited = collective_seconds(L.system(), Collective::AllToAll, gr.ep, slots * C * sh.elem);
      counts = collective_seconds(L.system(), Collective::AllToAll, gr.ep, 8.0 * E);
    } else {  // allgather: tokens gathered (and slots and probs, blocking); partial outputs reduce-scattered in f32
      overlapped = collective_seconds(L.system(), Collective::AllGather, gr.ep, ep * rows * C * sh.elem);
      waited = collective_seconds(L.system(), Collective::ReduceScatter, gr.ep, ep * rows * C * 4.0);
      counts = 2.0 * collective_seconds(L.system(), Collective::AllGather, gr.ep, ep * rows * k * 4.0);
    }
    L.at(F).comm_s += counts + waited + std::max(0.0, overlapped - hidden(F));
    L.at(B).comm_s += waited + std::max(0.0, overlapped - hidden(B));
  }
  // Without sequence parallelism each tp rank's block of outputs (and input gradients) is gathered.
  if (!sh.sp && sh.tp > 1) {
    L.comm(F, Collective::AllGather, gr.tp, sh.rows * C * sh.elem);
    L.comm(B, Collective::AllGather, gr.tp, sh.rows * C * sh.elem);
  }
  for (Phase p : {F, B, W}) L.at(p) += shared.at(p);
}

bool gated(const models::TransformerConfig& m) { return m.activation == models::Activation::SwiGLU; }

void attention_sublayer(Ledger& L, const Shapes& sh) {
  if (L.config().model.is_mla())
    mla_attention(L, sh);
  else
    self_attention(L, sh);
}

void mlp_sublayer(Ledger& L, const Shapes& sh, int64_t layer) {
  const models::TransformerConfig& m = L.config().model;
  if (m.is_moe_layer(layer))
    moe_mlp(L, sh);
  else
    dense_mlp(L, sh, double(m.ffn_hidden_size), gated(m));
}

// The GEMM dtype of `layer`'s linears: FP8 where the recipe covers the layer and the system has
// FP8 GEMMs, else the compute dtype (the CPU runs FP8 operands through bf16 GEMMs).
std::string layer_dtype(const train::TrainConfig& c, const SystemSpec& s, int64_t layer) {
  if (!c.fp8.empty()) {
    const auto [first, end] = train::fp8_layer_range(c, c.model.num_layers);
    if (layer >= first && layer < end) return s.peak_flops.count("fp8") ? "fp8" : "bf16";
  }
  return compute_dtype(c);
}

// One transformer layer: norm, attention, residual, norm, MLP, residual.
void layer(Ledger& L, Shapes sh, int64_t index) {
  sh.dtype = layer_dtype(L.config(), L.system(), index);
  const double C = double(L.config().model.hidden_size);
  norm(L, sh, sh.sp_rows, C);
  attention_sublayer(L, sh);
  residual(L, sh, C);
  norm(L, sh, sh.sp_rows, C);
  mlp_sublayer(L, sh, index);
  residual(L, sh, C);
}

// The forward of `what` run again in B (activation recompute).
template <typename Fn>
void recompute(Ledger& L, Fn&& what) {
  Ledger again(L.config(), L.system());
  what(again);
  L.at(B) += again.at(F);
}

void layer_with_recompute(Ledger& L, const Shapes& sh, int64_t index, bool full) {
  layer(L, sh, index);
  if (full) return recompute(L, [&](Ledger& again) { layer(again, sh, index); });
  const nn::RecomputeConfig rc = train::recompute_config(L.config());
  if (rc.granularity != nn::RecomputeGranularity::Selective) return;
  const models::TransformerConfig& m = L.config().model;
  Shapes lsh = sh;
  lsh.dtype = layer_dtype(L.config(), L.system(), index);
  if (rc.core_attn) {
    const double qk = m.is_mla() ? double(m.mla.qk_head_dim + m.mla.qk_pos_emb_head_dim) : double(m.head_dim());
    const double v = m.is_mla() ? double(m.mla.v_head_dim) : double(m.head_dim());
    recompute(L, [&](Ledger& again) { core_attention(again, lsh, double(m.num_attention_heads) / lsh.tp, qk, v); });
  }
  if (rc.mlp) recompute(L, [&](Ledger& again) { mlp_sublayer(again, lsh, index); });
  if (rc.layernorm)
    recompute(L, [&](Ledger& again) {
      norm(again, lsh, lsh.sp_rows, double(m.hidden_size));
      norm(again, lsh, lsh.sp_rows, double(m.hidden_size));
    });
  if (rc.moe_act && m.is_moe_layer(index)) {
    const double slots = sh.rows / sh.tp * double(m.moe.moe_router_topk);
    recompute(L, [&](Ledger& again) {
      again.memory(F, MemoryOp::Activation,
                   activation_bytes(slots, double(m.moe.moe_ffn_hidden_size), sh.elem, true, false));
    });
  }
}

// Word (and learned position) embedding: the vocab-parallel lookup all-reduced over tp
// (reduce-scattered to this rank's rows under sequence parallelism).
void embedding(Ledger& L, const Shapes& sh) {
  const models::TransformerConfig& m = L.config().model;
  const double C = double(m.hidden_size);
  L.memory(F, MemoryOp::Embedding, embedding_bytes(sh.rows, C, sh.elem, false));
  L.memory(W, MemoryOp::Embedding, embedding_bytes(sh.rows, C, sh.elem, true));
  if (m.position_embedding == models::PositionEmbedding::LearnedAbsolute) {
    L.memory(F, MemoryOp::Elementwise, elementwise_bytes(sh.sp_rows * C, sh.elem));
    L.memory(W, MemoryOp::Embedding, embedding_bytes(sh.rows, C, sh.elem, true));
  }
  const GroupShape tp = groups_of(L.config()).tp;
  L.comm(F, sh.sp ? Collective::ReduceScatter : Collective::AllReduce, tp, sh.rows * C * sh.elem);
}

// Final norm, then the fused output layer and cross-entropy: in a training step its forward computes
// the logits, the loss, dlogits and dx (and, unless W is deferred, dW: charged to W here, which the
// schedules run right after B unless they defer it).
void output_head(Ledger& L, const Shapes& sh) {
  const train::TrainConfig& c = L.config();
  const double C = double(c.model.hidden_size);
  const double V = double(c.model.padded_vocab_size(c.tensor_model_parallel_size)) / sh.tp;
  norm(L, sh, sh.sp_rows, C);
  enter_region(L, sh, C);
  L.gemm(F, sh.rows, V, C, sh.dtype);
  L.memory(F, MemoryOp::CrossEntropy, cross_entropy_bytes(sh.rows, V, sh.elem, false));
  L.memory(F, MemoryOp::CrossEntropy, cross_entropy_bytes(sh.rows, V, sh.elem, true));
  L.comm(F, Collective::AllReduce, groups_of(c).tp, 3.0 * sh.rows * 4.0);  // row max, sum-exp, target logit
  L.gemm(F, sh.rows, C, V, sh.dtype);
  L.gemm(W, V, C, sh.rows, sh.dtype);
}

// DeepSeek-V3's multi-token prediction depths, after the main loss (whole model on this rank).
void mtp_depths(Ledger& L, const Shapes& sh) {
  const models::TransformerConfig& m = L.config().model;
  const double C = double(m.hidden_size);
  for (int64_t d = 0; d < m.mtp_num_layers; ++d) {
    embedding(L, sh);
    norm(L, sh, sh.sp_rows, C);
    norm(L, sh, sh.sp_rows, C);
    linear(L, sh, sh.rows, 2 * C, C, Split::Replicated, sh.dtype);
    layer(L, sh, m.num_layers);
    output_head(L, sh);
  }
}

}  // namespace

ChunkCost chunk_cost(const train::TrainConfig& c, const SystemSpec& s, const models::StageLayout& layout,
                     int64_t model_chunk) {
  if (model_chunk < 0 || size_t(model_chunk) >= layout.num_chunks())
    fail("chunk_cost: model chunk ", model_chunk, " of ", layout.num_chunks());
  Ledger L(c, s);
  const Shapes sh = shapes_of(c);
  int64_t first = 0;
  for (int64_t i = 0; i < model_chunk; ++i) first += layout.chunk_layers[size_t(i)];
  const int64_t n = layout.chunk_layers[size_t(model_chunk)];
  if (model_chunk == 0) embedding(L, sh);
  const nn::RecomputeConfig rc = train::recompute_config(c);
  // Layers of the same kind cost the same: each kind (MLP kind, GEMM dtype, fully recomputed or not)
  // is costed once.
  std::map<std::tuple<bool, std::string, bool>, ChunkCost> kinds;
  for (int64_t i = 0; i < n; ++i) {
    // Full recompute: "uniform" reruns every layer, "block" the first num_layers of each chunk.
    const bool full = rc.full() && (rc.method == nn::RecomputeMethod::Uniform || i < rc.num_layers);
    const auto key = std::make_tuple(c.model.is_moe_layer(first + i), layer_dtype(c, s, first + i), full);
    auto it = kinds.find(key);
    if (it == kinds.end()) {
      Ledger one(c, s);
      layer_with_recompute(one, sh, first + i, full);
      it = kinds.emplace(key, one.cost).first;
    }
    for (Phase p : {F, B, W}) L.at(p) += Ledger::phase(it->second, p);
  }
  if (size_t(model_chunk) + 1 == layout.num_chunks()) {
    output_head(L, sh);
    mtp_depths(L, sh);
  }
  return L.cost;
}

}  // namespace megaton::plan
