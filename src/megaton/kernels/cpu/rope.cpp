#include "megaton/kernels/cpu/rope.h"

#include <cmath>

#include "megaton/core/error.h"
#include "megaton/kernels/cpu/element.h"
#include "megaton/kernels/cpu/parallel_min.h"

namespace megaton::kernels::cpu {

namespace {

// Rotate the D/2 pairs of one head by the angles whose cos/sin are given. Half pairs i with
// i + D/2 (HF rotate_half), Interleaved pairs 2i with 2i + 1; the layout is a template argument so
// the index arithmetic is constant and the loop vectorises. sign = -1 rotates backwards.
// A bf16 x is rotated in fp32 and rounded once (compute_t, element.h).
template <RopeLayout L, typename T, typename C = compute_t<T>>
void rotate_head(T* __restrict x, const C* __restrict cos, const C* __restrict sin, int64_t half, C sign) {
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    const int64_t i0 = L == RopeLayout::Half ? i : 2 * i;
    const int64_t i1 = L == RopeLayout::Half ? i + half : 2 * i + 1;
    const C a = load(x[i0]);
    const C b = load(x[i1]);
    const C s = sign * sin[i];
    x[i0] = store<T>(a * cos[i] - b * s);
    x[i1] = store<T>(b * cos[i] + a * s);
  }
}

template <RopeLayout L, typename T, typename C = compute_t<T>>
void rotate_tokens(T* x, const C* cos, const C* sin, int64_t B, int64_t Tlen, int64_t groups, int64_t H, int64_t D,
                   HeadStrides at, int64_t pos_offset, C sign) {
  const int64_t half = D / 2;
  parallel_for(B * Tlen, B * Tlen * groups * H * D, [&](int64_t bt) {
    T* token = x + bt * at.row;
    const int64_t row = (pos_offset + bt % Tlen) * half;
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t h = 0; h < H; ++h) rotate_head<L>(token + g * at.group + h * D, cos + row, sin + row, half, sign);
  });
}

}  // namespace

// Angles are formed and evaluated in double: pos * inv_freq reaches ~1e5 rad at long contexts,
// where a float angle would already be off by ~1e-2.
template <typename T>
void rope_tables(T* cos, T* sin, int64_t Tlen, int64_t D, const std::vector<double>& inv_freq, double magnitude) {
  const int64_t half = D / 2;
  MEGATON_CHECK(static_cast<int64_t>(inv_freq.size()) == half, "rope inv_freq has ", inv_freq.size(),
                " entries, head_dim ", D, " needs ", half);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < Tlen; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(t) * inv_freq[static_cast<size_t>(i)];
      cos[t * half + i] = static_cast<T>(magnitude * std::cos(angle));
      sin[t * half + i] = static_cast<T>(magnitude * std::sin(angle));
    }
  }
}

template <typename T>
void rope_apply(T* x, const compute_t<T>* cos, const compute_t<T>* sin, int64_t B, int64_t Tlen, int64_t groups,
                int64_t H, int64_t D, HeadStrides at, int64_t pos_offset, RopeLayout layout, bool inverse) {
  const compute_t<T> sign = inverse ? -1 : 1;
  if (layout == RopeLayout::Half)
    rotate_tokens<RopeLayout::Half>(x, cos, sin, B, Tlen, groups, H, D, at, pos_offset, sign);
  else
    rotate_tokens<RopeLayout::Interleaved>(x, cos, sin, B, Tlen, groups, H, D, at, pos_offset, sign);
}

#define MEGATON_INSTANTIATE(T)                                                                                  \
  template void rope_apply<T>(T*, const compute_t<T>*, const compute_t<T>*, int64_t, int64_t, int64_t, int64_t, \
                              int64_t, HeadStrides, int64_t, RopeLayout, bool);
MEGATON_INSTANTIATE(float)
MEGATON_INSTANTIATE(double)
MEGATON_INSTANTIATE(BFloat16)
#undef MEGATON_INSTANTIATE
template void rope_tables<float>(float*, float*, int64_t, int64_t, const std::vector<double>&, double);
template void rope_tables<double>(double*, double*, int64_t, int64_t, const std::vector<double>&, double);

}  // namespace megaton::kernels::cpu
