#include "megaton/kernels/cpu/embedding.h"

#include <algorithm>
#include <numeric>
#include <type_traits>
#include <vector>

#include "megaton/kernels/cpu/element.h"
#include "megaton/kernels/cpu/parallel_min.h"

namespace megaton::kernels::cpu {

template <typename T, typename W>
void embedding_forward(T* out, const int32_t* tokens, const W* wte, const T* wpe, int64_t B, int64_t Tlen, int64_t C) {
  parallel_for(B * Tlen, B * Tlen * C, [&](int64_t row) {
    T* o = out + row * C;
    const W* e = wte + static_cast<int64_t>(tokens[row]) * C;
    if (wpe) {
      const T* p = wpe + (row % Tlen) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = static_cast<T>(load(e[c])) + p[c];
    } else if constexpr (std::is_same_v<T, W>) {
      std::copy(e, e + C, o);
    } else {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = static_cast<T>(load(e[c]));
    }
  });
}

namespace {

// Row indices grouped by token id, each group in increasing row order, so that one thread can
// own a token's dwte row and add its rows in the same order as a sequential loop would.
std::vector<int64_t> rows_grouped_by_token(const int32_t* tokens, int64_t rows) {
  std::vector<int64_t> order(static_cast<size_t>(rows));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return tokens[a] < tokens[b]; });
  return order;
}

template <typename T>
void add_row(T* __restrict dst, const T* __restrict src, int64_t C) {
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) dst[c] += src[c];
}

}  // namespace

template <typename T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t B, int64_t Tlen, int64_t C) {
  const int64_t rows = B * Tlen;
  const std::vector<int64_t> order = rows_grouped_by_token(tokens, rows);
  // Group starts: positions in `order` where the token id changes. Groups are disjoint dwte rows,
  // so they can run in parallel; dynamic scheduling balances frequent vs rare tokens and does not
  // change any summation order.
  std::vector<int64_t> starts;
  for (int64_t i = 0; i < rows; ++i)
    if (i == 0 || tokens[order[i]] != tokens[order[i - 1]]) starts.push_back(i);
  starts.push_back(rows);
  const int64_t groups = static_cast<int64_t>(starts.size()) - 1;

#pragma omp parallel
  {
#pragma omp for schedule(dynamic, 4)
    for (int64_t g = 0; g < groups; ++g) {
      T* dst = dwte + static_cast<int64_t>(tokens[order[starts[g]]]) * C;
      for (int64_t i = starts[g]; i < starts[g + 1]; ++i) add_row(dst, dout + order[i] * C, C);
    }
    if (dwpe) {
      // Each position's row is owned by one thread, which sums the batch in order.
#pragma omp for schedule(static)
      for (int64_t t = 0; t < Tlen; ++t)
        for (int64_t b = 0; b < B; ++b) add_row(dwpe + t * C, dout + (b * Tlen + t) * C, C);
    }
  }
}

#define MEGATON_INSTANTIATE(T)                                                                           \
  template void embedding_forward<T>(T*, const int32_t*, const T*, const T*, int64_t, int64_t, int64_t); \
  template void embedding_backward<T>(T*, T*, const T*, const int32_t*, int64_t, int64_t, int64_t);
MEGATON_INSTANTIATE(float)
MEGATON_INSTANTIATE(double)
#undef MEGATON_INSTANTIATE
template void embedding_forward<float, BFloat16>(float*, const int32_t*, const BFloat16*, const float*, int64_t,
                                                 int64_t, int64_t);

}  // namespace megaton::kernels::cpu
