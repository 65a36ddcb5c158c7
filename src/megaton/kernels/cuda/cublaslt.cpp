#include "megaton/kernels/cuda/cublaslt.h"

#include <cuda_runtime.h>

#include <mutex>

#include "megaton/core/cuda/cuda_check.h"
#include "megaton/core/cuda/cuda_memory.h"

namespace megaton::kernels::cuda {

LtState& lt_state(int device) {
  static LtState states[kMaxCudaDevices];
  static std::once_flag once[kMaxCudaDevices];
  MEGATON_CUDA_CHECK(cudaSetDevice(device));
  std::call_once(once[device], [device] {
    MEGATON_CUBLAS_CHECK(cublasLtCreate(&states[device].handle));
    MEGATON_CUDA_CHECK(cudaMalloc(&states[device].workspace, states[device].workspace_bytes));
  });
  return states[device];
}

float* scale_scratch(LtState& lt, size_t floats) {
  if (floats > lt.scale_floats) {
    if (lt.scales) MEGATON_CUDA_CHECK(cudaFree(lt.scales));
    MEGATON_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&lt.scales), floats * sizeof(float)));
    lt.scale_floats = floats;
  }
  return lt.scales;
}

MatmulDesc::~MatmulDesc() {
  if (c) cublasLtMatrixLayoutDestroy(c);
  if (b) cublasLtMatrixLayoutDestroy(b);
  if (a) cublasLtMatrixLayoutDestroy(a);
  if (desc) cublasLtMatmulDescDestroy(desc);
}

cudaDataType_t cuda_type(const Tensor& t, std::string_view op) {
  switch (t.dtype()) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F8E4M3: return CUDA_R_8F_E4M3;
    case DType::F8E5M2: return CUDA_R_8F_E5M2;
    default:
      fail("kernel ", op, " on cuda: tensor '", t.name(), "' holds ", dtype_name(t.dtype()),
           ", expected f32, bf16 or an FP8 format");
  }
}

}  // namespace megaton::kernels::cuda
