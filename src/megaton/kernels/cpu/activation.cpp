#include "megaton/kernels/cpu/activation.h"

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

template <typename T>
void gelu_forward(T* __restrict out, const T* __restrict x, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * gelu_gate(x[i]);
}

template <typename T>
void gelu_backward(T* __restrict dx, const T* __restrict dout, const T* __restrict x, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    const T s = gelu_gate(v);
    // d/dx [x s(2u)] = s + x s (1 - s) 2 du/dx, du/dx = scale (1 + 3 cubic x^2).
    const T du = T(kGeluScale) * (T(1) + T(3 * kGeluCubic) * v * v);
    dx[i] = dout[i] * (s + v * s * (T(1) - s) * T(2) * du);
  }
}

template <typename T>
void swiglu_forward(T* __restrict out, const T* __restrict gu, int64_t N, int64_t H) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    const T* gate = gu + r * 2 * H;
    const T* up = gate + H;
    T* o = out + r * H;
#pragma omp simd
    for (int64_t h = 0; h < H; ++h) o[h] = gate[h] * sigmoid(gate[h]) * up[h];
  }
}

template <typename T>
void swiglu_backward(T* __restrict dgu, const T* __restrict dout, const T* __restrict gu, int64_t N, int64_t H) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    const T* gate = gu + r * 2 * H;
    const T* up = gate + H;
    const T* d = dout + r * H;
    T* dgate = dgu + r * 2 * H;
    T* dup = dgate + H;
#pragma omp simd
    for (int64_t h = 0; h < H; ++h) {
      const T s = sigmoid(gate[h]);
      const T silu = gate[h] * s;
      // silu'(g) = s (1 + g (1 - s))
      dgate[h] = d[h] * up[h] * s * (T(1) + gate[h] * (T(1) - s));
      dup[h] = d[h] * silu;
    }
  }
}

// No __restrict: out may alias a or b. Each index is still read before it is written, so the
// simd loop is safe.
template <typename T>
void residual_forward(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

#define MEGATON_INSTANTIATE(T)                                                \
  template void gelu_forward<T>(T*, const T*, int64_t);                       \
  template void gelu_backward<T>(T*, const T*, const T*, int64_t);            \
  template void swiglu_forward<T>(T*, const T*, int64_t, int64_t);            \
  template void swiglu_backward<T>(T*, const T*, const T*, int64_t, int64_t); \
  template void residual_forward<T>(T*, const T*, const T*, int64_t);
MEGATON_INSTANTIATE(float)
MEGATON_INSTANTIATE(double)
#undef MEGATON_INSTANTIATE

}  // namespace megaton::kernels::cpu
