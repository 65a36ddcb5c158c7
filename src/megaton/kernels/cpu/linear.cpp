#include "megaton/kernels/cpu/linear.h"

#include <omp.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "megaton/kernels/cpu/column_slice.h"
#include "megaton/kernels/cpu/element.h"
#include "megaton/kernels/cpu/gemm.h"
#include "megaton/kernels/cpu/gemv.h"
#include "megaton/kernels/decode_rows.h"

namespace megaton::kernels::cpu {

// dbias[c] += sum_n dout[n, c]. Threads split the columns, and every column is summed over the rows
// in order by one thread, so the result is bitwise independent of the thread count. Each thread
// streams its slice of every row with the inner loop vectorised over columns, summing in G.
template <typename T, typename G>
void bias_backward(G* dbias, const T* dout, int64_t N, int64_t C) {
#pragma omp parallel
  {
    // No structured bindings: clang 14 cannot use them inside OpenMP regions.
    const std::pair<int64_t, int64_t> slice = column_slice(C, omp_get_num_threads(), omp_get_thread_num());
    const int64_t c0 = slice.first, c1 = slice.second;
    if (c0 < c1) {
      std::vector<G> acc(c1 - c0);
      for (int64_t n = 0; n < N; ++n) {
        const T* row = dout + n * C;
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) acc[c - c0] += load(row[c]);
      }
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) dbias[c] += acc[c - c0];
    }
  }
}

template <typename T, typename B>
void linear_forward(T* out, const T* x, const T* w, const B* bias, int64_t N, int64_t in_f, int64_t out_f) {
  // A few rows (decode, speculative verification) are a stream over W: a GEMM would first pack all
  // of W for them (f32 and bf16 weights; fp16 decode keeps the GEMM for now).
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, BFloat16>)
    if (N <= kDecodeRows) return gemv(out, x, w, bias, N, in_f, out_f);
  gemm({.M = N, .N = out_f, .K = in_f, .in = dtype_of<T>(), .a = {x, false}, .b = {w, true}, .c = out,
        .c_dtype = dtype_of<T>(), .bias = bias, .bias_dtype = dtype_of<B>()});
}

template <typename T>
void linear_backward_input(T* dx, const T* dout, const T* w, int64_t N, int64_t in_f, int64_t out_f) {
  gemm({.M = N, .N = in_f, .K = out_f, .in = dtype_of<T>(), .a = {dout, false}, .b = {w, false}, .c = dx,
        .c_dtype = dtype_of<T>()});
}

template <typename T, typename G>
void linear_backward_weight(G* dw, G* dbias, const T* dout, const T* x, int64_t N, int64_t in_f, int64_t out_f) {
  gemm({.M = out_f, .N = in_f, .K = N, .in = dtype_of<T>(), .a = {dout, true}, .b = {x, false}, .c = dw,
        .c_dtype = dtype_of<G>(), .accumulate = true});
  if (dbias) bias_backward(dbias, dout, N, out_f);
}

template void linear_forward<float, float>(float*, const float*, const float*, const float*, int64_t, int64_t,
                                           int64_t);
template void linear_forward<double, double>(double*, const double*, const double*, const double*, int64_t, int64_t,
                                             int64_t);
template void linear_forward<BFloat16, BFloat16>(BFloat16*, const BFloat16*, const BFloat16*, const BFloat16*,
                                                 int64_t, int64_t, int64_t);
template void linear_forward<BFloat16, float>(BFloat16*, const BFloat16*, const BFloat16*, const float*, int64_t,
                                              int64_t, int64_t);
template void linear_backward_input<float>(float*, const float*, const float*, int64_t, int64_t, int64_t);
template void linear_backward_input<double>(double*, const double*, const double*, int64_t, int64_t, int64_t);
template void linear_backward_input<BFloat16>(BFloat16*, const BFloat16*, const BFloat16*, int64_t, int64_t, int64_t);
template void linear_backward_weight<float, float>(float*, float*, const float*, const float*, int64_t, int64_t,
                                                   int64_t);
template void linear_backward_weight<double, double>(double*, double*, const double*, const double*, int64_t, int64_t,
                                                     int64_t);
template void linear_backward_weight<BFloat16, float>(float*, float*, const BFloat16*, const BFloat16*, int64_t,
                                                      int64_t, int64_t);
template void bias_backward<float, float>(float*, const float*, int64_t, int64_t);
template void bias_backward<double, double>(double*, const double*, int64_t, int64_t);
template void bias_backward<BFloat16, float>(float*, const BFloat16*, int64_t, int64_t);
template void linear_forward<Float16, Float16>(Float16*, const Float16*, const Float16*, const Float16*, int64_t,
                                               int64_t, int64_t);
template void linear_forward<Float16, float>(Float16*, const Float16*, const Float16*, const float*, int64_t, int64_t,
                                             int64_t);
template void linear_backward_input<Float16>(Float16*, const Float16*, const Float16*, int64_t, int64_t, int64_t);
template void linear_backward_weight<Float16, float>(float*, float*, const Float16*, const Float16*, int64_t, int64_t,
                                                     int64_t);
template void bias_backward<Float16, float>(float*, const Float16*, int64_t, int64_t);

}  // namespace megaton::kernels::cpu
