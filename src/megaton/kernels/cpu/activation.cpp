#include "megaton/kernels/cpu/activation.h"

#include "megaton/kernels/cpu/element.h"
#include "megaton/kernels/cpu/fast_exp.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <numbers>
#include <type_traits>

namespace megaton::kernels::cpu {

namespace {

using detail::exp_saturating;

template <typename T>
T sigmoid(T x) {
  return T(1) / (T(1) + exp_saturating(-x));
}

constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;

// 0.5 (1 + tanh(u)) == sigmoid(2u), so gelu(x) = x * sigmoid(2u): one exp instead of a tanh, and the
// same sigmoid serves the derivative.
template <typename T>
T gelu_gate(T x) {
  const T u = T(kGeluScale) * (x + T(kGeluCubic) * x * x * x);
  return sigmoid(T(2) * u);
}

}  // namespace

// Every kernel loads its T elements into C = compute_t<T> (fp32 for bf16), computes there and stores T.
template <typename T>
void gelu_forward(T* __restrict out, const T* __restrict x, int64_t n) {
  using C = compute_t<T>;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const C v = load(x[i]);
    out[i] = store<T>(v * gelu_gate(v));
  }
}

template <typename T>
void gelu_backward(T* __restrict dx, const T* __restrict dout, const T* __restrict x, int64_t n) {
  using C = compute_t<T>;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const C v = load(x[i]);
    const C s = gelu_gate(v);
    // d/dx [x s(2u)] = s + x s (1 - s) 2 du/dx, du/dx = scale (1 + 3 cubic x^2).
    const C du = C(kGeluScale) * (C(1) + C(3 * kGeluCubic) * v * v);
    dx[i] = store<T>(load(dout[i]) * (s + v * s * (C(1) - s) * C(2) * du));
  }
}

template <typename T>
void swiglu_forward(T* __restrict out, const T* __restrict gu, int64_t N, int64_t H) {
  using C = compute_t<T>;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    const T* gate = gu + r * 2 * H;
    const T* up = gate + H;
    T* o = out + r * H;
#pragma omp simd
    for (int64_t h = 0; h < H; ++h) {
      const C g = load(gate[h]);
      o[h] = store<T>(g * sigmoid(g) * load(up[h]));
    }
  }
}

template <typename T>
void swiglu_backward(T* __restrict dgu, const T* __restrict dout, const T* __restrict gu, int64_t N, int64_t H) {
  using C = compute_t<T>;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    const T* gate = gu + r * 2 * H;
    const T* up = gate + H;
    const T* d = dout + r * H;
    T* dgate = dgu + r * 2 * H;
    T* dup = dgate + H;
#pragma omp simd
    for (int64_t h = 0; h < H; ++h) {
      const C g = load(gate[h]), u = load(up[h]), dy = load(d[h]);
      const C s = sigmoid(g);
      const C silu = g * s;
      // silu'(g) = s (1 + g (1 - s))
      dgate[h] = store<T>(dy * u * s * (C(1) + g * (C(1) - s)));
      dup[h] = store<T>(dy * silu);
    }
  }
}

// No __restrict: out may alias a or b. Each index is still read before it is written, so the
// simd loop is safe.
template <typename T>
void residual_forward(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = store<T>(load(a[i]) + load(b[i]));
}

#define MEGATON_INSTANTIATE(T)                                                \
  template void gelu_forward<T>(T*, const T*, int64_t);                       \
  template void gelu_backward<T>(T*, const T*, const T*, int64_t);            \
  template void swiglu_forward<T>(T*, const T*, int64_t, int64_t);            \
  template void swiglu_backward<T>(T*, const T*, const T*, int64_t, int64_t); \
  template void residual_forward<T>(T*, const T*, const T*, int64_t);
MEGATON_INSTANTIATE(float)
MEGATON_INSTANTIATE(double)
MEGATON_INSTANTIATE(BFloat16)
MEGATON_INSTANTIATE(Float16)
#undef MEGATON_INSTANTIATE

}  // namespace megaton::kernels::cpu
