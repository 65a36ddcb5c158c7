#include "megaton/core/rng.h"

#include <cmath>

namespace megaton {

namespace {
constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}
}  // namespace

std::array<uint32_t, 4> Philox::block(uint64_t index) const {
  uint32_t c0 = static_cast<uint32_t>(index), c1 = static_cast<uint32_t>(index >> 32);
  uint32_t c2 = static_cast<uint32_t>(stream_), c3 = static_cast<uint32_t>(stream_ >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed_), k1 = static_cast<uint32_t>(seed_ >> 32);
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kMul0, c0, hi0, lo0);
    mulhilo(kMul1, c2, hi1, lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {c0, c1, c2, c3};
}

float Philox::uniform(uint64_t index) const {
  // 24 random bits -> (0, 1]
  return (static_cast<float>(block(index)[0] >> 8) + 1.0f) * (1.0f / 16777216.0f);
}

double Philox::uniform_double(uint64_t index) const {
  auto b = block(index);
  uint64_t bits = (static_cast<uint64_t>(b[0]) << 21) ^ b[1];
  return (static_cast<double>(bits & ((1ull << 53) - 1)) + 1.0) / 9007199254740992.0;
}

float Philox::normal(uint64_t index) const {
  // Box-Muller on two 32-bit words of the same block.
  auto b = block(index);
  double u1 = (static_cast<double>(b[0]) + 1.0) / 4294967296.0;
  double u2 = static_cast<double>(b[1]) / 4294967296.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

void fill_normal(float* out, int64_t n, const Philox& rng, float mean, float stddev, uint64_t offset) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = mean + stddev * rng.normal(offset + static_cast<uint64_t>(i));
}

void fill_uniform(float* out, int64_t n, const Philox& rng, float lo, float hi, uint64_t offset) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = lo + (hi - lo) * rng.uniform(offset + static_cast<uint64_t>(i));
}

uint64_t stable_hash(const char* s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(s[i]);
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace megaton
