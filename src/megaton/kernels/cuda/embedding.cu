#include "megaton/kernels/cuda/elementwise.cuh"
#include "megaton/kernels/cuda/embedding.h"

namespace megaton::kernels::cuda {

namespace {

constexpr int kThreads = 256;
// Vocabulary partitions of the backward: thread (c, p) owns column c of every token with
// token % kPartitions == p. More partitions, more parallelism; each still scans all token ids.
constexpr int kPartitions = 32;

// out[row, c] = wte[tokens[row], c] (+ wpe[row % T, c]), summed in fp32. One thread per element.
template <typename T, typename W>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const W* wte, const W* wpe, int64_t rows,
                                         int64_t Tlen, int64_t C) {
  const int64_t n = rows * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / C, c = i - row * C;
    float v = detail::load(wte, static_cast<int64_t>(tokens[row]) * C + c);
    if (wpe) v += detail::load(wpe, (row % Tlen) * C + c);
    detail::store(out, i, v);
  }
}

// Thread (c = blockIdx.x * blockDim.x + threadIdx.x, p = blockIdx.y) walks every row in order and
// adds the rows whose token falls in partition p into dwte[token, c]. A (token, c) element has one
// owner, so there are no races and the summation order is the row order: deterministic.
template <typename T>
__global__ void embedding_backward_wte_kernel(float* dwte, const T* dout, const int32_t* tokens, int64_t rows,
                                              int64_t C) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= C) return;
  const int32_t p = static_cast<int32_t>(blockIdx.y);
  for (int64_t row = 0; row < rows; ++row) {
    const int32_t tok = tokens[row];  // the same for the whole warp: no divergence
    if (tok % kPartitions != p) continue;
    float* dst = dwte + static_cast<int64_t>(tok) * C + c;
    *dst += detail::load(dout, row * C + c);
  }
}

// dwpe[t, c] += sum over b of dout[b*T + t, c], b in order. One thread per (t, c).
template <typename T>
__global__ void embedding_backward_wpe_kernel(float* dwpe, const T* dout, int64_t B, int64_t Tlen, int64_t C) {
  const int64_t n = Tlen * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / C, c = i - t * C;
    float acc = dwpe[i];
    for (int64_t b = 0; b < B; ++b) acc += detail::load(dout, (b * Tlen + t) * C + c);
    dwpe[i] = acc;
  }
}

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

}  // namespace

void embedding_forward(const ExecContext& ctx, const Tensor& out, const Tensor& tokens, const Tensor& wte,
                       const Tensor& wpe, int64_t B, int64_t T, int64_t C) {
  constexpr std::string_view op = "embedding_forward";
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  if (wpe.defined()) expect_dtype(wte.dtype(), op, {&wpe});
  const int64_t rows = B * T;
  if (rows * C == 0) return;
  detail::dispatch_io(op, out, {}, [&]<typename TO>(TO) {
    detail::dispatch_io(op, wte, {}, [&]<typename W>(W) {
      embedding_forward_kernel<<<blocks_for(rows * C), kThreads, 0, detail::stream_of(ctx)>>>(
          static_cast<TO*>(out.raw()), static_cast<const int32_t*>(tokens.raw()), static_cast<const W*>(wte.raw()),
          static_cast<const W*>(wpe.defined() ? wpe.raw() : nullptr), rows, T, C);
    });
  });
  MEGATON_CUDA_LAUNCH_CHECK();
}

void embedding_backward(const ExecContext& ctx, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                        const Tensor& tokens, int64_t B, int64_t T, int64_t C) {
  constexpr std::string_view op = "embedding_backward";
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  expect_dtype(DType::F32, op, {&dwte});
  if (dwpe.defined()) expect_dtype(DType::F32, op, {&dwpe});
  const int64_t rows = B * T;
  if (rows * C == 0) return;
  detail::dispatch_io(op, dout, {}, [&]<typename TO>(TO) {
    const dim3 grid(static_cast<unsigned>((C + kThreads - 1) / kThreads), kPartitions);
    embedding_backward_wte_kernel<<<grid, kThreads, 0, detail::stream_of(ctx)>>>(
        static_cast<float*>(dwte.raw()), static_cast<const TO*>(dout.raw()), static_cast<const int32_t*>(tokens.raw()),
        rows, C);
    MEGATON_CUDA_LAUNCH_CHECK();
    if (dwpe.defined()) {
      embedding_backward_wpe_kernel<<<blocks_for(T * C), kThreads, 0, detail::stream_of(ctx)>>>(
          static_cast<float*>(dwpe.raw()), static_cast<const TO*>(dout.raw()), B, T, C);
      MEGATON_CUDA_LAUNCH_CHECK();
    }
  });
}

}  // namespace megaton::kernels::cuda
