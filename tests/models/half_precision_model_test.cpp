// BF16 and FP16 mixed precision at the model level: the same weights run in f32 and in bf16 / fp16
// give the loss and every gradient to the 16-bit format's accuracy, the gradients stay fp32 main
// grads, the compute copies follow the main weights only when refreshed, and the activations take
// half the memory.
#include <gtest/gtest.h>

#include <cmath>

#include "../support/temp_dir.h"
#include "../support/tiny_model.h"
#include "megaton/core/allocator.h"
#include "megaton/models/transformer_model.h"

using namespace megaton;

namespace {

struct Result {
  double loss;
  std::vector<std::vector<double>> grads;  // per parameter
  int64_t activation_peak;
};

// The tiny config; a mixture of experts routes every token to every expert, so that no top-k choice
// exists for the 16-bit rounding of the logits to flip (a flipped choice is a different model, not
// a rounding error) while the permutations, grouped GEMMs and weighting run in full.
models::TransformerConfig config_of(const std::string& preset) {
  models::TransformerConfig c = megaton::testing::tiny_config(preset);
  c.moe.moe_router_topk = c.moe.num_moe_experts;  // every token to every expert: no top-k choice can flip
  c.moe.moe_router_group_topk = c.moe.moe_router_num_groups;
  return c;
}

Result run(const std::string& preset, DType dtype, bool defer_head = false) {
  models::TransformerModel m(config_of(preset));
  m.init_weights(5);
  m.set_compute_dtype(dtype);
  nn::zero_grads(m.parameters());
  auto [in, tg] = megaton::testing::tiny_batch(2, 32);
  Allocator::host().reset_peaks();
  const int64_t before = Allocator::host().stats().live[static_cast<size_t>(MemCategory::Activations)];
  // fp16 trains with a loss scale (precision.loss_scale / the dynamic scaler): without one the small
  // gradients of a tiny model (an MTP depth's, weighted 0.1) fall below fp16's normal range.
  const float scale = dtype == DType::F16 ? 1024.0f : 1.0f;
  m.set_moe_aux_loss_grad_scale(scale);
  models::ModelCtx ctx;
  const double loss = m.forward(ctx, in, tg, true, scale, defer_head).loss;
  m.backward(ctx);
  for (const nn::Parameter* p : m.parameters()) EXPECT_EQ(p->grad.dtype(), DType::F32) << p->name;
  auto grads = megaton::testing::gradients_of(m.parameters());
  for (auto& g : grads)
    for (double& v : g) v /= scale;
  return {loss, grads,
          static_cast<int64_t>(Allocator::host().stats().peak[static_cast<size_t>(MemCategory::Activations)]) - before};
}

using megaton::testing::relative_error;

}  // namespace

// bf16: loss within 1e-2, gradients 3e-2; fp16 (3 more mantissa bits): 2e-3 and 5e-3.
struct HalfCase {
  DType dtype;
  double loss_tol, grad_tol;
};
class HalfModel : public ::testing::TestWithParam<HalfCase> {};

TEST_P(HalfModel, LossAndEveryGradientMatchF32ToTheFormatsAccuracy) {
  const HalfCase c = GetParam();
  // mixtral: MoE layers; deepseek: MLA, MoE and an MTP depth
  for (const std::string preset : {"gpt-tiny", "llama-tiny", "mixtral-tiny", "deepseek-v3-tiny"}) {
    SCOPED_TRACE(preset);
    const Result f32 = run(preset, DType::F32), half = run(preset, c.dtype);
    ASSERT_TRUE(std::isfinite(half.loss));
    EXPECT_NEAR(half.loss, f32.loss, c.loss_tol * f32.loss);
    EXPECT_NE(half.loss, f32.loss);  // the 16-bit path really ran
    models::TransformerModel names(config_of(preset));
    for (size_t i = 0; i < f32.grads.size(); ++i)
      EXPECT_LT(relative_error(half.grads[i], f32.grads[i]), c.grad_tol) << names.parameters()[i]->name;
    // The activations (kept between forward and backward) take about half the bytes.
    EXPECT_LT(half.activation_peak, 0.7 * static_cast<double>(f32.activation_peak))
        << half.activation_peak << " vs " << f32.activation_peak;
    // The head's deferred W keeps 16-bit dlogits and gives the same gradients.
    const Result deferred = run(preset, c.dtype, true);
    for (size_t i = 0; i < f32.grads.size(); ++i) EXPECT_EQ(deferred.grads[i], half.grads[i]) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, HalfModel,
                         ::testing::Values(HalfCase{DType::BF16, 1e-2, 3e-2}, HalfCase{DType::F16, 2e-3, 5e-3}),
                         [](const ::testing::TestParamInfo<HalfCase>& info) {
                           return std::string(dtype_name(info.param.dtype));
                         });

TEST(Bf16Model, ComputeCopiesFollowTheMainWeightsWhenRefreshed) {
  models::TransformerModel m(megaton::testing::tiny_config("llama-tiny"));
  m.init_weights(5);
  m.set_compute_dtype(DType::BF16);
  const auto batch = megaton::testing::tiny_batch(2, 32);  // not a structured binding: clang 14 cannot capture one
  auto loss = [&] {
    models::ModelCtx ctx;
    return m.forward(ctx, batch.first, batch.second, false).loss;
  };
  const double before = loss();
  for (nn::Parameter* p : m.parameters())  // scale every matrix: the loss must move
    if (p->compute.defined())
      for (int64_t i = 0; i < p->value.numel(); ++i) p->value.data<float>()[i] *= 2.0f;
  EXPECT_EQ(loss(), before) << "the compute copies are what the GEMMs read";
  m.refresh_compute_weights();
  EXPECT_NE(loss(), before);
  EXPECT_ERROR_CONTAINS(m.set_compute_dtype(DType::F64), "compute dtype f64 is not supported");
  m.set_compute_dtype(DType::F32);  // back to f32: no copies left
  for (nn::Parameter* p : m.parameters()) EXPECT_FALSE(p->compute.defined()) << p->name;
}
