// The CPU GEMM under every linear layer: one row-major product, run by OpenBLAS or oneDNN. f64 and
// f32 operands multiply in their own precision; bf16 and fp16 operands accumulate in fp32 and write
// an f32 result or one of their own type.
#pragma once
#include <cstdint>
#include <optional>

#include "megaton/core/dtype.h"

namespace megaton::kernels::cpu {

// One operand as stored, row-major; `transposed` means op(X) = X^T (A stored [K, M], B stored [N, K]).
struct GemmOperand {
  const void* data;
  bool transposed;
};

// C[M, N] = op(A)[M, K] op(B)[K, N] + bias (a row of N added to every row; null for none), written
// over C, or added to an f32 / f64 C with `accumulate` (bias and accumulate are never used together).
struct Gemm {
  int64_t M, N, K;
  DType in;  // A and B: f32, f64, bf16 or f16
  GemmOperand a, b;
  void* c;
  DType c_dtype;  // f32 or f64 as `in`; f32 or `in` for bf16 / f16 `in`
  bool accumulate = false;
  const void* bias = nullptr;
  DType bias_dtype = DType::F32;  // f32 or `in`
};

void gemm(const Gemm& g);

enum class GemmLibrary { OpenBlas, OneDnn };
const char* gemm_library_name(GemmLibrary lib);

// The library that runs GEMMs on `in` operands. f64: OpenBLAS (oneDNN has no f64 matmul). f32:
// OpenBLAS, unless forced (measured on an AVX2 Zen 3: oneDNN's f32 matmul within a few percent of
// OpenBLAS's sgemm per shape, docs/performance.md, so one library serves f32 and f64 alike). bf16:
// oneDNN when the CPU multiplies bf16 natively (avx512_bf16 or amx_bf16) and oneDNN has the matmul;
// otherwise OpenBLAS on operands converted to f32 (still fp32 accumulation). On an AVX2-only CPU
// oneDNN 2.6 has no bf16 matmul at all; on AVX-512 CPUs without bf16 instructions it emulates bf16,
// which has not been measured against the f32 fallback, so the fallback is kept there. f16: always
// the f32 fallback (oneDNN's f16 matmul needs AVX512-FP16 / AMX-FP16, not on the machines seen).
GemmLibrary gemm_library(DType in);
// Forces one library for f32 and bf16 GEMMs (tests, `megaton bench --cpu-gemm`); nullopt restores
// the rule above. Not synchronised with GEMMs in flight: set it between them.
void force_gemm_library(std::optional<GemmLibrary> lib);

}  // namespace megaton::kernels::cpu
