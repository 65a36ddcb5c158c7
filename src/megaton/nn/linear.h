// Linear layer y = x W^T + b with the backward split into input (B) and weight (W) halves:
// backward_input keeps dy in the context so backward_weight can run later (Zero Bubble).
// Over a tensor-parallel group it is Megatron's ColumnParallelLinear or RowParallelLinear.
#pragma once
#include <memory>
#include <optional>

#include "megaton/fp8/linear_quantizer.h"
#include "megaton/nn/fused_input.h"
#include "megaton/nn/tensor_parallel.h"

namespace megaton::nn {

struct LinearCtx {
  Tensor x;   // input as the GEMM read it (gathered over the sequence-parallel group), saved by forward
  Tensor dy;  // output gradient as the GEMM read it, saved by backward_input for backward_weight
  // FP8: instead of x, its 8-bit copy in the weight-gradient GEMM's layout.
  std::optional<kernels::Fp8Matrix> x_fp8;
};

// Work on a linear's output stripe by stripe as its FP8 GEMM finishes the rows (kernels::fp8_gemm's
// rows_done), while they are still in cache: LayerNormMLP's activation and FP8 cast of fc2's input in
// fc1's epilogue (nn/mlp.h).
class OutputEpilogue {
 public:
  virtual ~OutputEpilogue() = default;
  virtual void begin(const Tensor& y) = 0;        // y is allocated; the GEMM has not written it yet
  virtual void rows(int64_t r0, int64_t r1) = 0;  // rows [r0, r1) of y are final
};

// Megatron's split of a linear over the tensor-parallel group. Column splits the output features
// (weight and bias along dim 0): the input enters the tensor-parallel region (forward identity,
// or with sequence parallelism the all-gather of the rows; backward the all-reduce of the input
// gradient, or its reduce-scatter), the output stays split. Row splits the input features (weight
// along dim 1, bias replicated): the input is already split, the partial outputs are summed over
// the group (all-reduce, or with sequence parallelism reduce-scatter of the rows) and the bias
// added once (by rank 0's GEMM), the output gradient is the whole one (all-gathered rows).
enum class LinearParallel { Column, Row };

class Linear {
 public:
  // in_features / out_features are global. A column-parallel linear's output rows are split as
  // `out_pieces` (per rank; default: evenly), a row-parallel one's input features evenly.
  Linear(const std::string& name, int64_t in_features, int64_t out_features, bool bias, LinearParallel parallel,
         const TensorParallel& tp = {}, std::vector<std::vector<ShardPiece>> out_pieces = {});
  // x [N, in] -> [N, out]. An epilogue may be given when forward_in_fp8() and the output is not
  // summed over a group (a column-parallel or unsplit linear).
  Tensor forward(LinearCtx& ctx, const Tensor& x, OutputEpilogue* epilogue = nullptr);
  // The same from an input that may never be written (fused_input.h): quantised straight from its
  // producer when the GEMMs run in FP8 and no sequence-parallel gather comes first.
  Tensor forward(LinearCtx& ctx, FusedInput& x, OutputEpilogue* epilogue = nullptr);
  // The same from an input this linear's quantiser made already (fp8()->input_stripes, finished):
  // forward_in_fp8() only; the output takes `dtype`.
  Tensor forward(LinearCtx& ctx, fp8::LinearQuantizer::Input x, DType dtype);
  // Whether forward runs its GEMM in FP8 (training under an FP8 recipe past calibration).
  bool forward_in_fp8() const { return fp8_active() && !weight.quantized; }
  Tensor backward_input(LinearCtx& ctx, const Tensor& dy);   // -> dx [N, in]
  void backward_weight(LinearCtx& ctx);                      // dW += dy^T x, db += sum dy; frees ctx
  void parameters(ParameterList& out);
  // Runs the three GEMMs in FP8 under `config` from now on (TransformerEngine's fp8_autocast for
  // this layer); the bias, its gradient and the main weight and gradient stay in higher precision.
  void enable_fp8(const fp8::Fp8Config& config);
  fp8::LinearQuantizer* fp8() { return fp8_.get(); }
  // Megatron's bias_activation_fusion: the op after this GEMM adds the bias and sums its gradient
  // (kernels::bias_gelu_* / bias_swiglu_*), so forward returns x W^T alone and backward_weight
  // leaves bias.grad to that op (it still reports the bias gradient ready, in its usual order).
  void defer_bias(bool on) { bias_deferred_ = on; }
  // This rank's features (the global ones without tensor parallelism).
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

  Parameter weight;  // [out, in]
  Parameter bias;    // [out], undefined when the layer has no bias

 private:
  // The FP8 forward of x quantised here, and its GEMM on x's two quantised layouts (the transposed
  // one kept in ctx for W) into y.
  Tensor fp8_forward(LinearCtx& ctx, const kernels::Fp8Source& x, DType dtype, OutputEpilogue* epilogue);
  Tensor fp8_gemm_forward(LinearCtx& ctx, Tensor y, fp8::LinearQuantizer::Input&& x, OutputEpilogue* epilogue);
  // A row-parallel output summed over the group (reduce-scattered under sequence parallelism).
  Tensor reduce_output(Tensor y);
  bool fp8_active() const { return fp8_ && !fp8_->calibrating(); }

  int64_t in_, out_;  // local
  LinearParallel parallel_;
  TensorParallel tp_;
  bool bias_deferred_ = false;
  std::unique_ptr<fp8::LinearQuantizer> fp8_;
};

// Rows of an activation tensor viewed as a matrix [N, last_dim].
int64_t rows_of(const Tensor& t);
// An activation (MemCategory::Activations) of the given dtype: a module's outputs take the dtype
// of its input, so the model's compute dtype flows from the embedding output through every layer.
Tensor new_activation(Shape shape, const std::string& name, DType dtype = DType::F32);
// t itself when it already holds `dtype`, else a converted copy (for kernels that compute in f32
// only, and back).
Tensor as_dtype(const Tensor& t, DType dtype);

}  // namespace megaton::nn
