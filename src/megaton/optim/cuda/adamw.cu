#include <cuda_runtime.h>

#include <algorithm>

#include "megaton/core/cuda/cuda_check.h"
#include "megaton/optim/cuda/adamw.h"

namespace megaton::optim::cuda {

namespace {

constexpr int kMaxSegments = 16;  // per launch; the batch is passed by value (~850 bytes of kernel parameters)
constexpr int kThreads = 256;
constexpr int64_t kPerBlock = 4096;  // elements per block (16 per thread)

struct Batch {
  float* w[kMaxSegments];
  const float* g[kMaxSegments];
  float* m[kMaxSegments];
  float* v[kMaxSegments];
  int64_t n[kMaxSegments];
  float decay[kMaxSegments];
  int64_t first_block[kMaxSegments + 1];  // segment s owns blocks [first_block[s], first_block[s + 1])
  int count;
};

__global__ void adamw_kernel(const Batch b, const AdamWScalars s) {
  const int64_t block = blockIdx.x;
  int seg = 0;  // the segment owning this block (empty segments own no block and are stepped over)
  while (seg + 1 < b.count && block >= b.first_block[seg + 1]) ++seg;
  const int64_t begin = (block - b.first_block[seg]) * kPerBlock;
  const int64_t end = begin + kPerBlock < b.n[seg] ? begin + kPerBlock : b.n[seg];
  float* w = b.w[seg];
  const float* g = b.g[seg];
  float* m = b.m[seg];
  float* v = b.v[seg];
  const float decay = b.decay[seg];
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
    // AdamW::step's expression order; the _rn intrinsics keep nvcc from fusing into FMAs.
    const float gj = s.scaled ? __fmul_rn(g[j], s.grad_scale) : g[j];
    float wj = __fmul_rn(w[j], decay);
    const float mj = __fadd_rn(m[j], __fmul_rn(s.one_minus_b1, __fsub_rn(gj, m[j])));
    const float vj = __fadd_rn(__fmul_rn(v[j], s.b2), __fmul_rn(__fmul_rn(s.one_minus_b2, gj), gj));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vj), s.bc2_sqrt), s.eps);
    wj = __fadd_rn(wj, __fmul_rn(s.neg_step_size, __fdiv_rn(mj, denom)));
    m[j] = mj;
    v[j] = vj;
    w[j] = wj;
  }
}

}  // namespace

void adamw_step(int device, void* stream, const std::vector<AdamWSegment>& segments, const AdamWScalars& s) {
  MEGATON_CUDA_CHECK(cudaSetDevice(device));
  for (size_t first = 0; first < segments.size(); first += kMaxSegments) {
    Batch b{};
    b.count = static_cast<int>(std::min<size_t>(kMaxSegments, segments.size() - first));
    int64_t blocks = 0;
    for (int i = 0; i < b.count; ++i) {
      const AdamWSegment& seg = segments[first + static_cast<size_t>(i)];
      b.w[i] = seg.w;
      b.g[i] = seg.g;
      b.m[i] = seg.m;
      b.v[i] = seg.v;
      b.n[i] = seg.n;
      b.decay[i] = seg.decay;
      b.first_block[i] = blocks;
      blocks += (seg.n + kPerBlock - 1) / kPerBlock;
    }
    b.first_block[b.count] = blocks;
    if (blocks == 0) continue;
    if (blocks > 0x7fffffff) fail("AdamW step on cuda:", device, ": ", blocks, " blocks exceed the grid limit");
    adamw_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(b, s);
    MEGATON_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace megaton::optim::cuda
