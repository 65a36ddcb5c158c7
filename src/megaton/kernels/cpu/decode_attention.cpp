#include "megaton/kernels/cpu/decode_attention.h"

#include <algorithm>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "megaton/kernels/cpu/gemv_dot.h"
#include "megaton/kernels/cpu/online_softmax.h"
#include "megaton/kernels/cpu/prefetch.h"

namespace megaton::kernels::cpu {
namespace {

// Keys per block: one block of scores per query head of a group (R x 64) stays in L1 while its
// values are accumulated.
constexpr int64_t kBlock = 64;

// Keys (and values) are read kv_row apart, one token's head at a time: each is asked for this many
// tokens before it is read (cpu/prefetch.h; a page's last tokens ask past it, harmlessly). 8 gave
// int8 decode of the 110M shape over 500 tokens 137-140 -> 155-158 tokens/s.
constexpr int64_t kAheadTokens = 8;

// Where token t0's key and value of one kv group are, and how many tokens follow it contiguously
// (kv_row apart): the whole rest of a contiguous cache, or the rest of t0's page. KV: the cache's
// element type (T, or bf16 / E4M3 under f32 math: each element widened as it is read); E4M3 keys
// and values come with scales, scale_row apart per token: one for the group's whole head
// (scale_cols 0), or one per scale_cols columns (MLA's latent: c and k_rope apart).
template <typename KV>
struct KeyRun {
  const KV* k;
  const KV* v;
  int64_t run;
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  int64_t scale_row = 0;
  int64_t scale_cols = 0;
};

template <typename KV>
constexpr bool kScaled = std::is_same_v<KV, Float8E4M3>;

template <typename T, typename KV>
T dot_of(const T* q, const KV* k, int64_t n) {
  T dot = 0;
#pragma omp simd reduction(+ : dot)
  for (int64_t d = 0; d < n; ++d) dot += q[d] * gemv_detail::load(k[d]);
  return dot;
}

// acc[d] += p * v[d] over n columns.
template <typename T, typename KV>
void add_scaled(T* acc, T p, const KV* v, int64_t n) {
#pragma omp simd
  for (int64_t d = 0; d < n; ++d) acc[d] += p * gemv_detail::load(v[d]);
}

// One (batch row, kv group): the R = Hq / Hkv query heads of the group against its Tk keys, found
// by at(t0) -> KeyRun. A block never crosses a run, so pages of a multiple of kBlock tokens give
// the contiguous cache's blocks, and its sums, exactly. s [R, kBlock], acc [R, D.v], m and l [R] are
// the caller's scratch.
template <typename T, typename KV, typename At>
void group_attention(T* out, const T* q, At at, int64_t R, HeadDim D, int64_t kv_row, T scale, int64_t Tk, T* s, T* acc,
                     T* m, T* l) {
  constexpr auto kSize = static_cast<int64_t>(sizeof(KV));
  std::fill(acc, acc + R * D.v, T(0));
  std::fill(m, m + R, -std::numeric_limits<T>::infinity());
  std::fill(l, l + R, T(0));
  for (int64_t t0 = 0, n = 0; t0 < Tk; t0 += n) {
    const KeyRun<KV> r = at(t0);
    n = std::min({kBlock, Tk - t0, r.run});
    for (int64_t j = 0; j < n; ++j) {
      const KV* kj = r.k + j * kv_row;
      prefetch_lines(kj, kAheadTokens * kv_row * kSize, D.qk * kSize);
      const float* ks = nullptr;  // the key's column-block scales
      T key_scale = scale;
      if constexpr (kScaled<KV>) {
        if (r.scale_cols == 0)
          key_scale *= r.k_scale[j * r.scale_row];
        else
          ks = r.k_scale + j * r.scale_row;
      }
      for (int64_t i = 0; i < R; ++i) {
        const T* qi = q + i * D.qk;
        T dot = 0;
        if (ks) {
          for (int64_t c = 0, b = 0; c < D.qk; c += r.scale_cols, ++b)
            dot += dot_of(qi + c, kj + c, r.scale_cols) * static_cast<T>(ks[b]);
        } else {
          dot = dot_of(qi, kj, D.qk);
        }
        s[i * kBlock + j] = dot * key_scale;
      }
    }
    online_softmax_step(s, kBlock, n, m, l, acc, R, D.v);
    for (int64_t j = 0; j < n; ++j) {
      const KV* vj = r.v + j * kv_row;
      prefetch_lines(vj, kAheadTokens * kv_row * kSize, D.v * kSize);
      const float* vs = nullptr;
      T value_scale = 1;
      if constexpr (kScaled<KV>) {
        if (r.scale_cols == 0)
          value_scale = r.v_scale[j * r.scale_row];
        else
          vs = r.v_scale + j * r.scale_row;
      }
      for (int64_t i = 0; i < R; ++i) {
        const T p = s[i * kBlock + j] * value_scale;
        T* ai = acc + i * D.v;
        if (vs) {
          for (int64_t c = 0, b = 0; c < D.v; c += r.scale_cols, ++b)
            add_scaled(ai + c, p * static_cast<T>(vs[b]), vj + c, std::min(r.scale_cols, D.v - c));
        } else {
          add_scaled(ai, p, vj, D.v);
        }
      }
    }
  }
  for (int64_t i = 0; i < R; ++i) {
    const T inv = T(1) / l[i];
#pragma omp simd
    for (int64_t d = 0; d < D.v; ++d) out[i * D.v + d] = acc[i * D.v + d] * inv;
  }
}

// Every (query row, kv group) spread over threads, each with its own scratch: keys(b, g) gives the
// group's KeyRun accessor and how many tokens the last of batch row b's Tq queries attends over;
// query t sees Tq - 1 - t tokens fewer (causal).
template <typename T, typename KV, typename Keys>
void attend_groups(T* out, const T* q, int64_t B, int64_t Tq, int64_t Hq, int64_t Hkv, HeadDim D, HeadStrides q_at,
                   int64_t kv_row, double scale, Keys keys) {
  const int64_t R = Hq / Hkv;
#pragma omp parallel
  {
    std::vector<T> s(static_cast<size_t>(R * kBlock)), acc(static_cast<size_t>(R * D.v)), m(R), l(R);
#pragma omp for collapse(2) schedule(static)
    for (int64_t row = 0; row < B * Tq; ++row)
      for (int64_t g = 0; g < Hkv; ++g) {
        const auto group = keys(row / Tq, g);  // no structured binding: clang 14 refuses them in OpenMP regions
        const int64_t Tk = group.second - (Tq - 1 - row % Tq);
        group_attention<T, KV>(out + (row * Hq + g * R) * D.v, q + row * q_at.row + g * q_at.group, group.first, R, D,
                               kv_row, static_cast<T>(scale), Tk, s.data(), acc.data(), m.data(), l.data());
      }
  }
}

}  // namespace

template <typename T, typename KV>
void decode_attention(T* out, const T* q, const KV* k, const KV* v, int64_t B, int64_t Tq, int64_t Hq, int64_t Hkv,
                      HeadDim D, HeadStrides q_at, HeadStrides kv_at, double scale, int64_t Tk,
                      int64_t kv_batch_stride) {
  attend_groups<T, KV>(out, q, B, Tq, Hq, Hkv, D, q_at, kv_at.row, scale, [=](int64_t b, int64_t g) {
    const int64_t kv = b * kv_batch_stride + g * kv_at.group;
    const auto at = [=](int64_t t0) { return KeyRun<KV>{k + kv + t0 * kv_at.row, v + kv + t0 * kv_at.row, Tk - t0}; };
    return std::pair{at, Tk};
  });
}

template <typename T, typename KV>
void paged_decode_attention(T* out, const T* q, const KV* k_pages, const KV* v_pages, int64_t B, int64_t Tq, int64_t Hq,
                            int64_t Hkv, HeadDim D, HeadStrides q_at, HeadStrides kv_at, double scale,
                            const int32_t* pages, int64_t max_pages, const int64_t* lens, int64_t page_size,
                            const float* k_scale, const float* v_scale, int64_t scale_blocks) {
  const int64_t scale_cols = scale_blocks > 1 ? D.qk / scale_blocks : 0;
  attend_groups<T, KV>(out, q, B, Tq, Hq, Hkv, D, q_at, kv_at.row, scale, [=](int64_t b, int64_t g) {
    const int32_t* table = pages + b * max_pages;
    const auto at = [=](int64_t t0) {
      const int64_t slot = table[t0 / page_size] * page_size + t0 % page_size;
      const int64_t token = slot * kv_at.row + g * kv_at.group, scale_at = (slot * Hkv + g) * scale_blocks;
      return KeyRun<KV>{k_pages + token,
                        v_pages + token,
                        page_size - t0 % page_size,
                        k_scale ? k_scale + scale_at : nullptr,
                        v_scale ? v_scale + scale_at : nullptr,
                        Hkv * scale_blocks,
                        scale_cols};
    };
    return std::pair{at, lens[b]};
  });
}

#define MEGATON_DECODE(T, KV)                                                                                   \
  template void decode_attention<T, KV>(T*, const T*, const KV*, const KV*, int64_t, int64_t, int64_t, int64_t, \
                                        HeadDim, HeadStrides, HeadStrides, double, int64_t, int64_t);
MEGATON_DECODE(float, float)
MEGATON_DECODE(double, double)
MEGATON_DECODE(float, BFloat16)
#undef MEGATON_DECODE
#define MEGATON_PAGED_DECODE(T, KV)                                                                                   \
  template void paged_decode_attention<T, KV>(T*, const T*, const KV*, const KV*, int64_t, int64_t, int64_t, int64_t, \
                                              HeadDim, HeadStrides, HeadStrides, double, const int32_t*, int64_t,     \
                                              const int64_t*, int64_t, const float*, const float*, int64_t);
MEGATON_PAGED_DECODE(float, float)
MEGATON_PAGED_DECODE(double, double)
MEGATON_PAGED_DECODE(float, BFloat16)
MEGATON_PAGED_DECODE(float, Float8E4M3)
#undef MEGATON_PAGED_DECODE

}  // namespace megaton::kernels::cpu
