#include "megaton/kernels/cuda/elementwise.cuh"
#include "megaton/kernels/cuda/linear.h"

namespace megaton::kernels::cuda {

namespace {

constexpr int kColThreads = 256;

// One thread per column sums over every row in order: deterministic and independent of the grid.
template <typename T>
__global__ void column_sum_kernel(float* dbias, const T* dout, int64_t N, int64_t C) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= C) return;
  float acc = 0.0f;
  for (int64_t n = 0; n < N; ++n) acc += detail::load(dout + n * C, c);
  dbias[c] += acc;
}

}  // namespace

void bias_grad(const ExecContext& ctx, const Tensor& dbias, const Tensor& dout, int64_t rows, int64_t C) {
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  expect_dtype(DType::F32, "linear_backward_weight (bias)", {&dbias});
  if (C == 0) return;
  detail::dispatch_io("linear_backward_weight (bias)", dout, {}, [&]<typename T>(T) {
    column_sum_kernel<<<static_cast<unsigned>((C + kColThreads - 1) / kColThreads), kColThreads, 0,
                        detail::stream_of(ctx)>>>(static_cast<float*>(dbias.raw()), static_cast<const T*>(dout.raw()),
                                                  rows, C);
  });
  MEGATON_CUDA_LAUNCH_CHECK();
}

}  // namespace megaton::kernels::cuda
