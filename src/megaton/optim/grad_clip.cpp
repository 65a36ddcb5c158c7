#include "megaton/optim/grad_clip.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace megaton::optim {

namespace {

// Chunk size fixes the summation order; large enough that per-chunk overhead is negligible.
constexpr int64_t kChunk = 1 << 15;

struct Chunk {
  const float* data;
  int64_t size;
};

// Sum of squares in double over 16 interleaved partial sums, added up at the end: one running sum
// is a chain of dependent adds (~4 cycles an element, ~5x slower than reading the gradients); 16
// independent ones vectorise. The order is fixed by the data alone, not by threads.
double chunk_sum_of_squares(const float* data, int64_t n) {
  constexpr int64_t kLanes = 16;
  double lanes[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) {
      const double x = data[j + l];
      lanes[l] += x * x;
    }
  for (; j < n; ++j) {
    const double x = data[j];
    lanes[0] += x * x;
  }
  double s = 0;
  for (double lane : lanes) s += lane;
  return s;
}

}  // namespace

double global_grad_norm(const nn::ParameterList& params) {
  std::vector<Tensor> grads;
  for (const nn::Parameter* p : params) grads.push_back(p->grad);
  return global_norm(grads);
}

double global_norm(const std::vector<Tensor>& grads) { return std::sqrt(sum_of_squares(grads)); }

double sum_of_squares(const std::vector<Tensor>& grads) {
  std::vector<Chunk> chunks;
  for (const Tensor& grad : grads) {
    const float* g = grad.data<float>();
    const int64_t n = grad.numel();
    for (int64_t off = 0; off < n; off += kChunk) chunks.push_back({g + off, std::min(kChunk, n - off)});
  }
  std::vector<double> partial(chunks.size());
  const int64_t num_chunks = static_cast<int64_t>(chunks.size());
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < num_chunks; ++c) partial[c] = chunk_sum_of_squares(chunks[c].data, chunks[c].size);
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0 || !std::isfinite(norm)) return 1.0;
  return std::min(1.0, max_norm / (norm + 1e-6));  // PyTorch clamps the coefficient to 1
}

double clip_grad_norm(const nn::ParameterList& params, double max_norm) {
  const double norm = global_grad_norm(params);
  const double coef = clip_coefficient(norm, max_norm);
  if (coef >= 1) return norm;
  const float scale = static_cast<float>(coef);
  for (nn::Parameter* p : params) {
    float* g = p->grad.data<float>();
    const int64_t n = p->grad.numel();
#pragma omp parallel for schedule(static) if (n >= 4096)
    for (int64_t j = 0; j < n; ++j) g[j] *= scale;
  }
  return norm;
}

}  // namespace megaton::optim
