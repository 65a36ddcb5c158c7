#include <algorithm>
#include <vector>

#include "megaton/kernels/cuda/elementwise.cuh"
#include "megaton/kernels/cuda/reduce.h"

namespace megaton::kernels::cuda {

namespace {

constexpr int kThreads = 256;        // a power of two: the reduction tree halves it
constexpr int64_t kChunk = 1 << 14;  // elements per block: fixes the partition

int64_t num_chunks(int64_t n) { return (n + kChunk - 1) / kChunk; }

// The block's combination of every thread's v by `op`, over the same tree every time; valid in
// thread 0.
template <typename A, typename Op>
__device__ A block_reduce(A v, A* shared, Op op) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] = op(shared[threadIdx.x], shared[threadIdx.x + s]);
    __syncthreads();
  }
  return shared[0];
}

struct Add {
  template <typename A>
  __device__ A operator()(A a, A b) const {
    return a + b;
  }
};
struct Min {
  __device__ int64_t operator()(int64_t a, int64_t b) const { return a < b ? a : b; }
};

// partial[chunk] = sum of x over the chunk, in double.
template <typename T>
__global__ void sum_kernel(double* partial, const T* x, int64_t n) {
  __shared__ double shared[kThreads];
  const int64_t begin = blockIdx.x * kChunk, end = begin + kChunk < n ? begin + kChunk : n;
  double s = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) s += static_cast<double>(detail::load(x, i));
  const double total = block_reduce(s, shared, Add{});
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

__global__ void count_not_equal_kernel(int64_t* partial, const int32_t* ids, int64_t n, int32_t value) {
  __shared__ int64_t shared[kThreads];
  const int64_t begin = blockIdx.x * kChunk, end = begin + kChunk < n ? begin + kChunk : n;
  int64_t count = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) count += ids[i] != value;
  const int64_t total = block_reduce(count, shared, Add{});
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// partial[chunk] = the smallest offending index in the chunk, or n when there is none.
__global__ void first_out_of_range_kernel(int64_t* partial, const int32_t* ids, int64_t n, int64_t limit,
                                          bool has_ignore, int32_t ignore) {
  __shared__ int64_t shared[kThreads];
  const int64_t begin = blockIdx.x * kChunk, end = begin + kChunk < n ? begin + kChunk : n;
  int64_t first = n;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const int32_t id = ids[i];
    const bool bad = (id < 0 || static_cast<int64_t>(id) >= limit) && !(has_ignore && id == ignore);
    if (bad && i < first) first = i;
  }
  const int64_t total = block_reduce(first, shared, Min{});
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// Runs launch(device partials) with one partial of type A per chunk of n elements and returns the
// partials on the host, in chunk order.
template <typename A, typename Launch>
std::vector<A> partials(const ExecContext& ctx, std::string_view op, int64_t n, DType dtype, Launch&& launch) {
  const int64_t chunks = num_chunks(n);
  if (chunks > 0x7fffffff) fail("kernel ", op, " on cuda: ", n, " elements exceed the grid limit");
  Tensor device_partials =
      Tensor::empty({chunks}, dtype, MemCategory::Workspace, std::string(op) + " partials", ctx.device);
  launch(static_cast<A*>(device_partials.raw()), static_cast<unsigned>(chunks));
  MEGATON_CUDA_LAUNCH_CHECK();
  std::vector<A> host(static_cast<size_t>(chunks));
  MEGATON_CUDA_CHECK(cudaMemcpyAsync(host.data(), device_partials.raw(), host.size() * sizeof(A),
                                     cudaMemcpyDeviceToHost, detail::stream_of(ctx)));
  MEGATON_CUDA_CHECK(cudaStreamSynchronize(detail::stream_of(ctx)));
  return host;
}

}  // namespace

double sum(const ExecContext& ctx, const Tensor& x) {
  constexpr std::string_view op = "sum";
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  const int64_t n = x.numel();
  double total = 0.0;
  detail::dispatch_io(op, x, {}, [&]<typename T>(T) {
    if (n == 0) return;
    const std::vector<double> parts = partials<double>(ctx, op, n, DType::F64, [&](double* p, unsigned blocks) {
      sum_kernel<<<blocks, kThreads, 0, detail::stream_of(ctx)>>>(p, static_cast<const T*>(x.raw()), n);
    });
    for (double s : parts) total += s;
  });
  return total;
}

int64_t count_not_equal(const ExecContext& ctx, const Tensor& ids, int32_t value) {
  constexpr std::string_view op = "count_not_equal";
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  const int64_t n = ids.numel();
  if (n == 0) return 0;
  const std::vector<int64_t> parts = partials<int64_t>(ctx, op, n, DType::I64, [&](int64_t* p, unsigned blocks) {
    count_not_equal_kernel<<<blocks, kThreads, 0, detail::stream_of(ctx)>>>(p, static_cast<const int32_t*>(ids.raw()),
                                                                            n, value);
  });
  int64_t total = 0;
  for (int64_t c : parts) total += c;
  return total;
}

int64_t first_out_of_range(const ExecContext& ctx, const Tensor& ids, int64_t limit, std::optional<int32_t> ignore) {
  constexpr std::string_view op = "first_out_of_range";
  MEGATON_CUDA_CHECK(cudaSetDevice(ctx.device.index));
  const int64_t n = ids.numel();
  if (n == 0) return -1;
  const std::vector<int64_t> parts = partials<int64_t>(ctx, op, n, DType::I64, [&](int64_t* p, unsigned blocks) {
    first_out_of_range_kernel<<<blocks, kThreads, 0, detail::stream_of(ctx)>>>(
        p, static_cast<const int32_t*>(ids.raw()), n, limit, ignore.has_value(), ignore.value_or(0));
  });
  const int64_t first = *std::min_element(parts.begin(), parts.end());
  return first == n ? -1 : first;
}

}  // namespace megaton::kernels::cuda
