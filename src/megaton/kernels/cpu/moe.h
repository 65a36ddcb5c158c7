// Mixture-of-experts routing and token movement (CPU reference), templated on the element type
// (float for training, double for the gradient checks). Layouts: logits / scores [N, E] (N tokens,
// E experts); indices / probs / pos [N, K] (K = top-k slots per token); permuted rows [M, C] grouped
// by expert. pos[n, k] is the permuted row of token n's k-th slot, or -1 when capacity dropped it.
#pragma once
#include <cstdint>

namespace megaton::kernels::cpu {

// How a router turns logits into the top-k experts and their weights (see kernels/moe.h).
struct RouterOptions {
  int64_t experts = 0, topk = 0;
  bool sigmoid = false;      // score function: sigmoid, else softmax
  bool pre_softmax = true;   // softmax: over all experts before top-k (else over the k selected logits)
  int64_t groups = 1;        // group-limited routing: experts split into `groups` equal groups ...
  int64_t topk_groups = 1;   // ... of which the best `topk_groups` (by the sum of their top-2 scores) are eligible
  bool norm_topk_prob = false;
  double scaling = 1.0;      // routed_scaling_factor
};

template <typename T>
void moe_route(int32_t* indices, T* probs, const T* logits, const T* bias, int64_t N, const RouterOptions& o);
// dlogits[N, E] (written) from dprobs[N, K], for the experts `indices` selected.
template <typename T>
void moe_route_backward(T* dlogits, const T* dprobs, const T* logits, const int32_t* indices, int64_t N,
                        const RouterOptions& o);

// Scores the load-balancing losses read: softmax(logits), or sigmoid(logits) normalised to sum 1.
template <typename T>
void moe_balance_scores(T* scores, const T* logits, int64_t N, int64_t E, bool sigmoid);
// dlogits[N, E] += the gradient through moe_balance_scores of dscores.
template <typename T>
void moe_balance_scores_backward(T* dlogits, const T* dscores, const T* logits, int64_t N, int64_t E, bool sigmoid);

// Load-balancing loss over groups of `group_rows` consecutive tokens (N for the whole batch: Switch /
// GShard's aux loss; the sequence length: DeepSeek-V3's sequence-wise loss):
//   coeff * E / (K * group_rows^2 * groups) * sum_g sum_e count[g, e] * sum_{n in g} scores[n, e]
// with count[g, e] the slots of group g that selected expert e. Returns the loss and writes its
// gradient w.r.t. scores into dscores[N, E] (scaled by grad_scale).
template <typename T>
double moe_balance_loss(T* dscores, const T* scores, const int32_t* indices, int64_t N, int64_t E, int64_t K,
                        int64_t group_rows, double coeff, double grad_scale);

// z-loss coeff * mean_n logsumexp(logits[n])^2; with dlogits non-null adds grad_scale x its gradient.
template <typename T>
double moe_z_loss(T* dlogits, const T* logits, int64_t N, int64_t E, double coeff, double grad_scale);

// out[pos[n, k]] = x[n] for every kept slot.
template <typename T>
void moe_permute(T* out, const T* x, const int32_t* pos, int64_t N, int64_t K, int64_t C);
// dx[n] = sum over kept slots k of dout[pos[n, k]] (written).
template <typename T>
void moe_permute_backward(T* dx, const T* dout, const int32_t* pos, int64_t N, int64_t K, int64_t C);
// y[n] = sum over kept slots k of probs[n, k] * rows[pos[n, k]] (written).
template <typename T>
void moe_unpermute(T* y, const T* rows, const int32_t* pos, const T* probs, int64_t N, int64_t K, int64_t C);
// drows[pos[n, k]] = probs[n, k] dy[n] (written); dprobs[n, k] = dy[n] . rows[pos[n, k]] (0 if dropped).
template <typename T>
void moe_unpermute_backward(T* drows, T* dprobs, const T* dy, const T* rows, const int32_t* pos, const T* probs,
                            int64_t N, int64_t K, int64_t C);

}  // namespace megaton::kernels::cpu
