// How many new tokens per sequence a forward may carry and still run as decode steps.
#pragma once
#include <cstdint>

namespace megaton::kernels {

// Up to this many rows, a linear layer runs the streaming GEMV (cpu/gemv.h: each weight row read
// once for all of them, no packing) and a cached attention the decode kernel (attention.h: one pass
// over the cache, each query over its own causal prefix). Every row then gets exactly the bits a
// one-token step gives it, so a speculative step verifying up to kDecodeRows - 1 drafted tokens
// reproduces plain greedy decoding, and short prefill chunks skip the GEMM's packing of W.
inline constexpr int64_t kDecodeRows = 8;

}  // namespace megaton::kernels
