// Matrix-vector products for decode: y[n, out] = W[out, in] x[n, in] (+ bias) for a few rows n. A
// decode step multiplies one token by every weight, so it is bound by reading W from memory: each
// weight row is streamed once (no packing, unlike a GEMM) and dotted with every x row while it sits
// in L1, weight rows are split over the threads, and every dot product is accumulated in fp32 in a
// fixed order, so y is independent of the thread count and each y row has the bits a one-row call
// gives it (what lets speculative verification reproduce plain decoding; kernels/decode_rows.h).
// Weights are f32 or bf16 (widened to fp32 in registers, never copied); x and y share one dtype
// (f32 or bf16), x is widened once. The bias B is f32 or T.
#pragma once
#include <cstdint>

#include "megaton/core/dtype.h"

namespace megaton::kernels::cpu {

// Which inner loop (cpu/gemv_dot.h): Simd is AVX2 + FMA (+ F16C) intrinsics (sixteen lanes wide on AVX-512), compiled
// where the build targets them
// (-march=native on an AVX2 machine, see MEGATON_NATIVE); Portable is plain C++ for any CPU.
// Best picks Simd when it was compiled in. Tests run both.
enum class GemvPath { Best, Simd, Portable };
bool gemv_simd_compiled();

template <typename T, typename W, typename B>
void gemv(T* y, const T* x, const W* w, const B* bias, int64_t rows, int64_t in_f, int64_t out_f,
          GemvPath path = GemvPath::Best);

}  // namespace megaton::kernels::cpu
