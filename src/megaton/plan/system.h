// A system file: what `megaton plan` knows about the machines a run is planned for. One "device" is
// what one training process gets (a GPU, or on a CPU machine the cores one rank's threads run on).
// TOML, written by `megaton plan calibrate` or shipped (plan/shipped_systems.h, from datasheets):
//
//   name = "h100-sxm"  source = "datasheet" | "calibrated"   description = "..."
//   devices_per_node = 8        memory_bytes = 80e9          op_overhead_s = 4e-6
//   [peak_flops]   f32 = ..  bf16 = ..  fp16 = ..  fp8 = ..   (FLOP/s of one device, dense)
//   [[gemm]]       dtype = "bf16"  m = 4096  n = 4096  k = 4096  efficiency = 0.75
//   [[attention]]  dtype = "bf16"  seq = 4096  head_dim = 128  forward = 0.5  backward = 0.4
//   [memory]       bandwidth_Bps = 3.35e12
//   [memory.efficiency]  norm = .. activation = .. elementwise = .. embedding = .. cross_entropy = ..
//                        rope = .. optimizer = ..   (achieved / bandwidth of each kind of op)
//   [network.intra_node] bandwidth_Bps = ..  latency_s = ..
//   [network.intra_node.efficiency] all_reduce = .. all_gather = .. reduce_scatter = .. all_to_all = ..
//                                   send_recv = ..
//   [network.inter_node] ... the same keys
//
// Every number is range-checked on load; an unknown key or a missing one is an error naming it.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace megaton::plan {

// Collectives the cost model knows (the communicator's operations).
enum class Collective { AllReduce, AllGather, ReduceScatter, AllToAll, SendRecv };
inline constexpr Collective kCollectives[] = {Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter,
                                              Collective::AllToAll, Collective::SendRecv};
const char* collective_name(Collective c);  // "all_reduce", ...

// Kinds of memory-bound ops, each with its achieved share of the memory bandwidth.
enum class MemoryOp { Norm, Activation, Elementwise, Embedding, CrossEntropy, Rope, Optimizer };
inline constexpr MemoryOp kMemoryOps[] = {MemoryOp::Norm,         MemoryOp::Activation, MemoryOp::Elementwise,
                                          MemoryOp::Embedding,    MemoryOp::CrossEntropy, MemoryOp::Rope,
                                          MemoryOp::Optimizer};
const char* memory_op_name(MemoryOp op);  // "norm", ...

// One measured (or estimated) GEMM: C[m, n] = A[m, k] B[k, n] in `dtype` reached `efficiency` of the
// dtype's peak.
struct GemmPoint {
  std::string dtype;
  int64_t m = 0, n = 0, k = 0;
  double efficiency = 0;
};

// Causal attention of one (batch, head) pair at sequence length `seq`: forward and backward
// efficiencies against the dtype's peak, FLOPs counted as plan/op_costs.h counts them.
struct AttentionPoint {
  std::string dtype;
  int64_t seq = 0, head_dim = 0;
  double forward = 0, backward = 0;
};

struct LinkSpec {
  double bandwidth_Bps = 0;  // per direction, per device
  double latency_s = 0;      // per message step
  std::map<Collective, double> efficiency;  // achieved / bandwidth; every collective present
  // Extra seconds before a point-to-point message arrives when its sender computes right after
  // posting it (a pipeline boundary): on CPU ranks the communication thread shares the sender's
  // core, so the transfer waits for it. Measured by `plan calibrate`; 0 where not (GPUs' copies run
  // beside their kernels).
  double busy_send_delay_s = 0;
};

struct SystemSpec {
  std::string name;
  std::string source;  // "datasheet" (estimates until calibrated) or "calibrated"
  std::string description;
  int64_t devices_per_node = 1;
  double memory_bytes = 0;   // of one device
  double op_overhead_s = 0;  // fixed cost of every kernel (launch, thread fork / join)
  std::map<std::string, double> peak_flops;  // dtype name ("f32", "bf16", "fp16", "fp8") -> FLOP/s
  std::vector<GemmPoint> gemm;
  std::vector<AttentionPoint> attention;
  double memory_bandwidth_Bps = 0;
  std::map<MemoryOp, double> memory_efficiency;  // every MemoryOp present
  LinkSpec intra_node, inter_node;

  // Peak FLOP/s of `dtype`; throws naming the dtype and the system when the file has none.
  double peak(const std::string& dtype) const;
  // Efficiency of an m x n x k GEMM in `dtype`: inverse-distance weighting over the table's points
  // of that dtype in (log m, log n, log k) space (a measured shape returns its own figure), so the
  // curve is smooth between measured shapes and flat beyond them. Throws when the dtype has none.
  double gemm_efficiency(const std::string& dtype, int64_t m, int64_t n, int64_t k) const;
  // Forward / backward efficiency of causal attention at (seq, head_dim), the same weighting.
  double attention_efficiency(const std::string& dtype, int64_t seq, int64_t head_dim, bool backward) const;
};

// Parses a system file; every error names the file and the key.
SystemSpec load_system(const std::string& path);
// Parses TOML text (`origin` names it in errors).
SystemSpec parse_system(const std::string& toml_text, const std::string& origin);
// The system as TOML that parse_system reads back to the same values.
std::string to_toml(const SystemSpec& s);
// A path to a file, or the name of a shipped system (plan/shipped_systems.h).
SystemSpec resolve_system(const std::string& path_or_name);

}  // namespace megaton::plan
