// The FP8 operands of one linear layer's three GEMMs under a recipe (recipe.h), each K-contiguous as
// kernels::fp8_gemm takes them:
//   fprop  y [M, N] = x [M, K]      . W [N, K]^T      x along K, W along K
//   dgrad  dx[M, K] = dy[M, N]      . W^T [K, N]^T    dy along N, W^T along N
//   wgrad  dW[N, K] = dy^T [N, M]   . x^T [K, M]^T    dy^T along M, x^T along M
// Per-tensor recipes transpose the 8-bit codes exactly; the tiled recipes quantise the transposed
// source (DeepSeek-V3's re-tiling), so the forward keeps both layouts of x, 8-bit, for the backward.
// The weight's two layouts are made once per weight version (nn::Parameter::version, bumped when the
// main weight may have changed) and reused by every micro-batch in between. Under delayed scaling
// every quantisation records its amax into its tensor's history and uses the scale of earlier
// steps; next_step() rolls the histories once per training step. Until every role has a scale the
// linear calibrates: it runs its GEMMs unquantised and only records amaxes (observe_*).
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "megaton/fp8/recipe.h"

namespace megaton::fp8 {

class LinearQuantizer {
 public:
  LinearQuantizer(std::string name, const Fp8Config& config);

  struct Input {
    kernels::Fp8Matrix fprop;  // x along K
    kernels::Fp8Matrix wgrad;  // x^T along M, what backward-W reads (8-bit, saved in the context)
  };
  // Both layouts from one pass over x: a tensor, or a fused producer (a norm's or an activation's
  // output that is never written in the compute dtype: kernels/fp8_sources.h).
  Input input(const kernels::Fp8Source& x);
  Input input(const Tensor& x) { return input(kernels::fp8_source(x)); }
  // The same made stripe by stripe as x's producer finishes its rows (kernels::Fp8StripeQuantizer:
  // fc1's GEMM epilogue making fc2's input); finish_input, after the last stripe, returns input(x).
  kernels::Fp8StripeQuantizer input_stripes(const kernels::Fp8Source& x);
  Input finish_input(kernels::Fp8StripeQuantizer& stripes);
  const kernels::Fp8Matrix& weight(const Tensor& w, uint64_t version);             // fprop operand
  const kernels::Fp8Matrix& weight_transposed(const Tensor& w, uint64_t version);  // dgrad operand
  kernels::Fp8Matrix grad_output(const Tensor& dy);              // dgrad operand
  kernels::Fp8Matrix grad_output_transposed(const Tensor& dy);   // wgrad operand

  // Delayed scaling before its first scales (delayed_scaling.h): the linear's GEMMs run in the
  // compute precision and report their operands here. Changes only in next_step(), so a
  // micro-batch's forward and backward agree.
  bool calibrating() const;
  void observe_input(const Tensor& x) { observe(input_, x); }
  void observe_weight(const Tensor& w) { observe(weight_, w); }
  void observe_grad_output(const Tensor& dy) { observe(grad_, dy); }

  // Once per training step, before its first forward: delayed scales updated from the (already
  // group-reduced) histories, which then roll.
  void next_step();
  // The delayed-scaling states (input, weight, grad_output), empty for the other recipes: the
  // trainer reduces their newest amax over the parallel groups and checkpoints them.
  std::vector<DelayedScaling*> delayed_states();
  // The same, read-only, each with its checkpoint name ("<linear>.input_fp8", ".weight_fp8",
  // ".grad_output_fp8"), in delayed_states()'s order.
  std::vector<std::pair<std::string, const DelayedScaling*>> named_delayed_states() const;

 private:
  struct Role {
    std::string name;
    Format format;
    kernels::Fp8Granularity granularity;
    std::optional<DelayedScaling> delayed;
  };
  kernels::Fp8QuantizeOptions options(Role& role, bool transpose, MemCategory cat) const;
  kernels::Fp8Matrix quantize(Role& role, const Tensor& t, bool transpose, const std::string& name, MemCategory cat);
  static void observe(Role& role, const Tensor& t);

  Fp8Config config_;
  Role input_, weight_, grad_;
  struct Cached {
    uint64_t version;
    kernels::Fp8Matrix matrix;
  };
  std::optional<Cached> weight_cache_, weight_t_cache_;
};

}  // namespace megaton::fp8
