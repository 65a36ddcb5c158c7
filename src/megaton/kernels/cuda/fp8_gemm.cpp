#include "megaton/kernels/cuda/fp8_gemm.h"

#include <cstdint>

#include "megaton/core/cuda/cuda_check.h"
#include "megaton/kernels/cuda/cublaslt.h"
#include "megaton/kernels/cuda/fp8_scale_layout.h"
#include "megaton/kernels/fp8_gemm_cublas.h"

namespace megaton::kernels::cuda {

namespace {

cublasLtMatmulMatrixScale_t scale_mode(Fp8Granularity g) {
  switch (g) {
    case Fp8Granularity::Tile1x128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case Fp8Granularity::Block128x128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    default: return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  }
}

}  // namespace

void fp8_gemm(const ExecContext& ctx, const Tensor& out, const Fp8Matrix& a, const Fp8Matrix& b, bool accumulate,
              const Tensor& bias) {
  const std::string why = cublas_fp8_unsupported(a, b, out.dtype(), bias);
  MEGATON_CHECK(why.empty(), "fp8_gemm of '", a.data.name(), "' x '", b.data.name(), "' on ", ctx.device.str(), ": ",
                why);
  const int64_t M = a.data.size(0), N = b.data.size(0), K = a.data.size(1);
  LtState& lt = lt_state(ctx.device.index);
  const auto stream = static_cast<cudaStream_t>(ctx.stream);

  // Scales: per-tensor scale_inv as it is; block scales re-laid for cuBLASLt into the scratch.
  const void* scale_a = a.scale_inv.raw();
  const void* scale_b = b.scale_inv.raw();
  const bool blocks = a.granularity != Fp8Granularity::Tensor;
  if (blocks) {
    const CublasScaleLayout la = cublas_scale_layout(a), lb = cublas_scale_layout(b);
    const auto na = static_cast<size_t>(la.outer * la.inner), nb = static_cast<size_t>(lb.outer * lb.inner);
    float* scratch = scale_scratch(lt, na + nb + 4);
    float* sb = scratch + (na + 3) / 4 * 4;  // 16-byte aligned
    relayout_scales(scratch, a, la, stream);
    relayout_scales(sb, b, lb, stream);
    scale_a = scratch;
    scale_b = sb;
  }

  MatmulDesc md;
  MEGATON_CUBLAS_CHECK(cublasLtMatmulDescCreate(&md.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  md.set(CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  md.set(CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  md.set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t{0});
  // cuBLASLt's A is our b, its B our a (see fp8_gemm_cublas.h).
  md.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, scale_b);
  md.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, scale_a);
  if (blocks) {
    md.set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, static_cast<int32_t>(scale_mode(b.granularity)));
    md.set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, static_cast<int32_t>(scale_mode(a.granularity)));
  }
  if (bias.defined()) {
    md.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
    md.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias.raw());
    md.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, CUDA_R_16BF);
  }
  const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  MEGATON_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&md.a, cuda_type(b.data, "fp8_gemm"), u(K), u(N), K));
  MEGATON_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&md.b, cuda_type(a.data, "fp8_gemm"), u(K), u(M), K));
  MEGATON_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&md.c, cuda_type(out, "fp8_gemm"), u(N), u(M), N));
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  MEGATON_CUBLAS_CHECK(cublasLtMatmul(lt.handle, md.desc, &alpha, b.data.raw(), md.a, a.data.raw(), md.b, &beta,
                                      out.raw(), md.c, out.raw(), md.c, nullptr, lt.workspace, lt.workspace_bytes,
                                      stream));
}

}  // namespace megaton::kernels::cuda
