#include "megaton/kernels/cpu/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <string_view>

#include "megaton/core/cpu_info.h"
#include "megaton/core/tensor.h"
#include "megaton/kernels/cpu/element.h"
#include "megaton/kernels/cpu/onednn_matmul.h"

namespace megaton::kernels::cpu {

namespace {

void blas(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}
void blas(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, const double* A, int64_t lda,
          const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, 1.0, A, lda, B, ldb, beta, C, ldc);
}

// g on OpenBLAS with operands, bias and result all of type T.
template <typename T>
void blas_gemm(const Gemm& g, const T* A, const T* B, const T* bias, T* C) {
  // Seed C with the bias and let the GEMM accumulate onto it (beta = 1): the bias then costs one
  // write pass instead of a read-modify-write pass after the GEMM.
  if (bias) {
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < g.M; ++m) std::copy(bias, bias + g.N, C + m * g.N);
  }
  blas(g.a.transposed ? CblasTrans : CblasNoTrans, g.b.transposed ? CblasTrans : CblasNoTrans, g.M, g.N, g.K, A,
       g.a.transposed ? g.M : g.K, B, g.b.transposed ? g.K : g.N, g.accumulate || bias ? T(1) : T(0), C, g.N);
}

template <typename H>
void half_to_f32(const H* src, float* dst, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = load(src[i]);
}

template <typename H>
void f32_to_half(const float* src, H* dst, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = store<H>(src[i]);
}

Tensor f32_workspace(int64_t n, const char* name) { return Tensor::empty({n}, DType::F32, MemCategory::Workspace, name); }

// An f32 copy of n elements of type `dtype` at p, or p itself when they are f32 already; `holder`
// keeps a converted copy alive.
const float* as_f32(const void* p, DType dtype, int64_t n, Tensor& holder) {
  if (dtype == DType::F32) return static_cast<const float*>(p);
  holder = f32_workspace(n, "gemm operand as f32");
  if (dtype == DType::BF16)
    half_to_f32(static_cast<const BFloat16*>(p), holder.data<float>(), n);
  else
    half_to_f32(static_cast<const Float16*>(p), holder.data<float>(), n);
  return holder.data<float>();
}

// The fallback for bf16 / fp16 operands without a native GEMM: convert them to f32 and run sgemm,
// so products and sums are fp32 as on the native paths; a 16-bit result is computed in an f32
// buffer and rounded once at the end. The copies are workspace memory, counted by the allocator.
void blas_gemm_half(const Gemm& g) {
  Tensor a_holder, b_holder, bias_holder, c_holder;
  const float* A = as_f32(g.a.data, g.in, g.M * g.K, a_holder);
  const float* B = as_f32(g.b.data, g.in, g.K * g.N, b_holder);
  const float* bias = g.bias ? as_f32(g.bias, g.bias_dtype, g.N, bias_holder) : nullptr;
  float* C = static_cast<float*>(g.c);
  if (g.c_dtype != DType::F32) {
    c_holder = f32_workspace(g.M * g.N, "gemm result as f32");
    C = c_holder.data<float>();
  }
  blas_gemm(g, A, B, bias, C);
  if (g.c_dtype == DType::BF16) f32_to_half(C, static_cast<BFloat16*>(g.c), g.M * g.N);
  if (g.c_dtype == DType::F16) f32_to_half(C, static_cast<Float16*>(g.c), g.M * g.N);
}

// -1 while no library is forced, otherwise the forced GemmLibrary.
std::atomic<int> forced{-1};

GemmLibrary bf16_rule() {
  const std::vector<std::string> features = cpu_info().features;
  const auto has = [&](std::string_view f) { return std::find(features.begin(), features.end(), f) != features.end(); };
  const bool native_bf16 = has("avx512_bf16") || has("amx_bf16");
  return native_bf16 && onednn_has_matmul(DType::BF16, DType::BF16) ? GemmLibrary::OneDnn : GemmLibrary::OpenBlas;
}

}  // namespace

const char* gemm_library_name(GemmLibrary lib) { return lib == GemmLibrary::OneDnn ? "onednn" : "openblas"; }

GemmLibrary gemm_library(DType in) {
  if (in == DType::F64 || in == DType::F16) return GemmLibrary::OpenBlas;
  if (const int f = forced.load(); f >= 0) return static_cast<GemmLibrary>(f);
  if (in == DType::F32) return GemmLibrary::OpenBlas;
  static const GemmLibrary bf16 = bf16_rule();  // reads /proc/cpuinfo and asks oneDNN: once
  return bf16;
}

void force_gemm_library(std::optional<GemmLibrary> lib) { forced = lib ? static_cast<int>(*lib) : -1; }

void gemm(const Gemm& g) {
  MEGATON_CHECK(!(g.bias && g.accumulate), "cpu::gemm: a bias with accumulate is not supported");
  MEGATON_CHECK(!(g.accumulate && (g.c_dtype == DType::BF16 || g.c_dtype == DType::F16)),
                "cpu::gemm: accumulates into f32 or f64 only");
  if (g.M == 0 || g.N == 0) return;
  if (gemm_library(g.in) == GemmLibrary::OneDnn) return onednn_matmul(g);
  switch (g.in) {
    case DType::F64:
      return blas_gemm(g, static_cast<const double*>(g.a.data), static_cast<const double*>(g.b.data),
                       static_cast<const double*>(g.bias), static_cast<double*>(g.c));
    case DType::F32:
      return blas_gemm(g, static_cast<const float*>(g.a.data), static_cast<const float*>(g.b.data),
                       static_cast<const float*>(g.bias), static_cast<float*>(g.c));
    case DType::BF16:
    case DType::F16: return blas_gemm_half(g);
    default: fail("cpu::gemm: operands of dtype ", dtype_name(g.in), " are not supported");
  }
}

}  // namespace megaton::kernels::cpu
