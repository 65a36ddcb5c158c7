#include "megaton/kernels/cpu/activation.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <numbers>
#include <type_traits>
#include <utility>
#include <vector>

#include "megaton/kernels/cpu/column_slice.h"
#include "megaton/kernels/cpu/element.h"
#include "megaton/kernels/cpu/fast_exp.h"
#include "megaton/kernels/cpu/parallel_min.h"

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

// d/dx [x s(2u)] = s + x s (1 - s) 2 du/dx, du/dx = scale (1 + 3 cubic x^2).
template <typename T>
T gelu_derivative(T x) {
  const T s = gelu_gate(x);
  const T du = T(kGeluScale) * (T(1) + T(3 * kGeluCubic) * x * x);
  return s + x * s * (T(1) - s) * T(2) * du;
}

// SwiGLU's two input gradients for out = silu(g) u: d/dg = dy u silu'(g), silu'(g) = s (1 + g (1 - s));
// d/du = dy silu(g).
template <typename T>
std::pair<T, T> swiglu_gradients(T g, T u, T dy) {
  const T s = sigmoid(g);
  return {dy * u * s * (T(1) + g * (T(1) - s)), dy * g * s};
}

// Runs row(c0, c1) for this thread's columns of every row: threads split the columns (column_slice)
// so that each bias gradient element is summed over the rows in order by one thread, as
// bias_backward sums it, whatever the thread count.
template <typename Body>
void on_column_slices(int64_t C, Body body) {
#pragma omp parallel
  {
    // No structured bindings: clang 14 cannot use them inside OpenMP regions.
    const std::pair<int64_t, int64_t> slice = column_slice(C, omp_get_num_threads(), omp_get_thread_num());
    const int64_t c0 = slice.first, c1 = slice.second;
    if (c0 < c1) body(c0, c1);
  }
}

// The activation of rows [r0, r1) x columns [c0, c1) of fc1's output h (F output columns; h has F
// columns, or 2F as SwiGLU's [gate | up]), + fc1's deferred bias with kBias, written as TO to
// out (row stride ldo; out points at element (r0, c0)). Every forward form runs this one loop: the kernels
// that store T, and the FP8 producer that hands f32 values straight to the quantiser.
template <bool kSwiglu, bool kBias, typename TO, typename T>
void activation_rows(TO* __restrict out, int64_t ldo, const T* __restrict h, const compute_t<T>* __restrict bias,
                     int64_t F, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  using C = compute_t<T>;
  const int64_t ldh = kSwiglu ? 2 * F : F;
  for (int64_t r = r0; r < r1; ++r) {
    const T* x = h + r * ldh;
    TO* o = out + (r - r0) * ldo;
#pragma omp simd
    for (int64_t c = c0; c < c1; ++c) {
      if constexpr (kSwiglu) {
        C g = load(x[c]), u = load(x[F + c]);
        if constexpr (kBias) g += bias[c], u += bias[F + c];
        o[c - c0] = store<TO>(g * sigmoid(g) * u);
      } else {
        C v = load(x[c]);
        if constexpr (kBias) v += bias[c];
        o[c - c0] = store<TO>(v * gelu_gate(v));
      }
    }
  }
}

// activation_rows over every row, rows split over threads.
template <bool kSwiglu, bool kBias, typename T>
void activation_forward(T* out, const T* h, const compute_t<T>* bias, int64_t N, int64_t F) {
  parallel_for(N, N > 1 ? N * F : 0,
               [&](int64_t r) { activation_rows<kSwiglu, kBias>(out + r * F, F, h, bias, F, r, r + 1, 0, F); });
}

}  // namespace

// Every kernel loads its T elements into C = compute_t<T> (fp32 for bf16), computes there and stores T.
template <typename T>
void gelu_forward(T* __restrict out, const T* __restrict x, int64_t n) {
  // One row of n: split into column chunks over threads.
  constexpr int64_t kChunk = 4096;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < n; c0 += kChunk)
    activation_rows<false, false>(out + c0, 0, x, static_cast<const compute_t<T>*>(nullptr), n, 0, 1, c0,
                                  std::min(n, c0 + kChunk));
}

template <typename T>
void gelu_backward(T* __restrict dx, const T* __restrict dout, const T* __restrict x, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    dx[i] = store<T>(load(dout[i]) * gelu_derivative(load(x[i])));
  }
}

template <typename T>
void swiglu_forward(T* __restrict out, const T* __restrict gu, int64_t N, int64_t H) {
  activation_forward<true, false>(out, gu, static_cast<const compute_t<T>*>(nullptr), N, H);
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
      const auto g = swiglu_gradients(load(gate[h]), load(up[h]), load(d[h]));
      dgate[h] = store<T>(g.first);
      dup[h] = store<T>(g.second);
    }
  }
}

template <typename T>
void bias_gelu_forward(T* __restrict out, const T* __restrict h, const compute_t<T>* __restrict bias, int64_t N,
                       int64_t F) {
  activation_forward<false, true>(out, h, bias, N, F);
}

// Adds a row's stored gradients [f0, f1) into acc (indexed from f0): a second loop over the row
// segment the first one just wrote, read from L1, so that both loops vectorise (one loop doing both,
// with the bf16 store in between, does not) and the memory traffic stays one pass.
template <typename T, typename C>
void add_row_segment(C* __restrict acc, const T* __restrict row, int64_t f0, int64_t f1) {
#pragma omp simd
  for (int64_t f = f0; f < f1; ++f) acc[f - f0] += load(row[f]);
}

template <typename T>
void bias_gelu_backward(T* __restrict dh, compute_t<T>* __restrict dbias, const T* __restrict dout,
                        const T* __restrict h, const compute_t<T>* __restrict bias, int64_t N, int64_t F) {
  using C = compute_t<T>;
  on_column_slices(F, [&](int64_t f0, int64_t f1) {
    std::vector<C> acc(f1 - f0);
    for (int64_t n = 0; n < N; ++n) {
      const T* __restrict x = h + n * F;
      const T* __restrict d = dout + n * F;
      T* __restrict dx = dh + n * F;
#pragma omp simd
      for (int64_t f = f0; f < f1; ++f) dx[f] = store<T>(load(d[f]) * gelu_derivative(C(load(x[f]) + bias[f])));
      add_row_segment(acc.data(), dx, f0, f1);  // the stored gradient, as bias_backward reads it
    }
    for (int64_t f = f0; f < f1; ++f) dbias[f] += acc[f - f0];
  });
}

template <typename T>
void bias_swiglu_forward(T* __restrict out, const T* __restrict gu, const compute_t<T>* __restrict bias, int64_t N,
                         int64_t H) {
  activation_forward<true, true>(out, gu, bias, N, H);
}

template <typename T>
void bias_swiglu_backward(T* __restrict dgu, compute_t<T>* __restrict dbias, const T* __restrict dout,
                          const T* __restrict gu, const compute_t<T>* __restrict bias, int64_t N, int64_t H) {
  using C = compute_t<T>;
  on_column_slices(H, [&](int64_t h0, int64_t h1) {
    std::vector<C> acc_gate(h1 - h0), acc_up(h1 - h0);
    for (int64_t r = 0; r < N; ++r) {
      const T* __restrict gate = gu + r * 2 * H;
      const T* __restrict up = gate + H;
      const T* __restrict d = dout + r * H;
      T* __restrict dgate = dgu + r * 2 * H;
      T* __restrict dup = dgate + H;
#pragma omp simd
      for (int64_t h = h0; h < h1; ++h) {
        const std::pair<C, C> g = swiglu_gradients(C(load(gate[h]) + bias[h]), C(load(up[h]) + bias[H + h]), load(d[h]));
        dgate[h] = store<T>(g.first);
        dup[h] = store<T>(g.second);
      }
      add_row_segment(acc_gate.data(), dgate, h0, h1);
      add_row_segment(acc_up.data(), dup, h0, h1);
    }
    for (int64_t h = h0; h < h1; ++h) {
      dbias[h] += acc_gate[h - h0];
      dbias[H + h] += acc_up[h - h0];
    }
  });
}

template <typename T>
void activation_block_f32(float* out, int64_t ld, const T* h, const compute_t<T>* bias, bool swiglu, int64_t F,
                          int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  if (swiglu)
    bias ? activation_rows<true, true>(out, ld, h, bias, F, r0, r1, c0, c1)
         : activation_rows<true, false>(out, ld, h, bias, F, r0, r1, c0, c1);
  else
    bias ? activation_rows<false, true>(out, ld, h, bias, F, r0, r1, c0, c1)
         : activation_rows<false, false>(out, ld, h, bias, F, r0, r1, c0, c1);
}

// No __restrict: out may alias a or b. Each index is still read before it is written, so the
// simd loop is safe.
template <typename T>
void residual_forward(T* out, const T* a, const T* b, int64_t n) {
  constexpr int64_t kChunk = 4096;
  parallel_for((n + kChunk - 1) / kChunk, n, [&](int64_t k) {
    const int64_t end = std::min(n, (k + 1) * kChunk);
#pragma omp simd
    for (int64_t i = k * kChunk; i < end; ++i) out[i] = store<T>(load(a[i]) + load(b[i]));
  });
}

#define MEGATON_INSTANTIATE(T)                                                \
  template void gelu_forward<T>(T*, const T*, int64_t);                       \
  template void gelu_backward<T>(T*, const T*, const T*, int64_t);            \
  template void swiglu_forward<T>(T*, const T*, int64_t, int64_t);            \
  template void swiglu_backward<T>(T*, const T*, const T*, int64_t, int64_t); \
  template void residual_forward<T>(T*, const T*, const T*, int64_t);                                           \
  template void bias_gelu_forward<T>(T*, const T*, const compute_t<T>*, int64_t, int64_t);                      \
  template void bias_gelu_backward<T>(T*, compute_t<T>*, const T*, const T*, const compute_t<T>*, int64_t, int64_t); \
  template void bias_swiglu_forward<T>(T*, const T*, const compute_t<T>*, int64_t, int64_t);                    \
  template void bias_swiglu_backward<T>(T*, compute_t<T>*, const T*, const T*, const compute_t<T>*, int64_t, int64_t);
MEGATON_INSTANTIATE(float)
MEGATON_INSTANTIATE(double)
MEGATON_INSTANTIATE(BFloat16)
MEGATON_INSTANTIATE(Float16)
#undef MEGATON_INSTANTIATE
template void activation_block_f32<float>(float*, int64_t, const float*, const float*, bool, int64_t, int64_t, int64_t,
                                          int64_t, int64_t);
template void activation_block_f32<BFloat16>(float*, int64_t, const BFloat16*, const float*, bool, int64_t, int64_t,
                                             int64_t, int64_t, int64_t);

}  // namespace megaton::kernels::cpu
