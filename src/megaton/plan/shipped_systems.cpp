#include "megaton/plan/shipped_systems.h"

#include <algorithm>

namespace megaton::plan {

namespace {

// The datasheet figures of one 8-GPU SXM node (per GPU; dense, without sparsity).
struct Datasheet {
  const char* name;
  const char* description;
  double f32, bf16, fp8;       // FLOP/s (fp8 0: none)
  double memory_bytes, hbm_Bps;
  double nvlink_Bps, nic_Bps;  // per direction
};

// Estimated efficiencies (source = "datasheet"): large bf16 GEMMs reach ~75% of peak on Hopper in
// cuBLASLt, FP8 ~60%, small ones far less; flash attention ~60% forward and ~45% backward at long
// sequences with head_dim 128; NCCL's bus bandwidth ~80% of NVLink's for all-reduce, less for
// all-to-all. Replaced by measured tables when `megaton plan calibrate` runs on the device.
SystemSpec from_datasheet(const Datasheet& d) {
  SystemSpec s;
  s.name = d.name;
  s.source = "datasheet";
  s.description = d.description;
  s.devices_per_node = 8;
  s.memory_bytes = d.memory_bytes;
  s.op_overhead_s = 4e-6;
  s.peak_flops = {{"f32", d.f32}, {"bf16", d.bf16}, {"fp16", d.bf16}};
  if (d.fp8 > 0) s.peak_flops["fp8"] = d.fp8;
  struct Shape {
    int64_t m, n, k;
    double eff;
  };
  const Shape shapes[] = {{256, 256, 256, 0.05},     {1024, 1024, 1024, 0.35},  {2048, 2048, 2048, 0.6},
                          {4096, 4096, 4096, 0.72},  {8192, 8192, 8192, 0.78},  {16384, 1024, 4096, 0.62},
                          {16384, 4096, 1024, 0.62}, {16384, 8192, 8192, 0.78}, {65536, 16384, 16384, 0.8}};
  for (const Shape& sh : shapes) {
    s.gemm.push_back({"f32", sh.m, sh.n, sh.k, std::min(0.9, sh.eff * 1.1)});
    s.gemm.push_back({"bf16", sh.m, sh.n, sh.k, sh.eff});
    s.gemm.push_back({"fp16", sh.m, sh.n, sh.k, sh.eff});
    if (d.fp8 > 0) s.gemm.push_back({"fp8", sh.m, sh.n, sh.k, sh.eff * 0.8});
  }
  for (const char* dtype : {"f32", "bf16", "fp16"}) {
    s.attention.push_back({dtype, 1024, 128, 0.4, 0.3});
    s.attention.push_back({dtype, 4096, 128, 0.6, 0.45});
    s.attention.push_back({dtype, 16384, 128, 0.65, 0.5});
    s.attention.push_back({dtype, 4096, 64, 0.45, 0.35});
  }
  s.memory_bandwidth_Bps = d.hbm_Bps;
  for (MemoryOp op : kMemoryOps) s.memory_efficiency[op] = 0.75;
  s.memory_efficiency[MemoryOp::Embedding] = 0.5;  // gathers of scattered rows
  s.intra_node = {d.nvlink_Bps, 5e-6, {}};
  s.inter_node = {d.nic_Bps, 12e-6, {}};
  for (Collective c : kCollectives) {
    s.intra_node.efficiency[c] = c == Collective::AllToAll ? 0.6 : 0.8;
    s.inter_node.efficiency[c] = c == Collective::AllToAll ? 0.7 : 0.85;
  }
  return s;
}

// NVIDIA datasheets: A100 SXM4 80GB (TF32 not counted as f32: the f32 figure is the CUDA cores'),
// H100 SXM5 80GB, H200 SXM 141GB, HGX B200 180GB; NVLink 3 / 4 / 4 / 5 at 600 / 900 / 900 / 1800
// GB/s both directions; one 200 Gb/s (A100) or 400 Gb/s (others) InfiniBand NIC per GPU.
const Datasheet kDatasheets[] = {
    {"a100", "NVIDIA A100 SXM4 80GB, 8 per node (datasheet figures; efficiencies estimated)", 19.5e12, 312e12, 0, 80e9,
     2.039e12, 300e9, 25e9},
    {"h100", "NVIDIA H100 SXM5 80GB, 8 per node (datasheet figures; efficiencies estimated)", 67e12, 989e12, 1979e12,
     80e9, 3.35e12, 450e9, 50e9},
    {"h200", "NVIDIA H200 SXM 141GB, 8 per node (datasheet figures; efficiencies estimated)", 67e12, 989e12, 1979e12,
     141e9, 4.8e12, 450e9, 50e9},
    {"b200", "NVIDIA B200 (HGX) 180GB, 8 per node (datasheet figures; efficiencies estimated)", 80e12, 2250e12, 4500e12,
     180e9, 8e12, 900e9, 50e9},
};

}  // namespace

std::optional<SystemSpec> shipped_system(const std::string& name) {
  for (const Datasheet& d : kDatasheets)
    if (name == d.name) return from_datasheet(d);
  return std::nullopt;
}

std::vector<std::string> shipped_system_names() {
  std::vector<std::string> names;
  for (const Datasheet& d : kDatasheets) names.push_back(d.name);
  return names;
}

}  // namespace megaton::plan
