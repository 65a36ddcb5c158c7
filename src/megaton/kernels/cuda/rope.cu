#include "megaton/kernels/cuda/rope.h"

#include "megaton/kernels/cuda/elementwise.cuh"

namespace megaton::kernels::cuda {

namespace {

constexpr int kThreads = 256;

// One thread per rotated pair: (token, group, head, i) with i < D / 2, as the CPU's rotate_head.
template <RopeLayout L>
__global__ void rope_kernel(float* x, const float* cos, const float* sin, int64_t tokens, int64_t Tlen, int64_t groups,
                            int64_t H, int64_t D, HeadStrides at, int64_t pos_offset, float sign) {
  const int64_t half = D / 2, pairs = tokens * groups * H * half;
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < pairs; p += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = p % half, head = p / half % H, g = p / half / H % groups, token = p / half / H / groups;
    float* h = x + token * at.row + g * at.group + head * D;
    const int64_t row = (pos_offset + token % Tlen) * half;
    const int64_t i0 = L == RopeLayout::Half ? i : 2 * i, i1 = L == RopeLayout::Half ? i + half : 2 * i + 1;
    const float a = h[i0], b = h[i1], c = cos[row + i], s = sign * sin[row + i];
    h[i0] = a * c - b * s;
    h[i1] = b * c + a * s;
  }
}

}  // namespace

void rope_apply(const ExecContext& ctx, const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t B, int64_t Tlen,
                int64_t groups, int64_t H, int64_t D, HeadStrides at, int64_t pos_offset, RopeLayout layout,
                bool inverse) {
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  if (x.dtype() != DType::F32)
    fail("kernel rope_apply on cuda: tensor '", x.name(), "' holds ", dtype_name(x.dtype()), ", expected f32");
  const int64_t pairs = B * Tlen * groups * H * (D / 2);
  if (pairs == 0) return;
  const int64_t blocks = (pairs + kThreads - 1) / kThreads;
  const auto grid = static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
  const auto launch = [&](auto kernel) {
    kernel<<<grid, kThreads, 0, detail::stream_of(ctx)>>>(
        static_cast<float*>(x.raw()), static_cast<const float*>(cos.raw()), static_cast<const float*>(sin.raw()),
        B * Tlen, Tlen, groups, H, D, at, pos_offset, inverse ? -1.0f : 1.0f);
  };
  if (layout == RopeLayout::Half)
    launch(rope_kernel<RopeLayout::Half>);
  else
    launch(rope_kernel<RopeLayout::Interleaved>);
  MEGATON_CUDA_LAUNCH_CHECK();
}

}  // namespace megaton::kernels::cuda
