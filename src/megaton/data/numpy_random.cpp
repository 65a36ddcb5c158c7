#include "megaton/data/numpy_random.h"

namespace megaton::data {

uint64_t NumpyRandomState::interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  for (int shift : {1, 2, 4, 8, 16, 32}) mask |= mask >> shift;
  if (max <= 0xffffffffu) {
    for (;;)
      if (const uint64_t v = mt_() & mask; v <= max) return v;
  }
  // numpy's next_uint64 for MT19937: the first 32-bit draw is the high half.
  for (;;) {
    const uint64_t hi = mt_();
    const uint64_t v = ((hi << 32) | mt_()) & mask;
    if (v <= max) return v;
  }
}

}  // namespace megaton::data
