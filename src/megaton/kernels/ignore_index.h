// The target id of a row that contributes no loss and no gradient (PyTorch's ignore_index).
#pragma once
#include <cstdint>

namespace megaton::kernels {
inline constexpr int32_t kIgnoreIndex = -100;
}  // namespace megaton::kernels
