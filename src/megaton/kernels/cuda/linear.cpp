#include "megaton/kernels/cuda/linear.h"

#include <cuda_runtime.h>

#include "megaton/core/cuda/cuda_check.h"
#include "megaton/kernels/cuda/cublaslt.h"

namespace megaton::kernels::cuda {

namespace {

// The linear layer's GEMMs take f32 or bf16 (FP8 GEMMs go through kernels/cuda/fp8_gemm.h).
cudaDataType_t linear_type(const Tensor& t, std::string_view op) {
  MEGATON_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::BF16, "kernel ", op, " on cuda: tensor '", t.name(),
                "' holds ", dtype_name(t.dtype()), ", expected f32 or bf16");
  return cuda_type(t, op);
}

// Column-major D[m, n] = op(A)[m, k] op(B)[k, n] + beta * D, fp32 accumulation, optional bias
// epilogue (a vector of length m added to every column). Row-major callers pass transposed roles.
void gemm(const ExecContext& ctx, std::string_view op, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          const Tensor& A, int64_t lda, const Tensor& B, int64_t ldb, float beta, const Tensor& D, int64_t ldd,
          const Tensor* bias) {
  LtState& lt = lt_state(ctx.device.index);
  MatmulDesc md;
  MEGATON_CUBLAS_CHECK(cublasLtMatmulDescCreate(&md.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  md.set(CUBLASLT_MATMUL_DESC_TRANSA, ta);
  md.set(CUBLASLT_MATMUL_DESC_TRANSB, tb);
  if (bias && bias->defined()) {
    md.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
    md.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias->raw());
    md.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, linear_type(*bias, op));
  }
  const auto rows_a = static_cast<uint64_t>(trans_a ? k : m), cols_a = static_cast<uint64_t>(trans_a ? m : k);
  const auto rows_b = static_cast<uint64_t>(trans_b ? n : k), cols_b = static_cast<uint64_t>(trans_b ? k : n);
  MEGATON_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&md.a, linear_type(A, op), rows_a, cols_a, lda));
  MEGATON_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&md.b, linear_type(B, op), rows_b, cols_b, ldb));
  MEGATON_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&md.c, linear_type(D, op), static_cast<uint64_t>(m),
                                                  static_cast<uint64_t>(n), ldd));
  const float alpha = 1.0f;
  // No algorithm given: cuBLASLt picks one by its heuristics for this shape and workspace.
  MEGATON_CUBLAS_CHECK(cublasLtMatmul(lt.handle, md.desc, &alpha, A.raw(), md.a, B.raw(), md.b, &beta, D.raw(), md.c,
                                      D.raw(), md.c, nullptr, lt.workspace, lt.workspace_bytes,
                                      static_cast<cudaStream_t>(ctx.stream)));
}

void expect_same_dtype(std::string_view op, const Tensor& like, std::initializer_list<const Tensor*> tensors) {
  (void)linear_type(like, op);
  expect_dtype(like.dtype(), op, tensors);
}

}  // namespace

// Row-major y[rows, out] = x[rows, in] w^T is column-major y^T[out, rows] = w[out, in] x^T, with w
// (row-major [out, in] = column-major [in, out]) transposed.
void linear_forward(const ExecContext& ctx, const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias,
                    int64_t rows, int64_t in, int64_t out_f) {
  expect_same_dtype("linear_forward", w, {&x, &out});
  if (bias.defined()) expect_same_dtype("linear_forward", w, {&bias});
  gemm(ctx, "linear_forward", true, false, out_f, rows, in, w, in, x, in, 0.0f, out, out_f, &bias);
}

// dx^T[in, rows] = w^T[in, out] dy^T[out, rows]: w as stored (column-major [in, out]), no transposes.
void linear_backward_input(const ExecContext& ctx, const Tensor& dx, const Tensor& dout, const Tensor& w,
                           int64_t rows, int64_t in, int64_t out_f) {
  expect_same_dtype("linear_backward_input", w, {&dout, &dx});
  gemm(ctx, "linear_backward_input", false, false, in, rows, out_f, w, in, dout, out_f, 0.0f, dx, in, nullptr);
}

// dw^T[in, out] += x^T[in, rows] dy[rows, out]: x as stored, dy (column-major [out, rows]) transposed.
void linear_backward_weight(const ExecContext& ctx, const Tensor& dw, const Tensor& dbias, const Tensor& dout,
                            const Tensor& x, int64_t rows, int64_t in, int64_t out_f) {
  expect_same_dtype("linear_backward_weight", x, {&dout});
  (void)linear_type(dw, "linear_backward_weight");
  gemm(ctx, "linear_backward_weight", false, true, in, out_f, rows, x, in, dout, out_f, 1.0f, dw, in, nullptr);
  if (dbias.defined()) bias_grad(ctx, dbias, dout, rows, out_f);
}

}  // namespace megaton::kernels::cuda
