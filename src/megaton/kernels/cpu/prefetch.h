// Software prefetch for the decode kernels, whose reads are known long before they happen: a GEMV
// streams each weight row once per token, row after row, and decode attention walks the cache's
// keys and values one token after another. On the 2-core Xeon VM the issue-15 figures come from,
// the hardware prefetchers alone held a core at ~8 GB/s of int8 codes coming from L3; asking for the
// lines a few KiB ahead raised a 2-thread stream over 85 MB from 17 to 49 GB/s and batch-1 int8
// decode of the 110M shape from ~110 to ~165 tokens/s (docs/performance.md). A prefetch never
// faults, so asking past the end of a weight or a cache is harmless; the address is formed as an
// integer so that no out-of-bounds pointer is ever made.
#pragma once
#include <cstdint>

namespace megaton::kernels::cpu {

// How far ahead of its reads an 8-bit weight stream asks for lines: 8 KiB measured best of 4 / 8 /
// 16 KiB for int8 and E4M3 rows. Only 8-bit rows prefetch: a 1B-shaped model's weights stream from
// DRAM, where the hardware prefetchers already keep up with fp32 and bf16 rows and the extra requests
// cost them (llama3-1b decode, main vs prefetching every row: fp32 6.0 -> 5.1 tok/s, bf16 8.7 -> 7.8;
// measured again with two rows per x load and L2 prefetches: 110M fp32 62 -> 53, bf16 95 -> 88),
// while 8-bit rows, with 4x the arithmetic per byte, still gained (int8 15.3 -> 17.1-19.3).
inline constexpr int64_t kPrefetchBytes = 8192;
inline constexpr int64_t kCacheLine = 64;

// Asks for the cache lines of [p + ahead, p + ahead + bytes) to be brought into L2 (PREFETCHT1), not
// L1: from DRAM each L1 prefetch holds one of the core's few line-fill buffers for a whole memory
// latency, and once decode read two weight rows at a time (four streams over two cores) those ran
// out: 16 layers of llama3-1b-shaped int8 GEMVs ran at 16-17 GB/s of codes with L1 prefetches 8 KiB
// ahead, 20-21 with L2 prefetches, and 110M-shaped ones, from L3, at 34-37 either way.
inline void prefetch_lines(const void* p, int64_t ahead, int64_t bytes) {
  const uintptr_t from = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(ahead);
  for (int64_t b = 0; b < bytes; b += kCacheLine)
    __builtin_prefetch(reinterpret_cast<const void*>(from + static_cast<uintptr_t>(b)), 0, 2);
}

}  // namespace megaton::kernels::cpu
