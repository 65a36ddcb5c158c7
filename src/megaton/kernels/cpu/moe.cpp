#include "megaton/kernels/cpu/moe.h"

#include "megaton/kernels/cpu/element.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace megaton::kernels::cpu {

namespace {

// Indices of the k largest of v[0, n) (ties: the lower index first), largest first, as torch.topk.
void top_indices(std::vector<int32_t>& out, const std::vector<double>& v, int64_t k) {
  std::vector<int32_t> order(v.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return v[static_cast<size_t>(a)] > v[static_cast<size_t>(b)] ||
           (v[static_cast<size_t>(a)] == v[static_cast<size_t>(b)] && a < b);
  });
  out.assign(order.begin(), order.begin() + k);
}

template <typename T>
void softmax_row(double* out, const T* x, int64_t n) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(x[i]));
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += out[i] = std::exp(static_cast<double>(x[i]) - mx);
  for (int64_t i = 0; i < n; ++i) out[i] /= sum;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

constexpr double kNormEps = 1e-20;  // Megatron's guard in probs / (sum + eps)

// What the k selected slots of one token hold before normalisation: the softmax (pre) or sigmoid
// scores of the selected experts, or (post-softmax) their logits.
template <typename T>
void selected_raw(double* raw, const T* logits, const int32_t* idx, const RouterOptions& o, double* full) {
  const int64_t E = o.experts, K = o.topk;
  if (o.sigmoid) {
    for (int64_t k = 0; k < K; ++k) raw[k] = sigmoid(static_cast<double>(logits[idx[k]]));
  } else if (o.pre_softmax) {
    softmax_row(full, logits, E);
    for (int64_t k = 0; k < K; ++k) raw[k] = full[idx[k]];
  } else {
    std::vector<double> sel(static_cast<size_t>(K));
    for (int64_t k = 0; k < K; ++k) sel[static_cast<size_t>(k)] = static_cast<double>(logits[idx[k]]);
    softmax_row(raw, sel.data(), K);
  }
}

}  // namespace

template <typename T>
void moe_route(int32_t* indices, T* probs, const T* logits, const T* bias, int64_t N, const RouterOptions& o) {
  const int64_t E = o.experts, K = o.topk, G = o.groups, per_group = E / G;
#pragma omp parallel for schedule(static) if (N * E >= (1 << 14))
  for (int64_t n = 0; n < N; ++n) {
    const T* l = logits + n * E;
    std::vector<double> full(static_cast<size_t>(E)), choice(static_cast<size_t>(E)), raw(static_cast<size_t>(K));
    // What selection ranks: the scores (or, post-softmax, the logits) plus the bias, which steers
    // selection only and never enters the weights.
    if (o.sigmoid)
      for (int64_t e = 0; e < E; ++e) full[static_cast<size_t>(e)] = sigmoid(static_cast<double>(l[e]));
    else if (o.pre_softmax)
      softmax_row(full.data(), l, E);
    else
      for (int64_t e = 0; e < E; ++e) full[static_cast<size_t>(e)] = static_cast<double>(l[e]);
    for (int64_t e = 0; e < E; ++e)
      choice[static_cast<size_t>(e)] = full[static_cast<size_t>(e)] + (bias ? static_cast<double>(bias[e]) : 0.0);
    if (G > 1) {
      // DeepSeek-V3: a group scores the sum of its top-2 experts; experts outside the best
      // topk_groups groups cannot be selected.
      std::vector<double> group_score(static_cast<size_t>(G));
      std::vector<int32_t> best;
      for (int64_t g = 0; g < G; ++g) {
        std::vector<double> members(choice.begin() + g * per_group, choice.begin() + (g + 1) * per_group);
        top_indices(best, members, std::min<int64_t>(2, per_group));
        double s = 0.0;
        for (int32_t b : best) s += members[static_cast<size_t>(b)];
        group_score[static_cast<size_t>(g)] = s;
      }
      top_indices(best, group_score, o.topk_groups);
      std::vector<bool> eligible(static_cast<size_t>(G), false);
      for (int32_t g : best) eligible[static_cast<size_t>(g)] = true;
      for (int64_t e = 0; e < E; ++e)
        if (!eligible[static_cast<size_t>(e / per_group)])
          choice[static_cast<size_t>(e)] = -std::numeric_limits<double>::infinity();
    }
    std::vector<int32_t> top;
    top_indices(top, choice, K);
    std::copy(top.begin(), top.end(), indices + n * K);
    selected_raw(raw.data(), l, indices + n * K, o, full.data());
    double sum = kNormEps;
    for (double r : raw) sum += r;
    for (int64_t k = 0; k < K; ++k) {
      const double p = o.norm_topk_prob ? raw[static_cast<size_t>(k)] / sum : raw[static_cast<size_t>(k)];
      probs[n * K + k] = static_cast<T>(p * o.scaling);
    }
  }
}

template <typename T>
void moe_route_backward(T* dlogits, const T* dprobs, const T* logits, const int32_t* indices, int64_t N,
                        const RouterOptions& o) {
  const int64_t E = o.experts, K = o.topk;
#pragma omp parallel for schedule(static) if (N * E >= (1 << 14))
  for (int64_t n = 0; n < N; ++n) {
    const T* l = logits + n * E;
    const int32_t* idx = indices + n * K;
    T* dl = dlogits + n * E;
    std::vector<double> full(static_cast<size_t>(E)), raw(static_cast<size_t>(K)), draw(static_cast<size_t>(K));
    selected_raw(raw.data(), l, idx, o, full.data());
    double sum = kNormEps;
    for (double r : raw) sum += r;
    // Through the scaling and the optional normalisation q_k = raw_k / (sum raw + eps).
    double dot = 0.0;
    for (int64_t k = 0; k < K; ++k) dot += static_cast<double>(dprobs[n * K + k]) * o.scaling * raw[static_cast<size_t>(k)];
    for (int64_t k = 0; k < K; ++k) {
      const double dq = static_cast<double>(dprobs[n * K + k]) * o.scaling;
      draw[static_cast<size_t>(k)] = o.norm_topk_prob ? dq / sum - dot / (sum * sum) : dq;
    }
    std::fill(dl, dl + E, T(0));
    if (o.sigmoid) {
      for (int64_t k = 0; k < K; ++k) {
        const double s = raw[static_cast<size_t>(k)];
        dl[idx[k]] = static_cast<T>(draw[static_cast<size_t>(k)] * s * (1.0 - s));
      }
    } else if (o.pre_softmax) {
      // d softmax: dl_e = s_e (ds_e - sum_j ds_j s_j), ds nonzero on the selected experts only.
      double sds = 0.0;
      for (int64_t k = 0; k < K; ++k) sds += draw[static_cast<size_t>(k)] * full[static_cast<size_t>(idx[k])];
      for (int64_t e = 0; e < E; ++e) dl[e] = static_cast<T>(-full[static_cast<size_t>(e)] * sds);
      for (int64_t k = 0; k < K; ++k)
        dl[idx[k]] = static_cast<T>(static_cast<double>(dl[idx[k]]) + full[static_cast<size_t>(idx[k])] * draw[static_cast<size_t>(k)]);
    } else {
      double sds = 0.0;
      for (int64_t k = 0; k < K; ++k) sds += draw[static_cast<size_t>(k)] * raw[static_cast<size_t>(k)];
      for (int64_t k = 0; k < K; ++k)
        dl[idx[k]] = static_cast<T>(raw[static_cast<size_t>(k)] * (draw[static_cast<size_t>(k)] - sds));
    }
  }
}

template <typename T>
void moe_balance_scores(T* scores, const T* logits, int64_t N, int64_t E, bool sigmoid_scores) {
#pragma omp parallel for schedule(static) if (N * E >= (1 << 14))
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> s(static_cast<size_t>(E));
    if (sigmoid_scores) {
      double sum = kNormEps;
      for (int64_t e = 0; e < E; ++e) sum += s[static_cast<size_t>(e)] = sigmoid(static_cast<double>(logits[n * E + e]));
      for (double& v : s) v /= sum;
    } else {
      softmax_row(s.data(), logits + n * E, E);
    }
    for (int64_t e = 0; e < E; ++e) scores[n * E + e] = static_cast<T>(s[static_cast<size_t>(e)]);
  }
}

template <typename T>
void moe_balance_scores_backward(T* dlogits, const T* dscores, const T* logits, int64_t N, int64_t E,
                                 bool sigmoid_scores) {
#pragma omp parallel for schedule(static) if (N * E >= (1 << 14))
  for (int64_t n = 0; n < N; ++n) {
    const T* ds = dscores + n * E;
    T* dl = dlogits + n * E;
    std::vector<double> s(static_cast<size_t>(E));
    if (sigmoid_scores) {
      // q_e = s_e / S: dq/ds_j = (delta_ej - q_e) / S; then ds/dl = s (1 - s).
      double sum = kNormEps;
      for (int64_t e = 0; e < E; ++e) sum += s[static_cast<size_t>(e)] = sigmoid(static_cast<double>(logits[n * E + e]));
      double dot = 0.0;
      for (int64_t e = 0; e < E; ++e) dot += static_cast<double>(ds[e]) * s[static_cast<size_t>(e)] / sum;
      for (int64_t e = 0; e < E; ++e) {
        const double sv = s[static_cast<size_t>(e)];
        dl[e] = static_cast<T>(static_cast<double>(dl[e]) + (static_cast<double>(ds[e]) - dot) / sum * sv * (1.0 - sv));
      }
    } else {
      softmax_row(s.data(), logits + n * E, E);
      double dot = 0.0;
      for (int64_t e = 0; e < E; ++e) dot += static_cast<double>(ds[e]) * s[static_cast<size_t>(e)];
      for (int64_t e = 0; e < E; ++e)
        dl[e] = static_cast<T>(static_cast<double>(dl[e]) + s[static_cast<size_t>(e)] * (static_cast<double>(ds[e]) - dot));
    }
  }
}

template <typename T>
double moe_balance_loss(T* dscores, const T* scores, const int32_t* indices, int64_t N, int64_t E, int64_t K,
                        int64_t group_rows, double coeff, double grad_scale) {
  const int64_t groups = N / group_rows;
  const double c = coeff * static_cast<double>(E) /
                   (static_cast<double>(K) * static_cast<double>(group_rows) * static_cast<double>(group_rows) *
                    static_cast<double>(groups));
  double loss = 0.0;
  std::vector<double> count(static_cast<size_t>(E)), score_sum(static_cast<size_t>(E));
  for (int64_t g = 0; g < groups; ++g) {
    std::fill(count.begin(), count.end(), 0.0);
    std::fill(score_sum.begin(), score_sum.end(), 0.0);
    for (int64_t n = g * group_rows; n < (g + 1) * group_rows; ++n) {
      for (int64_t k = 0; k < K; ++k) count[static_cast<size_t>(indices[n * K + k])] += 1.0;
      for (int64_t e = 0; e < E; ++e) score_sum[static_cast<size_t>(e)] += static_cast<double>(scores[n * E + e]);
    }
    for (int64_t e = 0; e < E; ++e) loss += c * count[static_cast<size_t>(e)] * score_sum[static_cast<size_t>(e)];
    for (int64_t n = g * group_rows; n < (g + 1) * group_rows; ++n)
      for (int64_t e = 0; e < E; ++e) dscores[n * E + e] = static_cast<T>(grad_scale * c * count[static_cast<size_t>(e)]);
  }
  return loss;
}

template <typename T>
double moe_z_loss(T* dlogits, const T* logits, int64_t N, int64_t E, double coeff, double grad_scale) {
  double loss = 0.0;
  for (int64_t n = 0; n < N; ++n) {
    const T* l = logits + n * E;
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t e = 0; e < E; ++e) mx = std::max(mx, static_cast<double>(l[e]));
    double sum = 0.0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(l[e]) - mx);
    const double lse = mx + std::log(sum);
    loss += lse * lse;
    if (!dlogits) continue;
    // d lse^2 / dl_e = 2 lse softmax_e.
    const double g = grad_scale * coeff * 2.0 * lse / static_cast<double>(N);
    for (int64_t e = 0; e < E; ++e)
      dlogits[n * E + e] = static_cast<T>(static_cast<double>(dlogits[n * E + e]) +
                                          g * std::exp(static_cast<double>(l[e]) - mx) / sum);
  }
  return coeff * loss / static_cast<double>(N);
}

template <typename T>
void moe_permute(T* out, const T* x, const int32_t* pos, int64_t N, int64_t K, int64_t C) {
#pragma omp parallel for schedule(static) if (N * K * C >= (1 << 16))
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      if (const int32_t p = pos[n * K + k]; p >= 0) std::copy(x + n * C, x + (n + 1) * C, out + p * C);
}

namespace {

// Runs row(n, acc) for every n in [0, N) over threads, each with its own zeroed compute_t<T>
// accumulator of C elements (bf16 and fp16 rows are summed in f32, and stored once).
template <typename T, typename Row>
void rows_with_accumulator(int64_t N, int64_t K, int64_t C, Row row) {
#pragma omp parallel if (N * K * C >= (1 << 16))
  {
    std::vector<compute_t<T>> acc(static_cast<size_t>(C));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      std::fill(acc.begin(), acc.end(), compute_t<T>(0));
      row(n, acc.data());
    }
  }
}

}  // namespace

template <typename T>
void moe_permute_backward(T* dx, const T* dout, const int32_t* pos, int64_t N, int64_t K, int64_t C) {
  rows_with_accumulator<T>(N, K, C, [&](int64_t n, compute_t<T>* acc) {
    for (int64_t k = 0; k < K; ++k)
      if (const int32_t p = pos[n * K + k]; p >= 0)
        for (int64_t c = 0; c < C; ++c) acc[c] += load(dout[p * C + c]);
    for (int64_t c = 0; c < C; ++c) dx[n * C + c] = store<T>(acc[c]);
  });
}

template <typename T>
void moe_unpermute(T* y, const T* rows, const int32_t* pos, const T* probs, int64_t N, int64_t K, int64_t C) {
  rows_with_accumulator<T>(N, K, C, [&](int64_t n, compute_t<T>* acc) {
    for (int64_t k = 0; k < K; ++k)
      if (const int32_t p = pos[n * K + k]; p >= 0) {
        const compute_t<T> w = load(probs[n * K + k]);
        for (int64_t c = 0; c < C; ++c) acc[c] += w * load(rows[p * C + c]);
      }
    for (int64_t c = 0; c < C; ++c) y[n * C + c] = store<T>(acc[c]);
  });
}

template <typename T>
void moe_unpermute_backward(T* drows, T* dprobs, const T* dy, const T* rows, const int32_t* pos, const T* probs,
                            int64_t N, int64_t K, int64_t C) {
  using S = compute_t<T>;
#pragma omp parallel for schedule(static) if (N * K * C >= (1 << 16))
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const int32_t p = pos[n * K + k];
      if (p < 0) {
        dprobs[n * K + k] = store<T>(S(0));
        continue;
      }
      const S w = load(probs[n * K + k]);
      S dot = 0;
      for (int64_t c = 0; c < C; ++c) {
        drows[p * C + c] = store<T>(w * load(dy[n * C + c]));
        dot += load(dy[n * C + c]) * load(rows[p * C + c]);
      }
      dprobs[n * K + k] = store<T>(dot);
    }
}

#define MEGATON_MOE_INSTANTIATE(T)                                                                                \
  template void moe_route<T>(int32_t*, T*, const T*, const T*, int64_t, const RouterOptions&);                    \
  template void moe_route_backward<T>(T*, const T*, const T*, const int32_t*, int64_t, const RouterOptions&);     \
  template void moe_balance_scores<T>(T*, const T*, int64_t, int64_t, bool);                                      \
  template void moe_balance_scores_backward<T>(T*, const T*, const T*, int64_t, int64_t, bool);                   \
  template double moe_balance_loss<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t, int64_t, double,  \
                                      double);                                                                    \
  template double moe_z_loss<T>(T*, const T*, int64_t, int64_t, double, double);                                  \
  template void moe_permute<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t);                          \
  template void moe_permute_backward<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t);                 \
  template void moe_unpermute<T>(T*, const T*, const int32_t*, const T*, int64_t, int64_t, int64_t);              \
  template void moe_unpermute_backward<T>(T*, T*, const T*, const T*, const int32_t*, const T*, int64_t, int64_t, \
                                          int64_t);
MEGATON_MOE_INSTANTIATE(float)
MEGATON_MOE_INSTANTIATE(double)
#undef MEGATON_MOE_INSTANTIATE
// The permutations also move bf16 and fp16 activations (summing in f32); routing stays f32 / f64.
#define MEGATON_MOE_PERMUTE_INSTANTIATE(T)                                                                        \
  template void moe_permute<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t);                          \
  template void moe_permute_backward<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t);                 \
  template void moe_unpermute<T>(T*, const T*, const int32_t*, const T*, int64_t, int64_t, int64_t);              \
  template void moe_unpermute_backward<T>(T*, T*, const T*, const T*, const int32_t*, const T*, int64_t, int64_t, \
                                          int64_t);
MEGATON_MOE_PERMUTE_INSTANTIATE(BFloat16)
MEGATON_MOE_PERMUTE_INSTANTIATE(Float16)
#undef MEGATON_MOE_PERMUTE_INSTANTIATE

}  // namespace megaton::kernels::cpu
