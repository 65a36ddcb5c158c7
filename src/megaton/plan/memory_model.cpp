#include "megaton/plan/memory_model.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "megaton/core/error.h"
#include "megaton/kernels/attention.h"
#include "megaton/kernels/cpu/gemm.h"
#include "megaton/kernels/fp8_gemm.h"
#include "megaton/nn/attention.h"
#include "megaton/nn/param_and_grad_buffer.h"
#include "megaton/train/pipeline_layout.h"

namespace megaton::plan {

double MemoryBreakdown::total() const { return params + grads + optimizer + activations + workspace + other; }

double& MemoryBreakdown::at(MemCategory c) {
  switch (c) {
    case MemCategory::Params:
      return params;
    case MemCategory::Grads:
      return grads;
    case MemCategory::Optimizer:
      return optimizer;
    case MemCategory::Activations:
      return activations;
    case MemCategory::Workspace:
      return workspace;
    case MemCategory::Other:
      return other;
  }
  fail("unknown memory category ", static_cast<int>(c));
}

double MemoryBreakdown::at(MemCategory c) const { return const_cast<MemoryBreakdown*>(this)->at(c); }

MemoryBreakdown& MemoryBreakdown::operator+=(const MemoryBreakdown& o) {
  for (size_t i = 0; i < kNumMemCategories; ++i) at(MemCategory(i)) += o.at(MemCategory(i));
  return *this;
}

MemoryBreakdown operator+(MemoryBreakdown a, const MemoryBreakdown& b) { return a += b; }

MemoryBreakdown operator-(MemoryBreakdown a, const MemoryBreakdown& b) { return a += -1.0 * b; }

MemoryBreakdown operator*(double k, MemoryBreakdown m) {
  for (size_t i = 0; i < kNumMemCategories; ++i) m.at(MemCategory(i)) *= k;
  return m;
}

MemoryBreakdown max(const MemoryBreakdown& a, const MemoryBreakdown& b) {
  MemoryBreakdown m;
  for (size_t i = 0; i < kNumMemCategories; ++i)
    m.at(MemCategory(i)) = std::max(a.at(MemCategory(i)), b.at(MemCategory(i)));
  return m;
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
bool is_16bit(DType t) { return t == DType::BF16 || t == DType::F16; }

// ---------------------------------------------------------------------------------------------
// The replay's bookkeeping: bytes live and peak per category, as core/allocator.h counts them.
class Ledger {
 public:
  void add(MemCategory c, double bytes) {
    live_.at(c) += bytes;
    peak_.at(c) = std::max(peak_.at(c), live_.at(c));
  }
  void remove(MemCategory c, double bytes) { live_.at(c) -= bytes; }
  const MemoryBreakdown& live() const { return live_; }
  const MemoryBreakdown& peak() const { return peak_; }
  void restart_peaks() { peak_ = live_; }

 private:
  MemoryBreakdown live_, peak_;
};

// A modelled tensor [rows, cols]: its bytes count while any handle to its storage lives, as a
// Tensor's storage does, so the replay frees a buffer exactly where the engine drops its last
// reference to it (a context field cleared, a local going out of scope).
class Buf {
 public:
  Buf() = default;
  Buf(Ledger& ledger, MemCategory cat, int64_t rows, int64_t cols, DType dtype)
      : storage_(std::make_shared<Storage>(ledger, cat,
                                           static_cast<double>(rows * cols) * static_cast<double>(dtype_size(dtype)))),
        rows_(rows),
        cols_(cols),
        dtype_(dtype) {}
  bool defined() const { return storage_ != nullptr; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  DType dtype() const { return dtype_; }
  bool shares(const Buf& o) const { return storage_ && storage_ == o.storage_; }

 private:
  struct Storage {
    Storage(Ledger& l, MemCategory c, double b) : ledger(l), cat(c), bytes(b) { ledger.add(cat, bytes); }
    ~Storage() { ledger.remove(cat, bytes); }
    Storage(const Storage&) = delete;
    Storage& operator=(const Storage&) = delete;
    Ledger& ledger;
    MemCategory cat;
    double bytes;
  };
  std::shared_ptr<Storage> storage_;
  int64_t rows_ = 0, cols_ = 0;
  DType dtype_ = DType::F32;
};

// One micro-batch's replay: its sizes, the ledger its tensors count in, and the allocating helpers
// the modules share (nn/linear.h's new_activation and as_dtype, the tensor-parallel mappings, the
// host GEMM's operand copies).
struct Pass {
  Ledger& ledger;
  int64_t B, T;
  DType dtype;            // the compute dtype
  bool half_gemm_copies;  // 16-bit GEMMs run on OpenBLAS over f32 copies (kernels/cpu/gemm.cpp)
  DType fp8_panel;        // the dtype fp8_gemm widens its operands' codes into
  DType attention;        // the dtype self-attention runs in (kernels::attention_dtype of `dtype`)

  Buf act(int64_t rows, int64_t cols, DType dt) const { return {ledger, MemCategory::Activations, rows, cols, dt}; }
  Buf workspace(int64_t rows, int64_t cols, DType dt) const { return {ledger, MemCategory::Workspace, rows, cols, dt}; }
  Buf as_dtype(const Buf& t, DType dt) const { return t.dtype() == dt ? t : act(t.rows(), t.cols(), dt); }
  // parallel/tensor_parallel_mappings.h over a group of `ranks`.
  Buf gather_rows(const Buf& t, int ranks) const { return act(t.rows() * ranks, t.cols(), t.dtype()); }
  Buf split_rows(const Buf& t, int ranks) const { return act(t.rows() / ranks, t.cols(), t.dtype()); }
  // C[M, N] = A[M, K] B[K, N] with `in` operands: on the fallback path both operands are copied to
  // f32, and a 16-bit result is computed in an f32 buffer. The copies live only while the GEMM runs
  // (here: until this returns), so what they add is a momentary peak.
  void gemm(int64_t M, int64_t N, int64_t K, DType in, DType out) const {
    if (!is_16bit(in) || !half_gemm_copies) return;
    const Buf a = workspace(M, K, DType::F32), b = workspace(K, N, DType::F32);
    const Buf c = out == DType::F32 ? Buf() : workspace(M, N, DType::F32);
  }
};

// ---------------------------------------------------------------------------------------------
// One parameter as TransformerModel registers it: its elements, whether it is a routed expert's
// (its own gradient buckets), whether a GEMM reads it (a compute copy under bf16 / fp16).
struct ParamSpec {
  int64_t numel = 0;
  bool expert = false;
  bool gemm = false;
};
using ParamSpecs = std::vector<ParamSpec>;

// A quantised FP8 matrix (kernels/fp8_quantize.h): one-byte codes and a scale per tile.
struct Fp8Buf {
  Buf data, scale;
};

int64_t tile_cols(kernels::Fp8Granularity g, int64_t cols) { return kernels::fp8_tile_shape(g, 1, cols).cols; }

Fp8Buf fp8_quantize(const Pass& p, int64_t rows, int64_t cols, kernels::Fp8Granularity g, MemCategory cat) {
  const kernels::Fp8TileShape tile = kernels::fp8_tile_shape(g, rows, cols);
  const DType scale = g == kernels::Fp8Granularity::Mx1x32 ? DType::U8 : DType::F32;
  Buf data(p.ledger, cat, rows, cols, DType::F8E4M3);
  return {data, Buf(p.ledger, cat, ceil_div(rows, tile.rows), ceil_div(cols, tile.cols), scale)};
}

// The bytes of a weight's two cached FP8 layouts (fp8/linear_quantizer.h): [out, in] for the
// forward and [in, out] for dgrad, each with its scales; kept from one optimizer step to the next.
double fp8_weight_cache_bytes(int64_t out, int64_t in, kernels::Fp8Granularity g) {
  const auto bytes = [g](int64_t rows, int64_t cols) {
    const kernels::Fp8TileShape t = kernels::fp8_tile_shape(g, rows, cols);
    const double scale = g == kernels::Fp8Granularity::Mx1x32 ? 1.0 : 4.0;
    return static_cast<double>(rows * cols) +
           scale * static_cast<double>(ceil_div(rows, t.rows) * ceil_div(cols, t.cols));
  };
  return bytes(out, in) + bytes(in, out);
}

// The FP8 linears of some layers: their weight caches' bytes and how many there are.
struct Fp8Weights {
  double cache_bytes = 0;
  int64_t linears = 0;
  Fp8Weights& operator+=(const Fp8Weights& o) {
    cache_bytes += o.cache_bytes;
    linears += o.linears;
    return *this;
  }
};

// kernels/fp8_gemm.cpp's workspace for out[M, N] = a[M, K] b[N, K]^T, alive while it runs: an f32
// accumulator unless `out` is f32, the per-group partial product and the two widened panels, for
// all M rows at once or, under an epilogue on oneDNN (bf16 panels), a stripe of them (with b
// widened over all of K).
void fp8_gemm(const Pass& p, int64_t M, int64_t N, int64_t K, kernels::Fp8Granularity ga, kernels::Fp8Granularity gb,
              DType out, bool epilogue = false) {
  const bool mx = ga == kernels::Fp8Granularity::Mx1x32;
  const int64_t group = mx ? K : std::max<int64_t>(1, std::min({tile_cols(ga, K), tile_cols(gb, K), K}));
  const int64_t stripe = epilogue && p.fp8_panel == DType::BF16 ? std::min(M, kernels::kFp8GemmStripeRows) : M;
  const Buf acc = out == DType::F32 ? Buf() : p.workspace(stripe, N, DType::F32);
  const Buf partial = p.workspace(stripe, N, DType::F32);
  const Buf pa = p.workspace(stripe, group, p.fp8_panel);
  const Buf pb = p.workspace(N, std::max<int64_t>(stripe < M ? K : group, 1), p.fp8_panel);
}

// A linear's FP8 input in both layouts (fp8::LinearQuantizer::Input).
struct Fp8Input {
  Fp8Buf fprop, wgrad;
};

// The tensor-parallel group a module is built with (nn/tensor_parallel.h).
struct Tp {
  int size = 1;
  bool sequence_parallel = false;
  bool active() const { return size > 1; }
  bool splits_sequence() const { return active() && sequence_parallel; }
};

// ---------------------------------------------------------------------------------------------
// Shadow modules: each replays the allocations of its nn/ or models/ namesake, in the same order and
// with the same lifetimes, over Bufs instead of tensors; a local Buf stands for the engine's local
// tensor, so one that looks unused is what holds its bytes until the same scope exit. Sizes are this
// rank's (split over its tensor-parallel group, experts over the expert-parallel group). The modules
// also list their parameters in registration order, for the gradient buffer's layout.
namespace shadow {

enum class Parallel { Column, Row };

struct LinearCtx {
  Buf x, dy;
  std::optional<Fp8Buf> x_fp8;  // FP8: x^T, 8-bit, instead of x
};

// nn::FusedInput: an input written when asked for, or produced for an FP8 linear's quantiser (then
// only what its values depend on is allocated: a norm's statistics).
struct FusedBuf {
  int64_t rows;
  DType dtype;
  std::function<Buf()> write;
  std::function<void()> produce;
  Buf out;
  const Buf& written() {
    if (!out.defined()) out = write();
    return out;
  }
  static FusedBuf of(const Buf& x) {
    return {x.rows(), x.dtype(), [x] { return x; }, [] {}, {}};
  }
};

// nn::Linear (column- or row-parallel over `tp`; a linear built without a group has tp size 1).
class Linear {
 public:
  // in / out: this rank's features.
  Linear(int64_t in, int64_t out, bool bias, Parallel parallel, Tp tp = {})
      : in_(in), out_(out), bias_(bias), column_(parallel == Parallel::Column), tp_(tp) {}

  // nn::OutputEpilogue's begin (given the output's rows): what it allocates before the GEMM runs.
  using Epilogue = std::function<void(int64_t rows)>;

  Buf forward(const Pass& p, LinearCtx& ctx, const Buf& x, const Epilogue& epilogue = {}) const {
    const Buf xin = column_ && tp_.splits_sequence() ? p.gather_rows(x, tp_.size) : x;
    const int64_t N = xin.rows();
    if (fp8_) return reduce_output(p, fp8_forward(p, ctx, N, x.dtype(), epilogue));
    Buf y = p.act(N, out_, x.dtype());
    p.gemm(N, out_, in_, x.dtype(), y.dtype());
    ctx.x = xin;
    return reduce_output(p, y);
  }
  // nn::Linear::forward of a FusedInput: produced straight into FP8 unless rows are gathered first.
  Buf forward(const Pass& p, LinearCtx& ctx, FusedBuf& x, const Epilogue& epilogue = {}) const {
    if (!fp8_ || (column_ && tp_.splits_sequence())) return forward(p, ctx, x.written(), epilogue);
    x.produce();
    return reduce_output(p, fp8_forward(p, ctx, x.rows, x.dtype, epilogue));
  }
  // nn::Linear::forward of an input its quantiser made already.
  Buf forward(const Pass& p, LinearCtx& ctx, Fp8Input x, DType dtype) const {
    const int64_t N = x.fprop.data.rows();
    const Buf y = p.act(N, out_, dtype);
    fp8_gemm_forward(p, ctx, N, y.dtype(), std::move(x), false);
    return reduce_output(p, y);
  }
  // This linear's FP8 input of N rows, both layouts (the quantiser's allocations, in its order).
  Fp8Input quantize_input(const Pass& p, int64_t N) const {
    Fp8Buf fprop = fp8_quantize(p, N, in_, act_granularity(), MemCategory::Activations);
    Fp8Buf wgrad = transposed_input(p, fprop, N);
    return {std::move(fprop), std::move(wgrad)};
  }
  bool fp8() const { return fp8_.has_value(); }

  Buf backward_input(const Pass& p, LinearCtx& ctx, const Buf& dy) const {
    const Buf dyin = !column_ && tp_.splits_sequence() ? p.gather_rows(dy, tp_.size) : dy;
    const int64_t N = dyin.rows();
    Buf dx = p.act(N, in_, dy.dtype());
    if (fp8_) {
      const Fp8Buf g = fp8_quantize(p, N, out_, act_granularity(), MemCategory::Activations);
      fp8_gemm(p, N, in_, out_, act_granularity(), fp8_->weight_granularity(), dx.dtype());
    } else {
      p.gemm(N, in_, out_, dy.dtype(), dx.dtype());
    }
    ctx.dy = dyin;
    if (!column_ || !tp_.active()) return dx;
    return tp_.sequence_parallel ? p.split_rows(dx, tp_.size) : dx;
  }

  void backward_weight(const Pass& p, LinearCtx& ctx) const {
    const int64_t N = ctx.dy.rows();
    if (ctx.x_fp8) {
      const Fp8Buf g = fp8_quantize(p, out_, N, act_granularity(), MemCategory::Activations);
      fp8_gemm(p, out_, in_, N, act_granularity(), act_granularity(), DType::F32);
    } else {
      p.gemm(out_, in_, N, ctx.dy.dtype(), DType::F32);  // into the fp32 main gradient
    }
    ctx = {};
  }

  // gemm: whether the weight gets a compute copy (every linear's but the MoE router's).
  void parameters(ParamSpecs& out, bool gemm = true) const {
    out.push_back({.numel = in_ * out_, .gemm = gemm});
    if (bias_) out.push_back({.numel = out_});
  }
  void enable_fp8(const fp8::Fp8Config& config) { fp8_ = config; }
  int64_t in() const { return in_; }
  int64_t out() const { return out_; }

 private:
  kernels::Fp8Granularity act_granularity() const { return fp8_->activation_granularity(); }
  Buf fp8_forward(const Pass& p, LinearCtx& ctx, int64_t N, DType dtype, const Epilogue& epilogue) const {
    Buf y = p.act(N, out_, dtype);
    Fp8Input in = quantize_input(p, N);
    if (epilogue) epilogue(N);
    fp8_gemm_forward(p, ctx, N, y.dtype(), std::move(in), static_cast<bool>(epilogue));
    return y;
  }
  // The GEMM on x's layouts: x^T kept for backward-W, x itself freed as it returns.
  void fp8_gemm_forward(const Pass& p, LinearCtx& ctx, int64_t N, DType out, Fp8Input x, bool epilogue) const {
    ctx.x_fp8 = std::move(x.wgrad);
    fp8_gemm(p, N, out_, in_, act_granularity(), fp8_->weight_granularity(), out, epilogue);
  }
  Buf reduce_output(const Pass& p, const Buf& y) const {
    if (column_ || !tp_.active()) return y;
    return tp_.sequence_parallel ? p.split_rows(y, tp_.size) : y;  // reduce-scatter, or all-reduce in place
  }
  // What backward-W reads of x: the forward's codes transposed (per-tensor scales), or x^T
  // quantised afresh in its own tiles.
  Fp8Buf transposed_input(const Pass& p, const Fp8Buf& fprop, int64_t N) const {
    if (act_granularity() != kernels::Fp8Granularity::Tensor)
      return fp8_quantize(p, in_, N, act_granularity(), MemCategory::Activations);
    Buf data(p.ledger, MemCategory::Activations, in_, N, DType::F8E4M3);
    return {data, Buf(p.ledger, MemCategory::Activations, fprop.scale.cols(), fprop.scale.rows(), DType::F32)};
  }

  int64_t in_, out_;
  bool bias_, column_;
  Tp tp_;
  std::optional<fp8::Fp8Config> fp8_;
};

struct NormCtx {
  Buf x, mean, rstd, dy;
};

// nn::Norm: LayerNorm (weight and bias) or RMSNorm; statistics in f32.
class Norm {
 public:
  Norm(int64_t hidden, bool rms) : hidden_(hidden), rms_(rms) {}
  // Also its forward_add (the residual add fused in): the same tensors.
  Buf forward(const Pass& p, NormCtx& ctx, const Buf& x) const {
    Buf y = p.act(x.rows(), hidden_, x.dtype());
    ctx.x = x;
    ctx.rstd = p.act(x.rows(), 1, DType::F32);
    if (!rms_) ctx.mean = p.act(x.rows(), 1, DType::F32);
    return y;
  }
  // nn::Norm::fused_input: produced, only the statistics are allocated.
  FusedBuf fused(const Pass& p, NormCtx& ctx, const Buf& x) const {
    return {x.rows(), x.dtype(), [this, &p, &ctx, x] { return forward(p, ctx, x); },
            [this, &p, &ctx, x] {
              ctx.x = x;
              ctx.rstd = p.act(x.rows(), 1, DType::F32);
              if (!rms_) ctx.mean = p.act(x.rows(), 1, DType::F32);
            },
            {}};
  }
  Buf backward_input(const Pass& p, NormCtx& ctx, const Buf& dy) const {
    Buf dx = p.act(dy.rows(), hidden_, dy.dtype());
    ctx.dy = dy;
    return dx;
  }
  static void backward_weight(NormCtx& ctx) { ctx = {}; }
  void parameters(ParamSpecs& out) const {
    out.push_back({.numel = hidden_});
    if (!rms_) out.push_back({.numel = hidden_});
  }

 private:
  int64_t hidden_;
  bool rms_;
};

struct SublayerCtx {
  virtual ~SublayerCtx() = default;
};

// nn::Sublayer: an attention or MLP kind.
class Sublayer {
 public:
  virtual ~Sublayer() = default;
  virtual std::unique_ptr<SublayerCtx> new_ctx() const = 0;
  virtual Buf forward(const Pass& p, SublayerCtx& ctx, const Buf& x) const = 0;
  virtual Buf forward_fused(const Pass& p, SublayerCtx& ctx, FusedBuf& x) const { return forward(p, ctx, x.written()); }
  virtual Buf backward_input(const Pass& p, SublayerCtx& ctx, const Buf& dy) const = 0;
  virtual void backward_weight(const Pass& p, SublayerCtx& ctx) const = 0;
  // Where the context keeps the input its first GEMM read (selective "layernorm" recompute).
  virtual Buf* kept_input(SublayerCtx&) const { return nullptr; }
  virtual void parameters(ParamSpecs& out) const = 0;
  // The linears that run in FP8 when their layer does.
  virtual std::vector<Linear*> linears() = 0;
};

// This rank's share of `global` features split evenly over `tp` in blocks (SwiGLU's [gate | up]:
// two); nn::even_pieces' error when a block does not divide.
int64_t local_features(const std::vector<int64_t>& blocks, const Tp& tp, const std::string& what) {
  return nn::local_extent(nn::even_pieces(blocks, tp.size, what).front());
}

// nn::project_attention_output: the output projection, then (selective core_attn recompute) the
// core's output, statistics and the projection's kept input dropped.
Buf project_output(const Pass& p, const Linear& proj, LinearCtx& proj_ctx, Buf& out, Buf& lse, bool recompute_core) {
  Buf y = proj.forward(p, proj_ctx, out);
  if (recompute_core) {
    out = {};
    lse = {};
    proj_ctx.x = {};
  }
  return y;
}

struct AttentionCtx : SublayerCtx {
  LinearCtx qkv_ctx;
  Buf qkv, out, lse;
  LinearCtx proj_ctx;
};

// nn::SelfAttention: RoPE and the core in the attention's dtype (Pass::attention); a 16-bit qkv and
// output attending in f32 are converted around them.
class SelfAttention final : public Sublayer {
 public:
  SelfAttention(const nn::AttentionShape& global, bool bias, Tp tp, bool recompute_core)
      : shape_(nn::local_attention_shape(global, tp.size)),
        qkv_(global.hidden, shape_.qkv_size(), bias, Parallel::Column, tp),
        proj_(shape_.q_size(), global.hidden, bias, Parallel::Row, tp),
        recompute_core_(recompute_core) {}
  std::unique_ptr<SublayerCtx> new_ctx() const override { return std::make_unique<AttentionCtx>(); }

  Buf forward(const Pass& p, SublayerCtx& c, const Buf& x) const override {
    FusedBuf in = FusedBuf::of(x);
    return forward_fused(p, c, in);
  }
  Buf forward_fused(const Pass& p, SublayerCtx& c, FusedBuf& x) const override {
    auto& ctx = static_cast<AttentionCtx&>(c);
    const Buf qkv_x = qkv_.forward(p, ctx.qkv_ctx, x);
    const Buf qa = p.as_dtype(qkv_x, p.attention);  // rotated in place
    ctx.out = p.as_dtype(core_forward(p, ctx), x.dtype);
    ctx.qkv = qa.dtype() == qkv_x.dtype() ? qa : qkv_x;
    return project_output(p, proj_, ctx.proj_ctx, ctx.out, ctx.lse, recompute_core_);
  }

  Buf backward_input(const Pass& p, SublayerCtx& c, const Buf& dy) const override {
    auto& ctx = static_cast<AttentionCtx&>(c);
    const Buf qa = p.as_dtype(ctx.qkv, p.attention);  // a qkv of another dtype converted and rotated again
    const Buf dout = p.as_dtype(proj_.backward_input(p, ctx.proj_ctx, dy), p.attention);
    const Buf dqkv = p.act(p.B * p.T, shape_.qkv_size(), p.attention);
    if (!ctx.out.defined()) {  // core_attn recompute
      ctx.out = p.as_dtype(core_forward(p, ctx), dy.dtype());
      if (!ctx.proj_ctx.x_fp8) ctx.proj_ctx.x = ctx.out;
    }
    const Buf out_a = p.as_dtype(ctx.out, p.attention);
    ctx.qkv = {};
    ctx.out = {};
    ctx.lse = {};
    return qkv_.backward_input(p, ctx.qkv_ctx, p.as_dtype(dqkv, dy.dtype()));
  }

  void backward_weight(const Pass& p, SublayerCtx& c) const override {
    auto& ctx = static_cast<AttentionCtx&>(c);
    proj_.backward_weight(p, ctx.proj_ctx);
    qkv_.backward_weight(p, ctx.qkv_ctx);
  }
  Buf* kept_input(SublayerCtx& c) const override { return &static_cast<AttentionCtx&>(c).qkv_ctx.x; }
  void parameters(ParamSpecs& out) const override {
    qkv_.parameters(out);
    proj_.parameters(out);
  }
  std::vector<Linear*> linears() override { return {&qkv_, &proj_}; }

 private:
  // The f32 attention output of every row and the softmax statistics (into ctx.lse).
  Buf core_forward(const Pass& p, AttentionCtx& ctx) const {
    Buf out = p.act(p.B * p.T, shape_.q_size(), p.attention);
    ctx.lse = p.act(p.B * shape_.heads * p.T, 1, DType::F32);
    return out;
  }

  nn::AttentionShape shape_;  // this rank's heads
  Linear qkv_, proj_;
  bool recompute_core_;
};

struct MlaCtx : SublayerCtx {
  LinearCtx q_down_ctx, q_up_ctx, kv_down_ctx, kv_up_ctx, proj_ctx;
  NormCtx q_norm_ctx, kv_norm_ctx;
  Buf q, kv, out, lse;
};

// nn::MultiLatentAttention: the down-projections and latent norms replicated, the up-projections
// and the output projection split over the heads; q, the expanded keys / values and the core in f32.
class LatentAttention final : public Sublayer {
 public:
  LatentAttention(int64_t hidden, int64_t heads, const nn::MlaConfig& m, bool bias, Tp tp, bool recompute_core)
      : m_(m),
        heads_(local_features({heads}, tp, "num_attention_heads")),
        tp_(tp),
        kv_down_(hidden, m.kv_lora_rank + m.qk_pos_emb_head_dim, bias, Parallel::Column),
        kv_norm_(m.kv_lora_rank, true),
        kv_up_(m.kv_lora_rank, heads_ * (m.qk_head_dim + m.v_head_dim), bias, Parallel::Column, tp),
        proj_(heads_ * m.v_head_dim, hidden, bias, Parallel::Row, tp),
        recompute_core_(recompute_core) {
    if (m.q_lora_rank == 0) {
      q_proj_.emplace(hidden, heads_ * m.qk_dim(), bias, Parallel::Column, tp);
      return;
    }
    q_down_.emplace(hidden, m.q_lora_rank, bias, Parallel::Column);
    q_norm_.emplace(m.q_lora_rank, true);
    q_up_.emplace(m.q_lora_rank, heads_ * m.qk_dim(), bias, Parallel::Column, tp);
  }
  std::unique_ptr<SublayerCtx> new_ctx() const override { return std::make_unique<MlaCtx>(); }

  Buf forward(const Pass& p, SublayerCtx& c, const Buf& x) const override {
    auto& ctx = static_cast<MlaCtx&>(c);
    const int64_t N = x.rows(), R = m_.kv_lora_rank, r = m_.qk_pos_emb_head_dim;
    ctx.q = p.as_dtype(query(p, ctx, x), DType::F32);
    const Buf kv_latent = kv_down_.forward(p, ctx.kv_down_ctx, x);
    const Buf latent = p.act(N, R, x.dtype());
    const Buf kv_up_out = kv_up_.forward(p, ctx.kv_up_ctx, kv_norm_.forward(p, ctx.kv_norm_ctx, latent));
    if (tp_.splits_sequence()) {  // every token's rope key, gathered alone
      const Buf rope = p.act(N, r, x.dtype());
      ctx.kv = expand_keys(p, kv_up_out, p.gather_rows(rope, tp_.size));
    } else {
      ctx.kv = expand_keys(p, kv_up_out, kv_latent);
    }
    ctx.out = p.as_dtype(core_forward(p, ctx), x.dtype());
    return project_output(p, proj_, ctx.proj_ctx, ctx.out, ctx.lse, recompute_core_);
  }

  Buf backward_input(const Pass& p, SublayerCtx& c, const Buf& dy) const override {
    auto& ctx = static_cast<MlaCtx&>(c);
    const int64_t Nf = p.B * p.T, N = dy.rows(), nope = m_.qk_head_dim, v = m_.v_head_dim;
    const Buf dout = p.as_dtype(proj_.backward_input(p, ctx.proj_ctx, dy), DType::F32);
    if (!ctx.out.defined()) {  // core_attn recompute
      ctx.out = p.as_dtype(core_forward(p, ctx), dy.dtype());
      if (!ctx.proj_ctx.x_fp8) ctx.proj_ctx.x = ctx.out;
    }
    const Buf dq = p.act(Nf, heads_ * m_.qk_dim(), DType::F32);
    const Buf dkv = p.act(Nf, heads_ * (m_.qk_dim() + v), DType::F32);
    { const Buf out32 = p.as_dtype(ctx.out, DType::F32); }  // the attention backward's f32 view of out
    ctx.q = ctx.kv = ctx.out = ctx.lse = {};
    const Buf dup = p.act(Nf, heads_ * (nope + v), DType::F32);
    const Buf dlatent_n = kv_up_.backward_input(p, ctx.kv_up_ctx, p.as_dtype(dup, dy.dtype()));
    const Buf dlatent = p.as_dtype(kv_norm_.backward_input(p, ctx.kv_norm_ctx, dlatent_n), DType::F32);
    Buf drope = p.act(Nf, m_.qk_pos_emb_head_dim, DType::F32);
    if (tp_.splits_sequence()) drope = p.split_rows(drope, tp_.size);
    const Buf dkv_latent = p.act(N, m_.kv_lora_rank + m_.qk_pos_emb_head_dim, DType::F32);
    Buf dx = kv_down_.backward_input(p, ctx.kv_down_ctx, p.as_dtype(dkv_latent, dy.dtype()));
    const Buf dx_q = query_backward(p, ctx, p.as_dtype(dq, dy.dtype()));
    return dx;
  }

  void backward_weight(const Pass& p, SublayerCtx& c) const override {
    auto& ctx = static_cast<MlaCtx&>(c);
    proj_.backward_weight(p, ctx.proj_ctx);
    kv_up_.backward_weight(p, ctx.kv_up_ctx);
    Norm::backward_weight(ctx.kv_norm_ctx);
    kv_down_.backward_weight(p, ctx.kv_down_ctx);
    if (q_proj_) return q_proj_->backward_weight(p, ctx.q_up_ctx);
    q_up_->backward_weight(p, ctx.q_up_ctx);
    Norm::backward_weight(ctx.q_norm_ctx);
    q_down_->backward_weight(p, ctx.q_down_ctx);
  }

  void parameters(ParamSpecs& out) const override {
    if (q_proj_) {
      q_proj_->parameters(out);
    } else {
      q_down_->parameters(out);
      q_norm_->parameters(out);
      q_up_->parameters(out);
    }
    kv_down_.parameters(out);
    kv_norm_.parameters(out);
    kv_up_.parameters(out);
    proj_.parameters(out);
  }
  std::vector<Linear*> linears() override {
    std::vector<Linear*> out = q_proj_ ? std::vector<Linear*>{&*q_proj_} : std::vector<Linear*>{&*q_down_, &*q_up_};
    for (Linear* l : {&kv_down_, &kv_up_, &proj_}) out.push_back(l);
    return out;
  }

 private:
  Buf query(const Pass& p, MlaCtx& ctx, const Buf& x) const {
    if (q_proj_) return q_proj_->forward(p, ctx.q_up_ctx, x);
    return q_up_->forward(p, ctx.q_up_ctx, q_norm_->forward(p, ctx.q_norm_ctx, q_down_->forward(p, ctx.q_down_ctx, x)));
  }
  Buf query_backward(const Pass& p, MlaCtx& ctx, const Buf& dq) const {
    if (q_proj_) return q_proj_->backward_input(p, ctx.q_up_ctx, dq);
    const Buf dlatent = q_norm_->backward_input(p, ctx.q_norm_ctx, q_up_->backward_input(p, ctx.q_up_ctx, dq));
    return q_down_->backward_input(p, ctx.q_down_ctx, dlatent);
  }
  // The f32 keys and values of every head, from the up-projection's output and the rope keys (both
  // read through f32 copies when 16-bit).
  Buf expand_keys(const Pass& p, const Buf& kv_up_out, const Buf& rope_keys) const {
    Buf kv = p.act(kv_up_out.rows(), heads_ * (m_.qk_dim() + m_.v_head_dim), DType::F32);
    const Buf up = p.as_dtype(kv_up_out, DType::F32), rope = p.as_dtype(rope_keys, DType::F32);
    return kv;
  }
  Buf core_forward(const Pass& p, MlaCtx& ctx) const {
    Buf out = p.act(p.B * p.T, heads_ * m_.v_head_dim, DType::F32);
    ctx.lse = p.act(p.B * heads_ * p.T, 1, DType::F32);
    return out;
  }

  nn::MlaConfig m_;
  int64_t heads_;  // this rank's
  Tp tp_;
  std::optional<Linear> q_down_, q_up_, q_proj_;
  std::optional<Norm> q_norm_;
  Linear kv_down_;
  Norm kv_norm_;
  Linear kv_up_, proj_;
  bool recompute_core_;
};

struct MlpCtx : SublayerCtx {
  LinearCtx fc1_ctx;
  Buf h;
  LinearCtx fc2_ctx;
};

// nn::Mlp: fc1 -> GeLU / SwiGLU -> fc2 (the fused bias adds change no allocation; under FP8 with
// the activation-cast fusion the activation's output is never allocated, and fc2's 8-bit input is
// allocated as fc1's GEMM starts, its epilogue filling it).
class Mlp final : public Sublayer {
 public:
  Mlp(int64_t hidden, int64_t ffn, bool swiglu, bool bias, Tp tp, bool fuse_act_cast)
      : ffn_(local_features({ffn}, tp, "ffn_hidden_size")),
        fc1_(hidden, (swiglu ? 2 : 1) * ffn_, bias, Parallel::Column, tp),
        fc2_(ffn_, hidden, bias, Parallel::Row, tp),
        fuse_act_cast_(fuse_act_cast) {}
  std::unique_ptr<SublayerCtx> new_ctx() const override { return std::make_unique<MlpCtx>(); }

  Buf forward(const Pass& p, SublayerCtx& c, const Buf& x) const override {
    FusedBuf in = FusedBuf::of(x);
    return forward_fused(p, c, in);
  }
  Buf forward_fused(const Pass& p, SublayerCtx& c, FusedBuf& x) const override {
    auto& ctx = static_cast<MlpCtx&>(c);
    if (fuse_act_cast_ && fc1_.fp8() && fc2_.fp8()) {  // fc2's input made in fc1's epilogue
      std::optional<Fp8Input> act;
      ctx.h = fc1_.forward(p, ctx.fc1_ctx, x, [&](int64_t rows) { act = fc2_.quantize_input(p, rows); });
      return fc2_.forward(p, ctx.fc2_ctx, std::move(*act), ctx.h.dtype());
    }
    ctx.h = fc1_.forward(p, ctx.fc1_ctx, x);
    const Buf a = p.act(ctx.h.rows(), ffn_, ctx.h.dtype());
    return fc2_.forward(p, ctx.fc2_ctx, a);
  }
  Buf backward_input(const Pass& p, SublayerCtx& c, const Buf& dy) const override {
    auto& ctx = static_cast<MlpCtx&>(c);
    const Buf da = fc2_.backward_input(p, ctx.fc2_ctx, dy);
    const Buf dh = p.act(ctx.h.rows(), ctx.h.cols(), da.dtype());
    ctx.h = {};
    return fc1_.backward_input(p, ctx.fc1_ctx, dh);
  }
  void backward_weight(const Pass& p, SublayerCtx& c) const override {
    auto& ctx = static_cast<MlpCtx&>(c);
    fc2_.backward_weight(p, ctx.fc2_ctx);
    fc1_.backward_weight(p, ctx.fc1_ctx);
  }
  Buf* kept_input(SublayerCtx& c) const override { return &static_cast<MlpCtx&>(c).fc1_ctx.x; }
  void parameters(ParamSpecs& out) const override {
    fc1_.parameters(out);
    fc2_.parameters(out);
  }
  std::vector<Linear*> linears() override { return {&fc1_, &fc2_}; }

 private:
  int64_t ffn_;  // this rank's
  Linear fc1_, fc2_;
  bool fuse_act_cast_;
};

// A micro-batch's routing on its own rank (nn::MoeRouting): [tokens, K] indices, probs, slot
// positions, and how many of the slots are kept (and so travel to the experts).
struct Routing {
  Buf indices, probs, pos;
  int64_t kept = 0;
};

// nn::TokenDispatcher: the slots' way to the experts' rows and back. Under expert parallelism the
// rows this rank's experts receive are assumed balanced: as many as it sends.
class Dispatcher {
 public:
  virtual ~Dispatcher() = default;
  virtual Buf dispatch(const Pass& p, const Buf& x, const Routing& r, const std::function<void()>& overlap) = 0;
  virtual Buf combine(const Pass& p, const Buf& expert_out) = 0;
  virtual Buf combine_backward(const Pass& p, const Buf& dy, Buf& dprobs, const std::function<void()>& overlap) = 0;
  virtual Buf dispatch_backward(const Pass& p, const Buf& dexpert_in) = 0;
};

// The "alltoall" dispatcher (also every dispatcher at ep 1, where nothing travels).
class AllToAll final : public Dispatcher {
 public:
  AllToAll(int ep, int64_t local_experts) : ep_(ep), local_(local_experts) {}
  Buf dispatch(const Pass& p, const Buf& x, const Routing& r, const std::function<void()>& overlap) override {
    pos_ = r.pos;
    probs_ = r.probs;
    Buf xp = p.act(r.kept, x.cols(), x.dtype());
    if (ep_ == 1) {
      overlap();
      return xp;
    }
    { const Buf send = p.workspace(local_ * ep_, 1, DType::I64), recv = p.workspace(local_ * ep_, 1, DType::I64); }
    rows_ = r.kept;
    const Buf received = p.act(rows_, x.cols(), x.dtype());
    overlap();
    xp = {};
    sort_pos_ = p.act(rows_, 1, DType::I32);
    return p.act(rows_, x.cols(), x.dtype());
  }
  Buf combine(const Pass& p, const Buf& expert_out) override {
    out_ = travel_back(p, expert_out);
    return p.act(pos_.rows(), expert_out.cols(), expert_out.dtype());
  }
  Buf combine_backward(const Pass& p, const Buf& dy, Buf& dprobs, const std::function<void()>& overlap) override {
    Buf dout = p.act(out_.rows(), out_.cols(), dy.dtype());
    dprobs = p.act(pos_.rows(), pos_.cols(), dy.dtype());
    out_ = {};
    if (ep_ == 1) {
      overlap();
      return dout;
    }
    const Buf received = p.act(rows_, dy.cols(), dy.dtype());
    overlap();
    return p.act(rows_, dy.cols(), dy.dtype());
  }
  Buf dispatch_backward(const Pass& p, const Buf& dexpert_in) override {
    const Buf dxp = travel_back(p, dexpert_in);
    return p.act(pos_.rows(), dexpert_in.cols(), dexpert_in.dtype());
  }

 private:
  // Expert-major rows back to this rank's permuted order: unsorted, then the all-to-all's output.
  Buf travel_back(const Pass& p, const Buf& rows) const {
    if (ep_ == 1) return rows;
    const Buf unsorted = p.act(rows.rows(), rows.cols(), rows.dtype());
    return p.act(rows_, rows.cols(), rows.dtype());
  }
  int ep_;
  int64_t local_;
  int64_t rows_ = 0;  // the rows travelling each way
  Buf pos_, probs_, sort_pos_, out_;
};

// The "allgather" dispatcher under expert parallelism: every rank sees the group's tokens and
// reduce-scatters partial outputs (in f32).
class AllGather final : public Dispatcher {
 public:
  explicit AllGather(int ep) : ep_(ep) {}
  Buf dispatch(const Pass& p, const Buf& x, const Routing& r, const std::function<void()>& overlap) override {
    const Buf kept = p.act(r.indices.rows(), r.indices.cols(), DType::I32);
    const Buf kept_all = p.gather_rows(kept, ep_);
    probs_all_ = p.gather_rows(r.probs, ep_);
    const Buf x_all = p.act(x.rows() * ep_, x.cols(), x.dtype());
    overlap();
    pos_all_ = p.act(kept_all.rows(), kept_all.cols(), DType::I32);
    return p.act(r.kept, x.cols(), x.dtype());
  }
  Buf combine(const Pass& p, const Buf& expert_out) override {
    out_ = expert_out;
    return sum_back(p, p.act(pos_all_.rows(), expert_out.cols(), expert_out.dtype()));
  }
  Buf combine_backward(const Pass& p, const Buf& dy, Buf& dprobs, const std::function<void()>& overlap) override {
    const Buf dy_all = p.act(dy.rows() * ep_, dy.cols(), dy.dtype());
    overlap();
    Buf dout = p.act(out_.rows(), out_.cols(), dy.dtype());
    const Buf dp_all = p.act(pos_all_.rows(), pos_all_.cols(), dy.dtype());
    out_ = {};
    dprobs = sum_back(p, dp_all);
    return dout;
  }
  Buf dispatch_backward(const Pass& p, const Buf& dexpert_in) override {
    return sum_back(p, p.act(pos_all_.rows(), dexpert_in.cols(), dexpert_in.dtype()));
  }

 private:
  // [ep N, C] partial sums -> this rank's [N, C] rows of their sum, reduce-scattered in f32.
  Buf sum_back(const Pass& p, const Buf& partial) const {
    const Buf sum = p.split_rows(p.as_dtype(partial, DType::F32), ep_);
    return p.as_dtype(sum, partial.dtype());
  }
  int ep_;
  Buf probs_all_, pos_all_, out_;
};

struct MoeCtx : SublayerCtx {
  LinearCtx router_ctx;
  Buf logits, indices, probs, dbalance, pos;
  std::unique_ptr<Dispatcher> dispatcher;
  Buf xs, h, a, dh, deo;
  std::unique_ptr<SublayerCtx> shared;
};

// The tensor- / expert-parallel setting of an MoE layer and its recompute of the experts' SwiGLU.
struct MoeSetting {
  Tp tp;
  int ep = 1;
  bool recompute_act = false;
  bool fuse_act_cast = false;  // the shared expert's (FusionConfig::layernorm_mlp)
};

// nn::MoeLayer: the fp32 router on every token, the routed experts as grouped GEMMs over the
// dispatched rows, the shared expert (a tensor-parallel SwiGLU Mlp) overlapped with the dispatch.
class Moe final : public Sublayer {
 public:
  Moe(int64_t hidden, const nn::MoeConfig& m, const MoeSetting& s)
      : m_(m), hidden_(hidden), s_(s), router_(hidden, m.num_moe_experts, false, Parallel::Column) {
    if (m.num_moe_experts % s.ep != 0)
      fail("num_moe_experts ", m.num_moe_experts, " is not divisible by expert_model_parallel_size ", s.ep);
    if (m.moe_shared_expert_intermediate_size > 0)
      shared_.emplace(hidden, m.moe_shared_expert_intermediate_size, true, false, s.tp, s.fuse_act_cast);
  }
  std::unique_ptr<SublayerCtx> new_ctx() const override { return std::make_unique<MoeCtx>(); }

  Buf forward(const Pass& p, SublayerCtx& c, const Buf& x) const override {
    auto& ctx = static_cast<MoeCtx&>(c);
    const bool sp = s_.tp.splits_sequence();
    const int64_t N = x.rows() * (sp ? s_.tp.size : 1), E = m_.num_moe_experts, K = m_.moe_router_topk;
    const Buf x_all = sp ? p.gather_rows(x, s_.tp.size) : x;
    const Buf x_mine = sp ? x : my_rows(p, x);
    ctx.logits = router_.forward(p, ctx.router_ctx, p.as_dtype(x_all, DType::F32));
    ctx.indices = p.act(N, K, DType::I32);
    ctx.probs = p.act(N, K, DType::F32);
    if (m_.moe_router_load_balancing_type != "none" && m_.moe_aux_loss_coeff > 0) {
      const Buf scores = p.act(N, E, DType::F32);
      ctx.dbalance = p.act(N, E, DType::F32);
    }
    ctx.pos = p.act(N, K, DType::I32);
    Buf shared_out;
    const std::function<void()> run_shared = [&] {
      if (!shared_) return;
      ctx.shared = shared_->new_ctx();
      shared_out = shared_->forward(p, *ctx.shared, x);
    };
    const bool overlap = m_.moe_shared_expert_overlap;
    if (!overlap) run_shared();
    Routing routing{ctx.indices, ctx.probs, ctx.pos, kept_slots(N)};
    if (s_.tp.active()) {  // this rank's block of the kept slots
      const Buf kept = p.act(N, K, DType::I32);
      routing.indices = my_rows(p, kept);
      routing.probs = my_rows(p, ctx.probs);
      routing.pos = p.act(N / s_.tp.size, K, DType::I32);
      routing.kept /= s_.tp.size;
    }
    ctx.dispatcher = s_.ep > 1 && m_.moe_token_dispatcher_type == "allgather"
                         ? std::unique_ptr<Dispatcher>(std::make_unique<AllGather>(s_.ep))
                         : std::make_unique<AllToAll>(s_.ep, E / s_.ep);
    const Buf xs = ctx.dispatcher->dispatch(
        p, x_mine, routing, overlap ? run_shared : [] {});
    Buf y = ctx.dispatcher->combine(p, experts_forward(p, ctx, xs));
    return sp ? y : all_rows(p, y);
  }

  Buf backward_input(const Pass& p, SublayerCtx& c, const Buf& dy) const override {
    auto& ctx = static_cast<MoeCtx&>(c);
    const bool sp = s_.tp.splits_sequence();
    Buf dx_shared;
    const std::function<void()> run_shared = [&] {
      if (shared_) dx_shared = shared_->backward_input(p, *ctx.shared, dy);
    };
    const bool overlap = m_.moe_shared_expert_overlap;
    if (!overlap) run_shared();
    Buf dprobs;
    const Buf dy_mine = sp ? dy : my_rows(p, dy);
    const Buf deo = ctx.dispatcher->combine_backward(
        p, dy_mine, dprobs, overlap ? run_shared : [] {});
    Buf dx = ctx.dispatcher->dispatch_backward(p, experts_backward_input(p, ctx, deo));
    if (!sp) dx = all_rows(p, dx);
    dprobs = all_rows(p, dprobs);
    const Buf dlogits = p.act(ctx.logits.rows(), m_.num_moe_experts, DType::F32);
    { const Buf dprobs32 = p.as_dtype(dprobs, DType::F32); }  // the route backward's f32 view
    ctx.dbalance = {};
    const Buf dx_router = router_.backward_input(p, ctx.router_ctx, dlogits);
    {  // the router's input gradient added to dx: this rank's rows, in dx's dtype
      const Buf mine = sp ? my_rows(p, dx_router) : dx_router;
      const Buf added = p.as_dtype(mine, dy.dtype());
    }
    ctx.logits = ctx.probs = ctx.indices = ctx.pos = {};
    return dx;
  }

  void backward_weight(const Pass& p, SublayerCtx& c) const override {
    auto& ctx = static_cast<MoeCtx&>(c);
    if (shared_) shared_->backward_weight(p, *ctx.shared);
    const int64_t rows = expert_rows(ctx.xs.rows()), F = m_.moe_ffn_hidden_size;
    p.gemm(hidden_, F, rows, ctx.deo.dtype(), DType::F32);     // fc2, per expert
    p.gemm(2 * F, hidden_, rows, ctx.dh.dtype(), DType::F32);  // fc1, per expert
    router_.backward_weight(p, ctx.router_ctx);
    ctx = MoeCtx{};
  }

  void parameters(ParamSpecs& out) const override {
    const int64_t local = m_.num_moe_experts / s_.ep, F = m_.moe_ffn_hidden_size;
    router_.parameters(out, /*gemm=*/false);  // the router stays fp32
    if (m_.moe_router_enable_expert_bias) out.push_back({.numel = m_.num_moe_experts});
    out.push_back({.numel = local * 2 * F * hidden_, .expert = true, .gemm = true});
    out.push_back({.numel = local * hidden_ * F, .expert = true, .gemm = true});
    if (shared_) shared_->parameters(out);
  }
  // FP8 candidates: the shared expert's linears (the router stays fp32, the grouped GEMMs have no
  // FP8 path).
  std::vector<Linear*> linears() override { return shared_ ? shared_->linears() : std::vector<Linear*>{}; }

 private:
  // The slots capacity keeps of N tokens' (all of them when dropless), the router assumed balanced.
  int64_t kept_slots(int64_t N) const {
    const int64_t slots = N * m_.moe_router_topk, E = m_.num_moe_experts;
    if (m_.moe_expert_capacity_factor <= 0) return slots;
    const auto capacity = static_cast<int64_t>(
        std::ceil(m_.moe_expert_capacity_factor * static_cast<double>(slots) / static_cast<double>(E)));
    return std::min(slots, capacity * E);
  }
  // One local expert's rows (the grouped GEMM runs one expert's block at a time), balanced.
  int64_t expert_rows(int64_t rows) const { return ceil_div(rows, m_.num_moe_experts / s_.ep); }
  Buf my_rows(const Pass& p, const Buf& all) const { return s_.tp.active() ? p.split_rows(all, s_.tp.size) : all; }
  Buf all_rows(const Pass& p, const Buf& mine) const { return s_.tp.active() ? p.gather_rows(mine, s_.tp.size) : mine; }

  Buf experts_forward(const Pass& p, MoeCtx& ctx, const Buf& xs) const {
    const int64_t M = xs.rows(), F = m_.moe_ffn_hidden_size, rows = expert_rows(M);
    const DType dt = xs.dtype();
    ctx.xs = xs;
    ctx.h = p.act(M, 2 * F, dt);
    p.gemm(rows, 2 * F, hidden_, dt, dt);
    ctx.a = p.act(M, F, dt);
    Buf eo = p.act(M, hidden_, dt);
    p.gemm(rows, hidden_, F, dt, dt);
    if (s_.recompute_act) ctx.a = {};
    return eo;
  }

  Buf experts_backward_input(const Pass& p, MoeCtx& ctx, const Buf& deo) const {
    const int64_t M = ctx.h.rows(), F = m_.moe_ffn_hidden_size, rows = expert_rows(M);
    const DType dt = deo.dtype();
    ctx.deo = deo;
    const Buf da = p.act(M, F, dt);
    p.gemm(rows, F, hidden_, dt, dt);
    ctx.dh = p.act(M, 2 * F, dt);
    if (s_.recompute_act) ctx.a = p.act(M, F, dt);
    ctx.h = {};
    Buf dxs = p.act(ctx.xs.rows(), ctx.xs.cols(), dt);
    p.gemm(rows, hidden_, 2 * F, dt, dt);
    return dxs;
  }

  nn::MoeConfig m_;
  int64_t hidden_;
  MoeSetting s_;
  Linear router_;
  std::optional<Mlp> shared_;
};

struct BlockCtx {
  NormCtx norm1, norm2;
  std::unique_ptr<SublayerCtx> attn, mlp;
  Buf mlp_input;
  bool norm1_out_dropped = false, norm2_out_dropped = false;
};

// Selective recompute inside a block (nn::TransformerBlock::set_recompute), and whether its norms
// hand their outputs to the sublayers unwritten (FusionConfig::layernorm_linear).
struct BlockRecompute {
  bool mlp = false, norm = false;
  bool fuse_norm_linear = false;
};

// nn::TransformerBlock: x + attention(norm1(x)), then + mlp(norm2(.)); the residual sums reuse the
// branch outputs' storage.
class Block {
 public:
  Block(Norm norm, std::unique_ptr<Sublayer> attention, std::unique_ptr<Sublayer> mlp, BlockRecompute recompute)
      : input_norm_(norm),
        attention_(std::move(attention)),
        pre_mlp_norm_(norm),
        mlp_(std::move(mlp)),
        recompute_(recompute) {}

  Buf forward(const Pass& p, BlockCtx& ctx, const Buf& x) const {
    ctx.attn = attention_->new_ctx();
    ctx.mlp = mlp_->new_ctx();
    FusedBuf n1 = input_norm_.fused(p, ctx.norm1, x);
    const Buf h = forward_normed(p, *attention_, *ctx.attn, n1);
    if (recompute_.norm) ctx.norm1_out_dropped = drop_norm_output(*attention_, *ctx.attn, n1.out);
    FusedBuf n2 = pre_mlp_norm_.fused(p, ctx.norm2, h);  // of h + x, summed in h's storage
    Buf m = recompute_.mlp ? mlp_->forward(p, *ctx.mlp, n2.written()) : forward_normed(p, *mlp_, *ctx.mlp, n2);
    if (recompute_.mlp) {
      ctx.mlp_input = n2.out;
      ctx.mlp.reset();
    } else if (recompute_.norm) {
      ctx.norm2_out_dropped = drop_norm_output(*mlp_, *ctx.mlp, n2.out);
    }
    return m;  // + h, in m's storage
  }

  Buf backward_input(const Pass& p, BlockCtx& ctx, const Buf& dy) const {
    if (ctx.mlp_input.defined()) {
      ctx.mlp = mlp_->new_ctx();
      { const Buf unused = mlp_->forward(p, *ctx.mlp, ctx.mlp_input); }
      ctx.mlp_input = {};
    }
    if (ctx.norm2_out_dropped) rebuild_norm_output(p, pre_mlp_norm_, ctx.norm2, *mlp_, *ctx.mlp);
    if (ctx.norm1_out_dropped) rebuild_norm_output(p, input_norm_, ctx.norm1, *attention_, *ctx.attn);
    ctx.norm1_out_dropped = ctx.norm2_out_dropped = false;
    const Buf dh = pre_mlp_norm_.backward_input(p, ctx.norm2, mlp_->backward_input(p, *ctx.mlp, dy));
    return input_norm_.backward_input(p, ctx.norm1, attention_->backward_input(p, *ctx.attn, dh));
  }

  void backward_weight(const Pass& p, BlockCtx& ctx) const {
    mlp_->backward_weight(p, *ctx.mlp);
    Norm::backward_weight(ctx.norm2);
    attention_->backward_weight(p, *ctx.attn);
    Norm::backward_weight(ctx.norm1);
    ctx.attn.reset();
    ctx.mlp.reset();
  }

  void parameters(ParamSpecs& out) const {
    input_norm_.parameters(out);
    attention_->parameters(out);
    pre_mlp_norm_.parameters(out);
    mlp_->parameters(out);
  }
  // FP8 GEMMs in this layer's linears (TransformerModel::enable_fp8), each caching its weight's
  // two FP8 layouts.
  void enable_fp8(const fp8::Fp8Config& config) {
    std::vector<Linear*> all = attention_->linears();
    for (Linear* l : mlp_->linears()) all.push_back(l);
    for (Linear* l : all) {
      l->enable_fp8(config);
      fp8_.cache_bytes += fp8_weight_cache_bytes(l->out(), l->in(), config.weight_granularity());
      ++fp8_.linears;
    }
  }
  const Fp8Weights& fp8_weights() const { return fp8_; }

 private:
  Buf forward_normed(const Pass& p, const Sublayer& s, SublayerCtx& ctx, FusedBuf& normed) const {
    return recompute_.fuse_norm_linear ? s.forward_fused(p, ctx, normed) : s.forward(p, ctx, normed.written());
  }
  // Drops the sublayer's kept input when it is the norm's output itself (not a gathered or 8-bit copy).
  static bool drop_norm_output(const Sublayer& s, SublayerCtx& ctx, const Buf& norm_out) {
    Buf* kept = s.kept_input(ctx);
    if (!kept || !kept->shares(norm_out)) return false;
    *kept = {};
    return true;
  }
  static void rebuild_norm_output(const Pass& p, const Norm& norm, const NormCtx& saved, const Sublayer& s,
                                  SublayerCtx& ctx) {
    NormCtx scratch;
    *s.kept_input(ctx) = norm.forward(p, scratch, saved.x);
  }

  Norm input_norm_;
  std::unique_ptr<Sublayer> attention_;
  Norm pre_mlp_norm_;
  std::unique_ptr<Sublayer> mlp_;
  BlockRecompute recompute_;
  Fp8Weights fp8_;
};

// nn::Embedding: the f32 lookup converted to the compute dtype; vocab-parallel over tp (the
// lookup's local ids, and under sequence parallelism this rank's rows kept).
class Embedding {
 public:
  Embedding(int64_t rows, int64_t hidden, int64_t positions, bool learned_positions, Tp tp)
      : rows_(rows), hidden_(hidden), positions_(learned_positions ? positions : 0), tp_(tp) {}

  Buf forward(const Pass& p, const Buf& tokens) const {
    Buf out = p.act(tokens.rows() * tokens.cols(), hidden_, DType::F32);
    if (tp_.active()) {
      { const Buf ids = p.act(tokens.rows(), tokens.cols(), DType::I32); }
      if (tp_.sequence_parallel) out = p.split_rows(out, tp_.size);
    }
    return p.as_dtype(out, p.dtype);
  }

  void backward_weight(const Pass& p, const Buf& tokens, const Buf& dy) const {
    Buf d = p.as_dtype(dy, DType::F32);
    if (!tp_.active()) return;
    if (tp_.sequence_parallel) d = p.gather_rows(d, tp_.size);
    const Buf ids = p.act(tokens.rows(), tokens.cols(), DType::I32);
    const Buf masked = d.shares(dy) ? p.act(d.rows(), d.cols(), DType::F32) : d;  // dy itself is not zeroed
  }

  // gemm: whether the word table is also the output head's weight here (a compute copy).
  void parameters(ParamSpecs& out, bool gemm) const {
    out.push_back({.numel = rows_ * hidden_, .gemm = gemm});
    if (positions_ > 0) out.push_back({.numel = positions_ * hidden_});
  }

 private:
  int64_t rows_, hidden_, positions_;
  Tp tp_;
};

// nn::OutputHead's fused, chunked loss: one chunk of logits (workspace) at a time, so the N x vocab
// logits never exist; the head's weight gradient is added eagerly (the trainer never defers it).
class Head {
 public:
  // own_weight: false when tied to the embedding on this rank (the embedding lists the table).
  Head(int64_t hidden, int64_t vocab_rows, bool own_weight, Tp tp)
      : hidden_(hidden), vocab_(vocab_rows), own_(own_weight), tp_(tp) {}

  // The loss's gradient at x.
  Buf loss_and_grad(const Pass& p, const Buf& x_in) const {
    const Buf x = tp_.splits_sequence() ? p.gather_rows(x_in, tp_.size) : x_in;
    const int64_t N = x.rows(), chunk = std::min<int64_t>(N, kChunkRows);
    const DType dt = x.dtype();
    const Buf logits = p.workspace(chunk, vocab_, dt);
    const Buf dx = p.act(N, hidden_, dt);
    const Buf losses = p.workspace(chunk, 1, DType::F32), lse = p.workspace(chunk, 1, DType::F32);
    const Buf row_max = p.workspace(chunk, 1, DType::F32), sum_exp = p.workspace(chunk, 1, DType::F32);
    const Buf target_logit = p.workspace(chunk, 1, DType::F32);
    p.gemm(chunk, vocab_, hidden_, dt, dt);          // logits = x W^T, the first (largest) chunk
    p.gemm(chunk, hidden_, vocab_, dt, dt);          // dx = dlogits W
    p.gemm(vocab_, hidden_, chunk, dt, DType::F32);  // dW += dlogits^T x
    return tp_.splits_sequence() ? p.split_rows(dx, tp_.size) : dx;
  }

  void parameters(ParamSpecs& out) const {
    if (own_) out.push_back({.numel = vocab_ * hidden_, .gemm = true});
  }

 private:
  static constexpr int64_t kChunkRows = 256;  // nn/output_head.cpp's
  int64_t hidden_, vocab_;
  bool own_;
  Tp tp_;
};

struct MtpCtx {
  NormCtx enorm, hnorm, final_norm;
  LinearCtx eh_proj;
  BlockCtx block;
};

// nn::MtpLayer: [enorm(embedding) | hnorm(hidden)] -> eh_proj -> a block -> its final norm; forward
// and backward both run inside the main loss op.
class Mtp {
 public:
  Mtp(Norm norm, int64_t hidden, Block block)
      : enorm_(norm),
        hnorm_(norm),
        eh_proj_(2 * hidden, hidden, false, Parallel::Column),
        block_(std::move(block)),
        final_norm_(norm),
        hidden_(hidden) {}

  Buf forward(const Pass& p, MtpCtx& ctx, const Buf& emb, const Buf& hidden) const {
    return final_norm_.forward(p, ctx.final_norm, block_.forward(p, ctx.block, combine(p, ctx, emb, hidden)));
  }

  // {d embedding, d hidden}; empties ctx.
  std::pair<Buf, Buf> backward(const Pass& p, MtpCtx& ctx, const Buf& dout) const {
    const int64_t N = dout.rows();
    const Buf dblock = final_norm_.backward_input(p, ctx.final_norm, dout);
    Norm::backward_weight(ctx.final_norm);
    const Buf dx = block_.backward_input(p, ctx.block, dblock);
    block_.backward_weight(p, ctx.block);
    const Buf djoined = eh_proj_.backward_input(p, ctx.eh_proj, dx);
    eh_proj_.backward_weight(p, ctx.eh_proj);
    const Buf de = p.act(N, hidden_, dout.dtype()), dh = p.act(N, hidden_, dout.dtype());
    Buf demb = enorm_.backward_input(p, ctx.enorm, de), dhidden = hnorm_.backward_input(p, ctx.hnorm, dh);
    ctx = {};
    return {demb, dhidden};
  }

  void parameters(ParamSpecs& out) const {
    enorm_.parameters(out);
    hnorm_.parameters(out);
    eh_proj_.parameters(out);
    block_.parameters(out);
    final_norm_.parameters(out);
  }

 private:
  Buf combine(const Pass& p, MtpCtx& ctx, const Buf& emb, const Buf& hidden) const {
    const Buf e = enorm_.forward(p, ctx.enorm, emb), h = hnorm_.forward(p, ctx.hnorm, hidden);
    const Buf joined = p.act(emb.rows(), 2 * hidden_, emb.dtype());
    return eh_proj_.forward(p, ctx.eh_proj, joined);
  }

  Norm enorm_, hnorm_;
  Linear eh_proj_;
  Block block_;
  Norm final_norm_;
  int64_t hidden_;
};

struct ChunkCtx {
  Buf tokens;
  std::vector<BlockCtx> blocks;
  std::vector<Buf> unit_inputs;  // full recompute: each unit's input
  NormCtx final_norm;
  Buf dloss, dembed;
};

// models::ModelChunk: its layers, the embedding on the first chunk, the final norm and the loss op
// (the head, then the multi-token prediction depths) on the last.
class Chunk {
 public:
  struct Ends {  // the modules around the layers
    std::optional<Embedding> embedding;
    std::optional<Norm> final_norm;
    std::optional<Head> head;
    std::vector<Mtp> mtp;
  };
  Chunk(Ends ends, std::vector<Block> layers, const nn::RecomputeConfig& recompute)
      : ends_(std::move(ends)), layers_(std::move(layers)), recompute_(recompute) {}
  bool first() const { return ends_.embedding.has_value(); }
  bool last() const { return ends_.head.has_value(); }

  Buf forward(const Pass& p, ChunkCtx& ctx, const Buf& input) const {
    ctx.blocks.resize(layers_.size());
    Buf h = input;
    if (first()) {
      ctx.tokens = input;
      h = ends_.embedding->forward(p, input);
    }
    if (recompute_.full()) ctx.unit_inputs.assign(layers_.size(), Buf());
    for (size_t i = 0; i < layers_.size(); ++i) {
      const auto [begin, end] = recompute_unit(i);
      if (end > begin && begin == i) ctx.unit_inputs[i] = h;
      h = layers_[i].forward(p, ctx.blocks[i], h);
      if (end > begin) ctx.blocks[i] = {};  // only the unit's input is kept
    }
    return last() ? ends_.final_norm->forward(p, ctx.final_norm, h) : h;
  }

  // The loss op on the last chunk's output: the head's gradient kept for B, then every MTP depth's
  // forward and backward.
  void loss(const Pass& p, ChunkCtx& ctx, const Buf& output) const {
    ctx.dloss = ends_.head->loss_and_grad(p, output);
    if (!ends_.mtp.empty()) mtp_loss(p, output);
  }

  // B and W together, each layer's W right after its B (pipeline::execute fuses them).
  Buf backward(const Pass& p, ChunkCtx& ctx, const Buf& doutput) const {
    Buf d = output_grad(p, ctx, doutput);
    if (last()) Norm::backward_weight(ctx.final_norm);
    for (size_t i = layers_.size(); i-- > 0;) {
      rebuild_unit(p, ctx, i);
      d = layers_[i].backward_input(p, ctx.blocks[i], d);
      layers_[i].backward_weight(p, ctx.blocks[i]);
    }
    if (first()) {
      ends_.embedding->backward_weight(p, ctx.tokens, d);
      d = {};
    }
    ctx = {};
    return d;
  }

  Buf backward_input(const Pass& p, ChunkCtx& ctx, const Buf& doutput) const {
    Buf d = output_grad(p, ctx, doutput);
    for (size_t i = layers_.size(); i-- > 0;) {
      rebuild_unit(p, ctx, i);
      d = layers_[i].backward_input(p, ctx.blocks[i], d);
    }
    if (!first()) return d;
    ctx.dembed = d;
    return {};
  }

  void backward_weight(const Pass& p, ChunkCtx& ctx) const {
    if (last()) Norm::backward_weight(ctx.final_norm);
    for (size_t i = layers_.size(); i-- > 0;) layers_[i].backward_weight(p, ctx.blocks[i]);
    if (first()) ends_.embedding->backward_weight(p, ctx.tokens, ctx.dembed);
    ctx = {};
  }

  // In TransformerModel's order; embedding_gemm: the word table is the head's weight here too.
  void parameters(ParamSpecs& out, bool embedding_gemm) const {
    if (first()) ends_.embedding->parameters(out, embedding_gemm);
    for (const Block& b : layers_) b.parameters(out);
    if (!last()) return;
    ends_.final_norm->parameters(out);
    ends_.head->parameters(out);
    for (const Mtp& d : ends_.mtp) d.parameters(out);
  }
  Fp8Weights fp8_weights() const {
    Fp8Weights w;
    for (const Block& b : layers_) w += b.fp8_weights();
    return w;
  }

 private:
  Buf output_grad(const Pass& p, ChunkCtx& ctx, const Buf& doutput) const {
    if (!last()) return doutput;
    Buf d = ends_.final_norm->backward_input(p, ctx.final_norm, ctx.dloss);
    ctx.dloss = {};
    return d;
  }
  // The layers [begin, end) of the full-recompute unit holding layer i ({0, 0}: kept).
  std::pair<size_t, size_t> recompute_unit(size_t i) const {
    if (!recompute_.full()) return {0, 0};
    const auto k = static_cast<size_t>(recompute_.num_layers);
    if (recompute_.method == nn::RecomputeMethod::Block)
      return i < k ? std::pair{i, i + 1} : std::pair<size_t, size_t>{0, 0};
    const size_t begin = i / k * k;
    return {begin, std::min(begin + k, layers_.size())};
  }
  // Before the B of a unit's last layer: the unit's forward again from its saved input.
  void rebuild_unit(const Pass& p, ChunkCtx& ctx, size_t i) const {
    const auto [begin, end] = recompute_unit(i);
    if (end == begin || i + 1 != end) return;
    Buf h = ctx.unit_inputs[begin];
    ctx.unit_inputs[begin] = {};
    for (size_t j = begin; j < end; ++j) h = layers_[j].forward(p, ctx.blocks[j], h);
  }
  // models/mtp_loss.cpp: every depth's forward and loss, then each depth's backward from the last,
  // the shared embedding's weight gradient as it comes (the gradient at the main output is added
  // into the chunk's, in place).
  void mtp_loss(const Pass& p, const Buf& output) const {
    const size_t D = ends_.mtp.size();
    std::vector<MtpCtx> ctxs(D);
    std::vector<Buf> ids(D), dheads(D);
    Buf h = output;
    for (size_t k = 0; k < D; ++k) {
      ids[k] = p.act(p.B, p.T, DType::I32);
      const Buf targets = p.act(p.B, p.T, DType::I32);
      h = ends_.mtp[k].forward(p, ctxs[k], ends_.embedding->forward(p, ids[k]), h);
      dheads[k] = ends_.head->loss_and_grad(p, h);
    }
    Buf d;
    for (size_t k = D; k-- > 0;) {
      auto [demb, dhidden] = ends_.mtp[k].backward(p, ctxs[k], dheads[k]);
      ends_.embedding->backward_weight(p, ids[k], demb);
      d = dhidden;
    }
  }

  Ends ends_;
  std::vector<Block> layers_;
  nn::RecomputeConfig recompute_;
};

}  // namespace shadow

// ---------------------------------------------------------------------------------------------
// c's model as this rank builds it.

// What every module is built with (the trainer's settings of TransformerModel).
struct Build {
  const train::TrainConfig& c;
  models::StageLayout layout;
  Tp tp;
  int ep;
  nn::RecomputeConfig recompute;
  std::optional<fp8::Fp8Config> fp8;
  std::pair<int64_t, int64_t> fp8_layers;  // [first, end) of the layers whose linears run in FP8
};

Build make_build(const train::TrainConfig& c) {
  const std::optional<fp8::Fp8Config> fp8 = train::fp8_config(c);
  if (c.model.mtp_num_layers > 0 && c.pipeline_model_parallel_size > 1)
    fail("mtp_num_layers ", c.model.mtp_num_layers, ": multi-token prediction needs the whole model on one ",
         "pipeline stage (pipeline_model_parallel_size 1), as the trainer refuses it otherwise");
  return {c,
          train::pipeline_layout(c),
          Tp{static_cast<int>(c.tensor_model_parallel_size), c.sequence_parallel},
          static_cast<int>(c.expert_model_parallel_size),
          train::recompute_config(c),
          fp8,
          fp8 ? train::fp8_layer_range(c, c.model.num_layers) : std::pair<int64_t, int64_t>{0, 0}};
}

shadow::Norm norm(const models::TransformerConfig& m) {
  return {m.hidden_size, m.normalization == models::Normalization::RMSNorm};
}

std::unique_ptr<shadow::Sublayer> attention(const Build& b, bool recompute_core) {
  const models::TransformerConfig& m = b.c.model;
  if (m.attention_type == "self_attention")
    return std::make_unique<shadow::SelfAttention>(
        nn::AttentionShape{m.hidden_size, m.num_attention_heads, m.num_query_groups, m.head_dim()}, m.add_bias_linear,
        b.tp, recompute_core);
  if (m.is_mla())
    return std::make_unique<shadow::LatentAttention>(m.hidden_size, m.num_attention_heads, m.mla, m.add_bias_linear,
                                                     b.tp, recompute_core);
  fail("memory model: attention kind '", m.attention_type, "' is not modelled (self_attention, mla)");
}

std::unique_ptr<shadow::Sublayer> mlp(const Build& b, bool moe, bool recompute_act) {
  const models::TransformerConfig& m = b.c.model;
  if (moe)
    return std::make_unique<shadow::Moe>(m.hidden_size, m.moe,
                                         shadow::MoeSetting{b.tp, b.ep, recompute_act, b.c.layernorm_mlp_fusion});
  if (m.mlp_type != "dense" && m.mlp_type != "moe")
    fail("memory model: mlp kind '", m.mlp_type, "' is not modelled (dense, moe)");
  return std::make_unique<shadow::Mlp>(m.hidden_size, m.ffn_hidden_size, m.activation == nn::Activation::SwiGLU,
                                       m.add_bias_linear, b.tp, b.c.layernorm_mlp_fusion);
}

// Layer `layer` (num_layers: an MTP depth's block, which neither recomputes nor runs FP8).
shadow::Block block(const Build& b, int64_t layer) {
  const models::TransformerConfig& m = b.c.model;
  const bool decoder = layer < m.num_layers;
  const bool selective = decoder && b.recompute.granularity == nn::RecomputeGranularity::Selective;
  shadow::Block block(norm(m), attention(b, selective && b.recompute.core_attn),
                      mlp(b, m.is_moe_layer(layer), selective && b.recompute.moe_act),
                      {selective && b.recompute.mlp, selective && b.recompute.layernorm, b.c.layernorm_linear_fusion});
  if (decoder && b.fp8 && layer >= b.fp8_layers.first && layer < b.fp8_layers.second) block.enable_fp8(*b.fp8);
  return block;
}

// The layers [begin, end) of model chunk k.
std::pair<int64_t, int64_t> chunk_layers(const models::StageLayout& layout, size_t k) {
  const std::vector<int64_t>& sizes = layout.chunk_layers;
  const int64_t begin = std::accumulate(sizes.begin(), sizes.begin() + static_cast<int64_t>(k), int64_t{0});
  return {begin, begin + sizes.at(k)};
}

// Model chunk k; own_head: the head holds its own weight (not the tied embedding on its rank).
shadow::Chunk chunk(const Build& b, size_t k, bool own_head) {
  const models::TransformerConfig& m = b.c.model;
  const auto [begin, end] = chunk_layers(b.layout, k);
  const int64_t vocab_rows = shadow::local_features({m.padded_vocab_size(b.tp.size)}, b.tp, "padded vocabulary");
  shadow::Chunk::Ends ends;
  if (k == 0)
    ends.embedding.emplace(vocab_rows, m.hidden_size, m.max_position_embeddings,
                           m.position_embedding == models::PositionEmbedding::LearnedAbsolute, b.tp);
  std::vector<shadow::Block> layers;
  for (int64_t i = begin; i < end; ++i) layers.push_back(block(b, i));
  if (k + 1 == b.layout.num_chunks()) {
    ends.final_norm = norm(m);
    ends.head.emplace(m.hidden_size, vocab_rows, own_head, b.tp);
    for (int64_t d = 0; d < m.mtp_num_layers; ++d)
      ends.mtp.emplace_back(norm(m), m.hidden_size, block(b, m.num_layers));
  }
  return {std::move(ends), std::move(layers), b.recompute};
}

// The flat buffers nn::ParamAndGradBuffer lays the parameters out in (see there): elements, and
// the elements a rank owns of the shards every bucket splits into.
struct GradBuffer {
  int64_t elements = 0, owned = 0;
  int64_t largest_bucket = 0, largest_shard = 0;
};

GradBuffer lay_out(const ParamSpecs& params, int64_t bucket_size, int64_t shards, int64_t expert_shards) {
  std::vector<nn::BufferSlot> slots;
  for (auto p = params.rbegin(); p != params.rend(); ++p) slots.push_back({p->numel, p->expert});  // reverse order of registration
  const nn::BufferLayout layout = nn::lay_out_buffer(slots, bucket_size, shards, expert_shards);
  GradBuffer g;
  g.elements = layout.total;
  for (const nn::BucketSpan& b : layout.buckets) {
    const int64_t shard = b.numel / (b.expert ? expert_shards : shards);
    g.owned += shard;
    g.largest_bucket = std::max(g.largest_bucket, b.numel);
    g.largest_shard = std::max(g.largest_shard, shard);
  }
  return g;
}

// One pipeline rank's model chunks and the persistent layout of their parameters.
struct Stage {
  int64_t rank = 0;               // in the pipeline group
  std::vector<size_t> chunk_ids;  // the model chunks it holds, in order
  std::vector<shadow::Chunk> chunks;
  ParamSpecs params;  // in registration order
  GradBuffer buffer;
  Fp8Weights fp8;
  bool moe = false;  // holds an MoE layer (an MTP depth's included)
};

bool holds(const models::StageLayout& layout, size_t k, int64_t rank) {
  return layout.chunk_rank.at(k) == rank || (!layout.chunk_copy_rank.empty() && layout.chunk_copy_rank.at(k) == rank);
}

Stage stage(const Build& b, int64_t rank) {
  const train::TrainConfig& c = b.c;
  const size_t last = b.layout.num_chunks() - 1;
  const bool first_here = holds(b.layout, 0, rank), last_here = holds(b.layout, last, rank);
  const bool tied = c.model.tie_embeddings;
  Stage s;
  s.rank = rank;
  for (size_t k = 0; k <= last; ++k) {
    if (!holds(b.layout, k, rank)) continue;
    s.chunk_ids.push_back(k);
    s.chunks.push_back(chunk(b, k, !(tied && first_here)));
    s.chunks.back().parameters(s.params, tied && last_here);
    s.fp8 += s.chunks.back().fp8_weights();
    // Layers only grow more MoE along the model: the chunk's last one (or its MTP depths') tells.
    const int64_t last_layer =
        k == last && c.model.mtp_num_layers > 0 ? c.model.num_layers : chunk_layers(b.layout, k).second - 1;
    s.moe = s.moe || c.model.is_moe_layer(last_layer);
  }
  const int64_t dp = std::max<int64_t>(1, c.data_parallel_size);
  const int64_t edp = c.tensor_model_parallel_size * c.context_parallel_size * dp / c.expert_model_parallel_size;
  const bool distributed = c.use_distributed_optimizer;
  s.buffer = lay_out(s.params, c.bucket_size, distributed ? dp : 1, distributed ? edp : 1);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Activations.

DType compute_dtype(const train::TrainConfig& c) { return c.fp16 ? DType::F16 : c.bf16 ? DType::BF16 : DType::F32; }

Pass make_pass(const Build& b, Ledger& ledger) {
  using kernels::cpu::GemmLibrary;
  const DType dt = compute_dtype(b.c);
  return {ledger,
          b.c.micro_batch_size,
          b.c.seq_length,
          dt,
          is_16bit(dt) && kernels::cpu::gemm_library(dt) == GemmLibrary::OpenBlas,
          kernels::cpu::gemm_library(DType::BF16) == GemmLibrary::OneDnn ? DType::BF16 : DType::F32,
          kernels::attention_dtype(kernels::ExecContext{}, dt)};
}

// The rows a chunk boundary carries (activations and their gradients, [rows, hidden] in the compute
// dtype): the micro-batch's tokens, this rank's share of them under sequence parallelism.
int64_t boundary_rows(const Build& b) {
  return b.c.micro_batch_size * b.c.seq_length / (b.tp.splits_sequence() ? b.tp.size : 1);
}

Buf boundary(const Pass& p, const Build& b) { return p.act(boundary_rows(b), b.c.model.hidden_size, p.dtype); }

// Whether the schedule runs W apart from B (Zero Bubble, DualPipe), so B keeps what W needs.
bool defers_weight_grads(const train::TrainConfig& c) {
  static const std::vector<std::string> kinds = {"zb-h1", "zb-h2", "zbv", "dualpipe", "dualpipev"};
  return c.pipeline_model_parallel_size > 1 &&
         std::find(kinds.begin(), kinds.end(), c.pipeline_schedule) != kinds.end();
}

// One micro-batch through `chunk`: F (with the loss op on the last chunk), then B and W in one call,
// and, for the schedules that defer W, again with W apart from B.
ChunkActivations replay(const Build& b, const shadow::Chunk& chunk) {
  ChunkActivations a;
  for (const bool apart : {false, true}) {
    if (apart && !defers_weight_grads(b.c)) break;
    Ledger ledger;
    const Pass p = make_pass(b, ledger);
    shadow::ChunkCtx ctx;
    {  // the input (token ids or the previous chunk's output) stays only where the chunk keeps it
      const Buf input = chunk.first() ? p.act(p.B, p.T, DType::I32) : boundary(p, b);
      const Buf output = chunk.forward(p, ctx, input);
      if (chunk.last()) chunk.loss(p, ctx, output);
    }
    a.saved = ledger.live();
    a.forward_transient = ledger.peak() - a.saved;
    ledger.restart_peaks();
    {  // the incoming gradient and the input gradient (sent on) stay only where W keeps them
      const Buf doutput = chunk.last() ? Buf() : boundary(p, b);
      const Buf dinput = apart ? chunk.backward_input(p, ctx, doutput) : chunk.backward(p, ctx, doutput);
    }
    (apart ? a.input_transient : a.backward_transient) = ledger.peak() - a.saved;
    if (!apart) continue;
    a.held_for_w = ledger.live();
    ledger.restart_peaks();
    chunk.backward_weight(p, ctx);
    a.weight_transient = ledger.peak() - a.held_for_w;
  }
  return a;
}

void check_rank(const char* group, int64_t rank, int64_t size) {
  if (rank < 0 || rank >= size)
    fail("memory model: ", group, " rank ", rank, " is outside the group's ", size, " ranks");
}

void check_ranks(const train::TrainConfig& c, int64_t pp_rank, int64_t tp_rank, int64_t ep_rank) {
  check_rank("pipeline", pp_rank, c.pipeline_model_parallel_size);
  check_rank("tensor-parallel", tp_rank, c.tensor_model_parallel_size);
  check_rank("expert-parallel", ep_rank, c.expert_model_parallel_size);
}

// The host copies of the weights and optimizer state the checkpoint machinery keeps for good
// (train/state_snapshot.h): the save buffers when checkpoints are written, the rewind point when
// rewinding from memory. Each holds every parameter's value (other), its full moments (optimizer;
// a distributed optimizer's gathered) and the FP8 delayed-scaling states (other).
MemoryBreakdown snapshots(const Build& b, const Stage& s, double param_bytes) {
  const train::TrainConfig& c = b.c;
  const int count =
      (c.save_interval > 0 || c.exit_interval > 0 ? 1 : 0) + (c.rewind && c.snapshot_interval > 0 ? 1 : 0);
  const bool delayed = b.fp8 && b.fp8->recipe == fp8::Recipe::Delayed;
  const double fp8_states =
      delayed ? 3.0 * static_cast<double>(s.fp8.linears * (b.fp8->delayed.history_len + 1)) * 4.0 : 0.0;
  MemoryBreakdown m;
  m.optimizer = count * 2.0 * param_bytes;
  m.other = count * (param_bytes + fp8_states);
  return m;
}

MemoryBreakdown persistent(const Build& b, const Stage& s) {
  const train::TrainConfig& c = b.c;
  const models::TransformerConfig& model = c.model;
  double numel = 0, gemm_numel = 0;
  for (const ParamSpec& p : s.params) {
    numel += static_cast<double>(p.numel);
    if (p.gemm) gemm_numel += static_cast<double>(p.numel);
  }
  const double buffer = 4.0 * static_cast<double>(s.buffer.elements);
  const double compute_bytes = c.bf16 || c.fp16 ? 2.0 : 0.0;
  MemoryBreakdown m = snapshots(b, s, 4.0 * numel);
  m.params = buffer + compute_bytes * gemm_numel + s.fp8.cache_bytes;
  m.grads = buffer;
  m.optimizer += 8.0 * static_cast<double>(s.buffer.owned);
  // Optimizer post-validation's undo copy (train/step_undo.h): the flat weights and every moment.
  if (c.optimizer_post_validation) m.optimizer += buffer + 8.0 * numel;
  if (model.position_embedding == models::PositionEmbedding::Rope)  // cos and sin tables, built once
    m.workspace = 2.0 * static_cast<double>(model.max_position_embeddings * (model.rope_dim() / 2)) * 4.0;
  return m;
}

// What the step allocates beside the micro-batches' modules. Under pipelining: the sends it keeps
// until the step ends (TrainingStage::finish), at the activation peak every forward's output and the
// input gradients of the micro-batches already finished, and the receive posted one op ahead (not
// on the stage running the loss: it receives only forwards' inputs, and its last backward, with the
// most sends, has no forward after it). Workspace outside the micro-batches: the distributed
// optimizer's reduce-scatter staging of a shard and its gather of a bucket's moments into the rewind
// point, the FP8 amax reduction, the expert loads of the bias update. The f64 scalar of a scalar
// collective, two at once while the MPI progress thread still holds the previous one.
MemoryBreakdown step_buffers(const Build& b, const Stage& s, int64_t in_flight) {
  const train::TrainConfig& c = b.c;
  MemoryBreakdown m;
  if (c.pipeline_model_parallel_size > 1) {
    const int64_t last = static_cast<int64_t>(b.layout.num_chunks()) - 1;
    const int64_t microbatches = c.grad_accum_steps();
    const bool loss_here = holds(b.layout, static_cast<size_t>(last), s.rank);
    int64_t buffers = loss_here ? 0 : 1;
    for (const size_t k : s.chunk_ids) {
      if (static_cast<int64_t>(k) < last && b.layout.chunk_rank.at(k + 1) != s.rank) buffers += microbatches;
      if (k > 0 && b.layout.chunk_rank.at(k - 1) != s.rank) buffers += std::max<int64_t>(0, microbatches - in_flight);
    }
    const double boundary = static_cast<double>(boundary_rows(b) * c.model.hidden_size * dtype_size(compute_dtype(c)));
    m.activations = static_cast<double>(buffers) * boundary;
  }
  const int64_t dp = std::max<int64_t>(1, c.data_parallel_size);
  const bool distributed = c.use_distributed_optimizer;
  const bool reduces = dp > 1 || c.tensor_model_parallel_size > 1;  // some bucket is reduce-scattered
  const double staging = distributed && reduces ? 4.0 * static_cast<double>(s.buffer.largest_shard) : 0.0;
  const bool rewind_point = c.rewind && c.snapshot_interval > 0;
  const double gather = distributed && rewind_point ? 8.0 * static_cast<double>(s.buffer.largest_bucket) : 0.0;
  const bool delayed = b.fp8 && b.fp8->recipe == fp8::Recipe::Delayed;
  const double amax = delayed ? 3.0 * 4.0 * static_cast<double>(s.fp8.linears) : 0.0;
  const bool bias = s.moe && c.model.moe.moe_router_enable_expert_bias;
  const double loads = bias ? 8.0 * static_cast<double>(c.model.moe.num_moe_experts) : 0.0;
  m.workspace = std::max({staging, gather, amax, loads});
  const int64_t world = c.tensor_model_parallel_size * c.context_parallel_size * dp * c.pipeline_model_parallel_size;
  if (world > 1) m.other = 2.0 * 8.0;
  return m;
}

}  // namespace

MemoryBreakdown static_memory(const train::TrainConfig& c, int64_t pp_rank, int64_t tp_rank, int64_t ep_rank) {
  check_ranks(c, pp_rank, tp_rank, ep_rank);
  const Build b = make_build(c);
  return persistent(b, stage(b, pp_rank));
}

ChunkActivations chunk_activations(const train::TrainConfig& c, int64_t model_chunk, int64_t tp_rank) {
  check_rank("tensor-parallel", tp_rank, c.tensor_model_parallel_size);
  const Build b = make_build(c);
  const auto chunks = static_cast<int64_t>(b.layout.num_chunks());
  if (model_chunk < 0 || model_chunk >= chunks)
    fail("memory model: model chunk ", model_chunk, " is outside the ", chunks, " model chunks of the layout");
  const auto k = static_cast<size_t>(model_chunk);
  const bool own_head = !(c.model.tie_embeddings && holds(b.layout, 0, b.layout.chunk_rank.at(k)));
  return replay(b, chunk(b, k, own_head));
}

MemoryBreakdown peak_memory(const train::TrainConfig& c, int64_t pp_rank, int64_t in_flight,
                            const std::vector<pipeline::LiveActivations>& live, int64_t tp_rank, int64_t ep_rank) {
  check_ranks(c, pp_rank, tp_rank, ep_rank);
  if (in_flight < 1) fail("memory model: ", in_flight, " micro-batches in flight (at least 1)");
  if (live.empty()) fail("memory model: pipeline rank ", pp_rank, " runs no compute op");
  const Build b = make_build(c);
  const Stage s = stage(b, pp_rank);
  ChunkActivations w;  // the largest of this rank's chunks, each figure on its own
  for (const shadow::Chunk& chunk : s.chunks) {
    const ChunkActivations a = replay(b, chunk);
    w.saved = max(w.saved, a.saved);
    w.held_for_w = max(w.held_for_w, a.held_for_w);
    w.forward_transient = max(w.forward_transient, a.forward_transient);
    w.backward_transient = max(w.backward_transient, a.backward_transient);
    w.input_transient = max(w.input_transient, a.input_transient);
    w.weight_transient = max(w.weight_transient, a.weight_transient);
  }
  // Every micro-batch in flight also holds its targets (TrainingStage), B x T i32, until its last W.
  const double targets = 4.0 * static_cast<double>(c.micro_batch_size * c.seq_length);
  w.saved.activations += targets;
  w.held_for_w.activations += targets;
  MemoryBreakdown step;
  for (const pipeline::LiveActivations& e : live) {
    MemoryBreakdown at = static_cast<double>(e.saved) * w.saved + static_cast<double>(e.held_for_w) * w.held_for_w;
    if (e.kind == pipeline::OpKind::Forward)
      at += w.saved + w.forward_transient;
    else if (e.kind == pipeline::OpKind::BackwardInput)
      at += w.saved + (e.with_weight ? w.backward_transient : w.input_transient);
    else
      at += w.held_for_w + w.weight_transient;
    step = max(step, at);
  }
  const MemoryBreakdown extra = step_buffers(b, s, in_flight);
  step.activations += extra.activations;
  step.workspace = std::max(step.workspace, extra.workspace);
  step.other = std::max(step.other, extra.other);
  return persistent(b, s) + step;
}

MemoryBreakdown peak_memory(const train::TrainConfig& c, int64_t pp_rank, int64_t in_flight, int64_t tp_rank,
                            int64_t ep_rank) {
  // The peak comes with in_flight - 1 others saved, during a forward or a fused backward.
  const auto others = static_cast<int>(std::max<int64_t>(0, in_flight - 1));
  return peak_memory(
      c, pp_rank, in_flight,
      {{pipeline::OpKind::Forward, false, others, 0}, {pipeline::OpKind::BackwardInput, true, others, 0}}, tp_rank,
      ep_rank);
}

}  // namespace megaton::plan
