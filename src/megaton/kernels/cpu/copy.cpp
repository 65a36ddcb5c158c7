#include "megaton/kernels/cpu/copy.h"

#include <algorithm>
#include <vector>

#include "megaton/core/dtype.h"
#include "megaton/kernels/cpu/element.h"
#include "megaton/kernels/cpu/parallel_min.h"

namespace megaton::kernels::cpu {

template <typename T>
void copy_rows(T* dst, int64_t dst_R, int64_t dst_C, int64_t dst_row, int64_t dst_col, const T* src, int64_t src_R,
               int64_t src_C, int64_t src_row, int64_t src_col, int64_t B, int64_t rows, int64_t cols) {
  parallel_for(B * rows, B * rows * cols, [&](int64_t br) {
    const int64_t b = br / rows, r = br % rows;
    const T* s = src + (b * src_R + src_row + r) * src_C + src_col;
    std::copy(s, s + cols, dst + (b * dst_R + dst_row + r) * dst_C + dst_col);
  });
}

template <typename T>
void broadcast_rows(T* dst, int64_t dst_R, int64_t dst_C, int64_t dst_row, int64_t dst_col, const T* src,
                    int64_t src_R, int64_t src_C, int64_t src_row, int64_t src_col, int64_t B, int64_t copies,
                    int64_t cols) {
  parallel_for(B, B * copies * cols, [&](int64_t b) {
    const T* s = src + (b * src_R + src_row) * src_C + src_col;
    for (int64_t r = 0; r < copies; ++r) std::copy(s, s + cols, dst + (b * dst_R + dst_row + r) * dst_C + dst_col);
  });
}

template <typename T>
void sum_rows(T* dst, int64_t dst_R, int64_t dst_C, int64_t dst_row, int64_t dst_col, const T* src, int64_t src_R,
              int64_t src_C, int64_t src_row, int64_t src_col, int64_t B, int64_t copies, int64_t cols) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
#pragma omp parallel if (B * copies * cols >= (1 << 16))
  {
    std::vector<C> acc(static_cast<size_t>(cols));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < B; ++b) {
      std::fill(acc.begin(), acc.end(), C(0));
      for (int64_t r = 0; r < copies; ++r) {
        const T* s = src + (b * src_R + src_row + r) * src_C + src_col;
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c) acc[c] += load(s[c]);
      }
      T* d = dst + (b * dst_R + dst_row) * dst_C + dst_col;
      for (int64_t c = 0; c < cols; ++c) d[c] = store<T>(acc[c]);
    }
  }
}

template <typename T>
void fill_columns(T* t, int64_t rows, int64_t cols, int64_t from, T value) {
  for (int64_t r = 0; r < rows; ++r) std::fill(t + r * cols + from, t + (r + 1) * cols, value);
}

template void copy_rows<float>(float*, int64_t, int64_t, int64_t, int64_t, const float*, int64_t, int64_t, int64_t,
                               int64_t, int64_t, int64_t, int64_t);
template void copy_rows<double>(double*, int64_t, int64_t, int64_t, int64_t, const double*, int64_t, int64_t, int64_t,
                                int64_t, int64_t, int64_t, int64_t);
template void copy_rows<BFloat16>(BFloat16*, int64_t, int64_t, int64_t, int64_t, const BFloat16*, int64_t, int64_t, int64_t,
                                int64_t, int64_t, int64_t, int64_t);
template void copy_rows<Float16>(Float16*, int64_t, int64_t, int64_t, int64_t, const Float16*, int64_t, int64_t, int64_t,
                                int64_t, int64_t, int64_t, int64_t);

#define MEGATON_SHARED_ROWS(T)                                                                                  \
  template void broadcast_rows<T>(T*, int64_t, int64_t, int64_t, int64_t, const T*, int64_t, int64_t, int64_t, int64_t, \
                                  int64_t, int64_t, int64_t);                                                           \
  template void sum_rows<T>(T*, int64_t, int64_t, int64_t, int64_t, const T*, int64_t, int64_t, int64_t, int64_t,       \
                            int64_t, int64_t, int64_t);
MEGATON_SHARED_ROWS(float)
MEGATON_SHARED_ROWS(double)
MEGATON_SHARED_ROWS(BFloat16)
MEGATON_SHARED_ROWS(Float16)
#undef MEGATON_SHARED_ROWS

template void fill_columns<float>(float*, int64_t, int64_t, int64_t, float);
template void fill_columns<double>(double*, int64_t, int64_t, int64_t, double);
template void fill_columns<BFloat16>(BFloat16*, int64_t, int64_t, int64_t, BFloat16);
template void fill_columns<Float16>(Float16*, int64_t, int64_t, int64_t, Float16);

}  // namespace megaton::kernels::cpu
