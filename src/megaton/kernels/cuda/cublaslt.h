// What every cuBLASLt caller here shares: the status check, one handle and GEMM workspace per
// device (created on first use, kept for the process), RAII for a matmul's descriptors, and the
// cudaDataType of a tensor.
#pragma once
#include <cublasLt.h>

#include <string_view>

#include "megaton/core/error.h"
#include "megaton/core/tensor.h"

// cuBLASLt calls report a status, not a cudaError_t.
#define MEGATON_CUBLAS_CHECK(call)                                                                     \
  do {                                                                                                 \
    const cublasStatus_t megaton_cublas_status_ = (call);                                              \
    if (megaton_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                               \
      ::megaton::fail(#call, " failed with cuBLAS status ", static_cast<int>(megaton_cublas_status_), " (", \
                      __FILE__, ":", __LINE__, ")");                                                   \
  } while (0)

namespace megaton::kernels::cuda {

struct LtState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = size_t{32} << 20;  // what cuBLASLt's heuristics want for Hopper GEMMs
  float* scales = nullptr;                    // FP8 block scales re-laid for one GEMM
  size_t scale_floats = 0;
};
// The device's handle and workspace; also makes `device` current.
LtState& lt_state(int device);
// lt.scales with room for `floats`. It only grows: a cudaMalloc (which synchronises) happens once per
// new high-water mark, not per GEMM. Like the workspace it assumes one stream per device.
float* scale_scratch(LtState& lt, size_t floats);

struct MatmulDesc {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  MatmulDesc() = default;
  MatmulDesc(const MatmulDesc&) = delete;
  MatmulDesc& operator=(const MatmulDesc&) = delete;
  ~MatmulDesc();
  template <typename V>
  void set(cublasLtMatmulDescAttributes_t attribute, const V& value) {
    MEGATON_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof value));
  }
};

// f32, bf16, or the FP8 formats; throws naming the op and the tensor otherwise.
cudaDataType_t cuda_type(const Tensor& t, std::string_view op);

}  // namespace megaton::kernels::cuda
