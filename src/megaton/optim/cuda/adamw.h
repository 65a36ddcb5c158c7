// CUDA AdamW step as one multi-tensor kernel: every run of weights (a parameter, or a run of
// same-decay parameters of a flat buffer) is a segment, and one launch updates up to 16 segments,
// each block a fixed 4096-element slice of one of them. The arithmetic is AdamW::step's, operation
// for operation, with explicitly rounded fp32 intrinsics (no FMA contraction). Elementwise, so
// deterministic. Plain types only: included by host C++.
#pragma once
#include <cstdint>
#include <vector>

namespace megaton::optim::cuda {

// AdamW::step's per-step scalars, already in fp32.
struct AdamWScalars {
  float b2, one_minus_b1, one_minus_b2, eps;
  float neg_step_size;  // -lr / (1 - beta1^t)
  float bc2_sqrt;       // sqrt(1 - beta2^t)
  float grad_scale;
  bool scaled;  // grad_scale != 1: multiply each gradient first
};

// Device pointers to n fp32 elements each; decay = 1 - lr * weight_decay (1 without decay).
struct AdamWSegment {
  float* w;
  const float* g;
  float* m;
  float* v;
  int64_t n;
  float decay;
};

// Queues the update of every segment on `stream` (a cudaStream_t; null: the default stream).
void adamw_step(int device, void* stream, const std::vector<AdamWSegment>& segments, const AdamWScalars& s);

}  // namespace megaton::optim::cuda
