#include "megaton/kernels/cpu/copy.h"

#include "megaton/core/dtype.h"

#include <algorithm>

namespace megaton::kernels::cpu {

template <typename T>
void copy_rows(T* dst, int64_t dst_R, int64_t dst_C, int64_t dst_row, int64_t dst_col, const T* src, int64_t src_R,
               int64_t src_C, int64_t src_row, int64_t src_col, int64_t B, int64_t rows, int64_t cols) {
#pragma omp parallel for collapse(2) schedule(static) if (B * rows * cols >= (1 << 16))
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = 0; r < rows; ++r) {
      const T* s = src + (b * src_R + src_row + r) * src_C + src_col;
      std::copy(s, s + cols, dst + (b * dst_R + dst_row + r) * dst_C + dst_col);
    }
}

template void copy_rows<float>(float*, int64_t, int64_t, int64_t, int64_t, const float*, int64_t, int64_t, int64_t,
                               int64_t, int64_t, int64_t, int64_t);
template void copy_rows<double>(double*, int64_t, int64_t, int64_t, int64_t, const double*, int64_t, int64_t, int64_t,
                                int64_t, int64_t, int64_t, int64_t);
template void copy_rows<BFloat16>(BFloat16*, int64_t, int64_t, int64_t, int64_t, const BFloat16*, int64_t, int64_t, int64_t,
                                int64_t, int64_t, int64_t, int64_t);
template void copy_rows<Float16>(Float16*, int64_t, int64_t, int64_t, int64_t, const Float16*, int64_t, int64_t, int64_t,
                                int64_t, int64_t, int64_t, int64_t);

}  // namespace megaton::kernels::cpu
