// Activation recompute (Megatron's --recompute-granularity, --recompute-method,
// --recompute-num-layers, --recompute-modules): trade forward FLOPs for activation memory.
//   - full: a unit of layers keeps only its input between F and B; right before the unit's B its
//     forward runs again from that input, rebuilding every context. method "uniform" makes every
//     layer of a chunk part of a unit of num_layers consecutive layers (the last one shorter);
//     "block" recomputes the first num_layers layers of each chunk one by one and keeps the rest.
//   - selective: only the listed modules drop their activations after F and rebuild them from the
//     inputs they keep anyway (or one saved input) before their B: "core_attn" (the attention
//     output and its softmax statistics, rebuilt from q, k, v), "mlp" (the whole dense or MoE
//     MLP, rebuilt from its input: fc1's output and the activation are not kept) and "layernorm"
//     (the two norms' outputs, rebuilt from the norms' inputs, which their backward keeps anyway;
//     only where the next GEMM reads the norm's output itself: not under sequence parallelism,
//     whose linears keep the gathered rows, nor for FP8 linears or MoE, which keep their own copies)
//     and "moe_act" (the routed experts' SwiGLU output, rebuilt from fc1's output, which their
//     backward keeps anyway, at the end of their B for fc2's W; MoE layers only, as Megatron's).
// Recomputing runs the same kernels on the same inputs, so gradients are bitwise those of no
// recompute.
#pragma once
#include <cstdint>
#include <string>

namespace megaton::nn {

enum class RecomputeGranularity : uint8_t { None, Full, Selective };
enum class RecomputeMethod : uint8_t { Uniform, Block };

struct RecomputeConfig {
  RecomputeGranularity granularity = RecomputeGranularity::None;
  RecomputeMethod method = RecomputeMethod::Uniform;
  int64_t num_layers = 1;  // full: layers per unit (uniform) or recomputed layers per chunk (block)
  bool core_attn = false;  // selective modules
  bool mlp = false;
  bool layernorm = false;
  bool moe_act = false;
  bool full() const { return granularity == RecomputeGranularity::Full; }
};

// For the run's banner: "" for none, else e.g. "full (uniform, 2 layers per unit)" or
// "selective (core_attn, mlp)".
std::string describe(const RecomputeConfig& config);

// From Megatron's names: granularity "" (off) | "full" | "selective"; method "uniform" | "block";
// modules a comma- or space-separated list of core_attn, mlp, layernorm, moe_act (selective only). Errors name the
// key (key_prefix + "recompute_method", ...) and the bad value, and list the accepted ones;
// num_layers must be >= 1.
RecomputeConfig recompute_config_from_names(const std::string& granularity, const std::string& method,
                                            int64_t num_layers, const std::string& modules,
                                            const std::string& key_prefix = "");

}  // namespace megaton::nn
