// Multi-latent attention (nn/mla_attention.h) beyond the PyTorch end-to-end comparison
// (tests/python/test_deepseek_torch.py): decoding from the latent cache in the absorbed form equals the
// naive form and the training forward, with and without a query latent, under YaRN; the cache holds
// the latent only; what the absorbed form cannot fold is refused.
#include "megaton/nn/mla_attention.h"

#include <gtest/gtest.h>

#include <cmath>

#include "../kernels/finite_diff.h"

using namespace megaton;

namespace {

struct Fixture {
  static constexpr int64_t C = 24, H = 3, B = 2, T = 9, P = 32;
  nn::RopeTables rope;
  std::unique_ptr<nn::MultiLatentAttention> mla;

  explicit Fixture(nn::MlaConfig config, bool bias = false) {
    kernels::RopeScaling yarn{4.0, 1.0, 4.0, 8.0, true, 8.0, 1.0, 1.0, 0.8};
    const int64_t r = config.qk_pos_emb_head_dim;
    rope.cos = Tensor::empty({P, r / 2}, DType::F32, MemCategory::Workspace, "cos");
    rope.sin = Tensor::empty({P, r / 2}, DType::F32, MemCategory::Workspace, "sin");
    rope.layout = kernels::RopeLayout::Interleaved;
    kernels::rope_tables({}, rope.cos, rope.sin, kernels::rope_inv_freq(r, 10000.0, yarn), kernels::rope_magnitude(yarn));
    const double scale = kernels::rope_softmax_factor(yarn) / std::sqrt(double(config.qk_dim()));
    mla = std::make_unique<nn::MultiLatentAttention>("attn", C, H, config, bias, 1e-6, &rope, scale);
    nn::ParameterList params;
    mla->parameters(params);
    uint64_t seed = 10;
    for (nn::Parameter* p : params) {
      const bool norm = p->name.ends_with("layernorm.weight");
      auto v = fd::random_vector<float>(static_cast<size_t>(p->value.numel()), ++seed, norm ? 0.8 : -0.5,
                                        norm ? 1.2 : 0.5);
      std::copy(v.begin(), v.end(), p->value.data<float>());
    }
  }
};

// Rows [t0, t0 + len) of every sequence of a [B*T, C] tensor, as a [B*len, C] one.
Tensor rows_of_steps(const Tensor& x, int64_t B, int64_t T, int64_t t0, int64_t len) {
  const int64_t C = x.size(1);
  Tensor out = Tensor::empty({B * len, C}, DType::F32, MemCategory::Other, "chunk");
  for (int64_t b = 0; b < B; ++b)
    std::copy_n(x.data<float>() + (b * T + t0) * C, len * C, out.data<float>() + b * len * C);
  return out;
}

double max_rel(const Tensor& got, const Tensor& want) {
  double err = 0, scale = 1e-30;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double g = got.data<float>()[i], w = want.data<float>()[i];
    if (!std::isfinite(g)) return INFINITY;
    err = std::max(err, std::abs(g - w));
    scale = std::max(scale, std::abs(w));
  }
  return err / scale;
}

// A prompt of 5 tokens per sequence, then 4 single tokens: each chunk's output in the absorbed and
// the naive form, and the training forward's rows for the same positions.
void check_decoding(const nn::MlaConfig& config) {
  Fixture f(config);
  const int64_t B = Fixture::B, T = Fixture::T, C = Fixture::C;
  Tensor x = Tensor::empty({B * T, C}, DType::F32, MemCategory::Other, "x");
  auto v = fd::random_vector<float>(static_cast<size_t>(x.numel()), 3, -1.0, 1.0);
  std::copy(v.begin(), v.end(), x.data<float>());
  auto ctx = f.mla->new_ctx();
  const Tensor full = f.mla->forward(*ctx, x, B, T);
  nn::KVCache absorbed = f.mla->new_cache(B, 16, DType::F32), naive = f.mla->new_cache(B, 16, DType::F32);
  EXPECT_EQ(absorbed.k.shape(), (Shape{B, 16, config.kv_lora_rank + config.qk_pos_emb_head_dim}));
  EXPECT_FALSE(absorbed.v.defined()) << "the cache holds the latent, no values";
  for (auto [t0, len] : {std::pair<int64_t, int64_t>{0, 5}, {5, 1}, {6, 1}, {7, 1}, {8, 1}}) {
    const Tensor chunk = rows_of_steps(x, B, T, t0, len);
    const Tensor a = f.mla->forward_cached(absorbed, chunk, B, len);
    const Tensor n = f.mla->forward_cached_naive(naive, chunk, B, len);
    const Tensor want = rows_of_steps(full, B, T, t0, len);
    EXPECT_LT(max_rel(a, n), 2e-6) << "absorbed vs naive at position " << t0;
    EXPECT_LT(max_rel(n, want), 2e-6) << "naive decoding vs the training forward at position " << t0;
  }
  EXPECT_EQ(absorbed.len, T);
  EXPECT_EQ(naive.len, T);
}

}  // namespace

TEST(MultiLatentAttention, AbsorbedDecodingEqualsTheNaiveFormAndTheTrainingForward) {
  check_decoding({.q_lora_rank = 12, .kv_lora_rank = 10, .qk_head_dim = 6, .qk_pos_emb_head_dim = 4, .v_head_dim = 5});
}

TEST(MultiLatentAttention, AbsorbedDecodingWithoutAQueryLatent) {
  check_decoding({.q_lora_rank = 0, .kv_lora_rank = 16, .qk_head_dim = 8, .qk_pos_emb_head_dim = 6, .v_head_dim = 8});
}

// New weights (an optimizer step bumps the versions) remake the folded weights.
TEST(MultiLatentAttention, AbsorbedWeightsFollowTheCurrentWeights) {
  Fixture f({.q_lora_rank = 12, .kv_lora_rank = 10, .qk_head_dim = 6, .qk_pos_emb_head_dim = 4, .v_head_dim = 5});
  Tensor x = Tensor::empty({2, Fixture::C}, DType::F32, MemCategory::Other, "x");
  auto v = fd::random_vector<float>(static_cast<size_t>(x.numel()), 4, -1.0, 1.0);
  std::copy(v.begin(), v.end(), x.data<float>());
  nn::KVCache c1 = f.mla->new_cache(2, 4, DType::F32);
  f.mla->forward_cached(c1, x, 2, 1);
  float* w = f.mla->kv_up.weight.value.data<float>();
  for (int64_t i = 0; i < f.mla->kv_up.weight.value.numel(); ++i) w[i] *= -1.5f;
  f.mla->kv_up.weight.version++;
  nn::KVCache c2 = f.mla->new_cache(2, 4, DType::F32), c3 = f.mla->new_cache(2, 4, DType::F32);
  EXPECT_LT(max_rel(f.mla->forward_cached(c2, x, 2, 1), f.mla->forward_cached_naive(c3, x, 2, 1)), 2e-6);
}

TEST(MultiLatentAttention, RefusesWhatTheAbsorbedFormCannotFold) {
  Fixture f({.q_lora_rank = 12, .kv_lora_rank = 10, .qk_head_dim = 6, .qk_pos_emb_head_dim = 4, .v_head_dim = 5},
            /*bias=*/true);
  Tensor x = Tensor::zeros({2, Fixture::C}, DType::F32, MemCategory::Other, "x");
  nn::KVCache c = f.mla->new_cache(2, 4, DType::F32);
  try {
    f.mla->forward_cached(c, x, 2, 1);
    FAIL() << "a biased kv up-projection was folded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("add_bias_linear"), std::string::npos) << e.what();
  }
  EXPECT_THROW(nn::MultiLatentAttention("bad", 24, 3, {.qk_pos_emb_head_dim = 6}, false, 1e-6, &f.rope, 1.0), Error);
}
