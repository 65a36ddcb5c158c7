// Mixture-of-experts ops on tensors (Megatron-Core's router, token dispatcher and grouped MLP):
// routing (top-k experts per token and their weights), the load-balancing and z losses, the
// dispatch plan (which permuted row each kept slot goes to, with optional capacity dropping),
// permute / unpermute of token rows with their backward, and the grouped linear that runs every
// expert's GEMM over its contiguous block of permuted rows in one call. The permutations and the
// grouped linears also run on CUDA (f32 / bf16 rows; the grouped linear as one cuBLASLt GEMM per
// expert block); the rest is CPU only: routing and the losses in f32 / f64 (the logits, probs and losses are f32 in training whatever the compute dtype,
// as Megatron's router); the permutations and grouped linears also on bf16 / fp16 rows (sums in f32).
// Shapes: logits [N, E]; indices (i32), probs, pos (i32) [N, K]; permuted rows [M, C].
#pragma once
#include <vector>

#include "megaton/kernels/cpu/moe.h"
#include "megaton/kernels/exec_context.h"

namespace megaton::kernels {

using cpu::RouterOptions;

// Throws naming what is wrong unless the options describe a valid router (k <= experts, groups
// dividing the experts, topk_groups <= groups, k <= experts in the eligible groups, finite scaling).
void check_router_options(const RouterOptions& o);

// indices[n] = the top-k experts of token n ranked by score (+ bias, which only steers selection;
// bias may be undefined), probs[n] their weights: softmax over all experts (pre_softmax) or over
// the k selected logits, or sigmoid; optionally normalised to sum 1 (norm_topk_prob), times scaling.
void moe_route(const ExecContext& ctx, const Tensor& indices, const Tensor& probs, const Tensor& logits,
               const Tensor& bias, const RouterOptions& o);
// dlogits (written) from dprobs through the selected experts' weights.
void moe_route_backward(const ExecContext& ctx, const Tensor& dlogits, const Tensor& dprobs, const Tensor& logits,
                        const Tensor& indices, const RouterOptions& o);

// The scores the load-balancing losses read: softmax(logits) or sigmoid(logits) / sum.
void moe_balance_scores(const ExecContext& ctx, const Tensor& scores, const Tensor& logits, bool sigmoid);
// dlogits += gradient through moe_balance_scores.
void moe_balance_scores_backward(const ExecContext& ctx, const Tensor& dlogits, const Tensor& dscores,
                                 const Tensor& logits, bool sigmoid);
// Switch / GShard aux loss (group_rows = N) or DeepSeek-V3's sequence-wise one (group_rows = the
// sequence length); see cpu/moe.h. Writes grad_scale x its gradient w.r.t. scores into dscores.
double moe_balance_loss(const ExecContext& ctx, const Tensor& dscores, const Tensor& scores, const Tensor& indices,
                        int64_t group_rows, double coeff, double grad_scale);
// coeff x mean logsumexp(logits)^2; adds grad_scale x its gradient to dlogits when that is defined.
double moe_z_loss(const ExecContext& ctx, const Tensor& dlogits, const Tensor& logits, double coeff,
                  double grad_scale);

// Where each slot's token goes: the permuted rows are grouped by expert, in token order within an
// expert. capacity < 0: dropless. Otherwise an expert keeps at most `capacity` slots, the ones with
// the largest probs (drop_by_position: the earliest tokens); the others get pos -1.
struct DispatchPlan {
  std::vector<int64_t> rows_per_expert;  // kept slots per expert (the grouped GEMM's row blocks)
  std::vector<int64_t> selected_per_expert;  // slots that chose each expert, kept or not
  int64_t dropped = 0;                   // slots dropped by capacity
  int64_t rows = 0;                      // M: kept slots
};
DispatchPlan moe_dispatch_plan(const ExecContext& ctx, const Tensor& pos, const Tensor& indices, const Tensor& probs,
                               int64_t experts, int64_t capacity, bool drop_by_position);

// Expert parallelism's plans (nn/moe/token_dispatcher.h).
// sel[n, k] = indices[n, k] for a kept slot (pos[n, k] >= 0), else -1: the slots a token keeps after
// capacity dropping, as the all-gather dispatcher hands them to the other ranks.
void moe_kept_experts(const ExecContext& ctx, const Tensor& sel, const Tensor& indices, const Tensor& pos);
// One rank's plan over slots gathered from its expert-parallel group: every slot with sel in
// [first_expert, first_expert + local_experts) gets a permuted row, grouped by expert in slot order;
// every other slot (another rank's expert, or dropped: -1) gets pos -1. The plan's per-expert
// vectors have local_experts entries; nothing is dropped here.
DispatchPlan moe_local_plan(const ExecContext& ctx, const Tensor& pos, const Tensor& sel, int64_t first_expert,
                            int64_t local_experts);
// The all-to-all dispatcher's reordering: received rows come grouped by source rank, then by expert
// (counts[s * experts + e] rows of local expert e from rank s, s < sources); pos[r] ([R, 1] i32)
// becomes row r's place in expert-major order (by expert, then source), so moe_permute with pos
// sorts them for the grouped GEMM and moe_permute_backward puts them back.
void moe_sort_by_expert(const ExecContext& ctx, const Tensor& pos, const std::vector<int64_t>& counts,
                        int64_t sources, int64_t experts);

// out[pos[n, k]] = x[n]; backward: dx[n] = sum_k dout[pos[n, k]] (written).
void moe_permute(const ExecContext& ctx, const Tensor& out, const Tensor& x, const Tensor& pos);
void moe_permute_backward(const ExecContext& ctx, const Tensor& dx, const Tensor& dout, const Tensor& pos);
// y[n] = sum_k probs[n, k] rows[pos[n, k]]; backward writes drows and dprobs.
void moe_unpermute(const ExecContext& ctx, const Tensor& y, const Tensor& rows, const Tensor& pos, const Tensor& probs);
void moe_unpermute_backward(const ExecContext& ctx, const Tensor& drows, const Tensor& dprobs, const Tensor& dy,
                            const Tensor& rows, const Tensor& pos, const Tensor& probs);

// Grouped linear: expert e's weight is rows [e*out, (e+1)*out) of w [E*out, in]; it multiplies the
// e-th block of rows_per_expert[e] rows of x [M, in] into out [M, out]. Backward as kernels/linear.h
// (dx written, dw accumulated), block by block. grouped (model.moe_grouped_gemm): the experts' GEMMs
// run side by side in one parallel region, one thread each, when at least as many experts have
// rows as there are threads; false: one GEMM after another, each on every thread (Megatron's
// SequentialMLP). The results are the same either way.
void grouped_linear_forward(const ExecContext& ctx, const Tensor& out, const Tensor& x, const Tensor& w,
                            const std::vector<int64_t>& rows_per_expert, bool grouped = true);
void grouped_linear_backward_input(const ExecContext& ctx, const Tensor& dx, const Tensor& dout, const Tensor& w,
                                   const std::vector<int64_t>& rows_per_expert, bool grouped = true);
void grouped_linear_backward_weight(const ExecContext& ctx, const Tensor& dw, const Tensor& dout, const Tensor& x,
                                    const std::vector<int64_t>& rows_per_expert, bool grouped = true);

}  // namespace megaton::kernels
