// The CPU a benchmark ran on: model name and the vector / matrix features that decide which GEMM
// and kernel paths are fast. Every benchmark prints it, because figures from different machines
// (AVX2-only Zen 3, AVX-512 Zen 4, AMX Xeons) must never be compared.
#pragma once
#include <string>
#include <vector>

namespace megaton {

struct CpuInfo {
  std::string model;                  // /proc/cpuinfo "model name", or "unknown"
  std::vector<std::string> features;  // the subset of kCpuFeaturesOfInterest the CPU reports
};

// Flags that matter for Megaton's CPU paths, in the spelling of /proc/cpuinfo.
inline constexpr const char* kCpuFeaturesOfInterest[] = {"fma",         "avx2",        "avx512f",
                                                         "avx512bw",    "avx512_vnni", "avx512_bf16",
                                                         "avx512_fp16", "amx_tile",    "amx_bf16"};

CpuInfo cpu_info();
// "AMD EPYC (fma avx2)": one line for benchmark output.
std::string describe(const CpuInfo& cpu);

}  // namespace megaton
