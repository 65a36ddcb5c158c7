#include "megaton/kernels/cpu/linear.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <vector>

namespace megaton::kernels::cpu {
namespace {

// Row-major GEMM, C = alpha op(A) op(B) + beta C, dispatched on the element type.
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, const double* A, int64_t lda,
          const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, 1.0, A, lda, B, ldb, beta, C, ldc);
}

// dbias[c] += sum_n dout[n, c]. Threads split the columns, and every column is summed over the rows
// in order by one thread, so the result is bitwise independent of the thread count. Each thread
// streams its slice of every row with the inner loop vectorised over columns.
template <typename T>
void bias_grad(T* dbias, const T* dout, int64_t N, int64_t C) {
  constexpr int64_t kAlign = 16;  // column slices start on 64-byte boundaries for float
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), tid = omp_get_thread_num();
    const int64_t per = (C + nt * kAlign - 1) / (nt * kAlign) * kAlign;
    const int64_t c0 = std::min(C, tid * per), c1 = std::min(C, c0 + per);
    if (c0 < c1) {
      std::vector<T> acc(c1 - c0);
      for (int64_t n = 0; n < N; ++n) {
        const T* row = dout + n * C;
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) acc[c - c0] += row[c];
      }
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) dbias[c] += acc[c - c0];
    }
  }
}

}  // namespace

template <typename T>
void linear_forward(T* out, const T* x, const T* w, const T* bias, int64_t N, int64_t in_f, int64_t out_f) {
  // Seed out with the bias and let the GEMM accumulate onto it (beta = 1): the bias then costs one
  // write pass instead of a read-modify-write pass after the GEMM.
  if (bias) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) std::copy(bias, bias + out_f, out + n * out_f);
  }
  gemm(CblasNoTrans, CblasTrans, N, out_f, in_f, x, in_f, w, in_f, bias ? T(1) : T(0), out, out_f);
}

template <typename T>
void linear_backward_input(T* dx, const T* dout, const T* w, int64_t N, int64_t in_f, int64_t out_f) {
  gemm(CblasNoTrans, CblasNoTrans, N, in_f, out_f, dout, out_f, w, in_f, T(0), dx, in_f);
}

template <typename T>
void linear_backward_weight(T* dw, T* dbias, const T* dout, const T* x, int64_t N, int64_t in_f, int64_t out_f) {
  gemm(CblasTrans, CblasNoTrans, out_f, in_f, N, dout, out_f, x, in_f, T(1), dw, in_f);
  if (dbias) bias_grad(dbias, dout, N, out_f);
}

template void linear_forward<float>(float*, const float*, const float*, const float*, int64_t, int64_t, int64_t);
template void linear_forward<double>(double*, const double*, const double*, const double*, int64_t, int64_t, int64_t);
template void linear_backward_input<float>(float*, const float*, const float*, int64_t, int64_t, int64_t);
template void linear_backward_input<double>(double*, const double*, const double*, int64_t, int64_t, int64_t);
template void linear_backward_weight<float>(float*, float*, const float*, const float*, int64_t, int64_t, int64_t);
template void linear_backward_weight<double>(double*, double*, const double*, const double*, int64_t, int64_t, int64_t);

}  // namespace megaton::kernels::cpu
