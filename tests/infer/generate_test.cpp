#include "megaton/infer/generate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

#include "../support/tiny_model.h"
#include "megaton/kernels/attention.h"
#include "megaton/kernels/decode_rows.h"
#include "megaton/kernels/linear.h"
#include "megaton/kernels/quantized_linear.h"
#include "megaton/nn/paged_kv_cache.h"

using namespace megaton;

namespace {

models::TransformerConfig tiny(const std::string& preset) {
  auto c = megaton::testing::tiny_config(preset);
  c.init_method_std = 0.2;  // sharp distributions, so positions and the cache matter
  return c;
}

Tensor ids(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({1, static_cast<int64_t>(v.size())}, DType::I32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

// 40 greedy tokens after a 4-token prompt, and the sequence the model saw to pick them (the prompt
// and every generated token but the last), and each generated token's row in that sequence.
struct GreedyRun {
  std::vector<int32_t> prompt = {72, 101, 108, 108}, generated, seq;
  int64_t row_of(size_t i) const { return static_cast<int64_t>(prompt.size() + i) - 1; }
};
GreedyRun greedy_run(models::TransformerModel& m) {
  GreedyRun run;
  infer::SamplingOptions o;
  o.temperature = 0;
  o.max_new_tokens = 40;
  run.generated = infer::generate(m, run.prompt, o);
  EXPECT_EQ(run.generated.size(), 40u);
  run.seq = run.prompt;
  if (!run.generated.empty()) run.seq.insert(run.seq.end(), run.generated.begin(), run.generated.end() - 1);
  return run;
}

}  // namespace

class KVCache : public ::testing::TestWithParam<std::string> {};

// Decoding token by token through the KV cache gives the same per-position cross-entropy as the
// training forward over the whole sequence.
TEST_P(KVCache, IncrementalDecodingMatchesTheTrainingForward) {
  models::TransformerModel m(tiny(GetParam()));
  m.init_weights(3);
  std::vector<int32_t> seq;
  for (int i = 0; i < 21; ++i) seq.push_back((i * 37 + 11) % 257);
  const std::vector<int32_t> in(seq.begin(), seq.end() - 1), tg(seq.begin() + 1, seq.end());
  models::ModelCtx ctx;
  const double want = m.forward(ctx, ids(in), ids(tg), false).loss;

  auto caches = m.new_kv_caches(1, 64);
  // A 5-token prefill, then one token at a time.
  double sum = 0;
  auto add_loss = [&](const Tensor& logits, int32_t target) {
    const float* l = logits.data<float>();
    double mx = l[0], s = 0;
    for (int v = 0; v < 257; ++v) mx = std::max(mx, double(l[v]));
    for (int v = 0; v < 257; ++v) s += std::exp(l[v] - mx);
    sum += mx + std::log(s) - l[target];
  };
  // The prefill only returns the last position's logits; the first four targets are scored by
  // feeding those tokens one by one in a second cache.
  auto warm = m.new_kv_caches(1, 64);
  for (size_t t = 0; t < 4; ++t) add_loss(m.forward_cached(warm, ids({in[t]})), tg[t]);
  add_loss(m.forward_cached(caches, ids(std::vector<int32_t>(in.begin(), in.begin() + 5))), tg[4]);
  for (size_t t = 5; t < in.size(); ++t) add_loss(m.forward_cached(caches, ids({in[t]})), tg[t]);
  EXPECT_NEAR(sum / static_cast<double>(tg.size()), want, 1e-5 * want);
}

INSTANTIATE_TEST_SUITE_P(Models, KVCache, ::testing::Values("gpt-tiny", "llama-tiny", "deepseek-v3-tiny"));

TEST(Sampling, GreedyTopKTopPAndSeeds) {
  std::vector<float> logits = {0.1f, 2.0f, 1.9f, -1.0f, 0.5f};
  infer::SamplingOptions greedy;
  greedy.temperature = 0;
  EXPECT_EQ(infer::sample_token(logits.data(), 5, greedy, 0), 1);
  infer::SamplingOptions k1;
  k1.top_k = 1;
  infer::SamplingOptions p_small;
  p_small.top_p = 0.1;
  for (uint64_t d = 0; d < 50; ++d) {
    EXPECT_EQ(infer::sample_token(logits.data(), 5, k1, d), 1);
    EXPECT_EQ(infer::sample_token(logits.data(), 5, p_small, d), 1);
  }
  // top-k 2 only ever picks ids 1 and 2; plain sampling visits others; frequencies follow softmax.
  infer::SamplingOptions k2;
  k2.top_k = 2;
  int count[5] = {};
  for (uint64_t d = 0; d < 4000; ++d) {
    const int32_t a = infer::sample_token(logits.data(), 5, k2, d);
    EXPECT_TRUE(a == 1 || a == 2);
    ++count[infer::sample_token(logits.data(), 5, infer::SamplingOptions{}, d)];
  }
  double z = 0;
  for (float l : logits) z += std::exp(l);
  for (int v = 0; v < 5; ++v) EXPECT_NEAR(count[v] / 4000.0, std::exp(logits[v]) / z, 0.03) << v;
}

// min-p keeps the tokens at least min_p as likely as the best: at 0.5 with probabilities
// proportional to e^2, e^1.9 and smaller, only ids 1 and 2 (planted: the cut at p[0] instead of
// min_p x p[0], caught).
TEST(Sampling, MinPKeepsOnlyTokensNearTheBest) {
  std::vector<float> logits = {0.1f, 2.0f, 1.9f, -1.0f, 0.5f};
  infer::SamplingOptions o;
  o.min_p = 0.5;  // e^(1.9-2) = 0.90 stays, e^(0.5-2) = 0.22 goes
  bool saw2 = false;
  for (uint64_t d = 0; d < 400; ++d) {
    const int32_t a = infer::sample_token(logits.data(), 5, o, d);
    EXPECT_TRUE(a == 1 || a == 2) << a;
    saw2 = saw2 || a == 2;
  }
  EXPECT_TRUE(saw2);
}

// The penalties as their definitions say, on a hand-made history (planted: repetition dividing
// negative logits too, and frequency not scaled by the count: both caught).
TEST(Sampling, RepetitionPresenceAndFrequencyPenalties) {
  infer::SamplingOptions o;
  o.repetition_penalty = 2.0;
  {
    infer::TokenHistory h(o, 6, {1, 3});
    std::vector<float> l = {1, 4, 1, -3, 1, 1};
    h.penalize(l.data());
    EXPECT_EQ(l, (std::vector<float>{1, 2, 1, -6, 1, 1}));  // seen in the prompt: 4 / 2, -3 x 2
  }
  infer::SamplingOptions q;
  q.presence_penalty = 0.5;
  q.frequency_penalty = 0.25;
  infer::TokenHistory h(q, 6, {0});  // the prompt does not count for these
  for (int32_t id : {2, 2, 2, 4}) h.add_generated(id);
  std::vector<float> l(6, 1.0f);
  h.penalize(l.data());
  EXPECT_EQ(l, (std::vector<float>{1, 1, 1 - 0.5f - 0.75f, 1, 1 - 0.5f - 0.25f, 1}));
  // Off: nothing changes, whatever was seen.
  infer::TokenHistory off(infer::SamplingOptions{}, 6, {1, 2});
  off.add_generated(2);
  std::vector<float> same(6, 1.5f);
  off.penalize(same.data());
  EXPECT_EQ(same, std::vector<float>(6, 1.5f));
}

// In generation: a strong presence penalty forbids greedy decoding from repeating a token it
// already produced (while the vocabulary lasts; planted: penalize() not called, caught).
TEST(Generate, PresencePenaltyStopsGreedyRepeats) {
  models::TransformerModel m(tiny("llama-tiny"));
  m.init_weights(4);
  infer::SamplingOptions o;
  o.temperature = 0;
  o.max_new_tokens = 30;
  o.presence_penalty = 1e4;  // beyond any logit gap of this model (its logits are O(1))
  const auto ids = infer::generate(m, {72, 101}, o);
  std::vector<int32_t> sorted = ids;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "a token repeated";
  o.presence_penalty = 0;  // without it this model's greedy output does repeat: the test can fail
  std::vector<int32_t> plain = infer::generate(m, {72, 101}, o);
  std::sort(plain.begin(), plain.end());
  EXPECT_NE(std::adjacent_find(plain.begin(), plain.end()), plain.end());
}

TEST(Generate, SameSeedSameTextAndGreedyIsDeterministic) {
  models::TransformerModel m(tiny("llama-tiny"));
  m.init_weights(4);
  infer::SamplingOptions o;
  o.seed = 9;
  o.max_new_tokens = 20;
  auto a = infer::generate(m, {72, 101, 108}, o);
  auto b = infer::generate(m, {72, 101, 108}, o);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.size(), 20u);
  o.seed = 10;
  EXPECT_NE(infer::generate(m, {72, 101, 108}, o), a);
  // Greedy output of the cache path equals argmax of a fresh full prefill at every step.
  o.temperature = 0;
  auto g = infer::generate(m, {72, 101, 108}, o);
  std::vector<int32_t> seq = {72, 101, 108};
  for (int32_t next : g) {
    auto caches = m.new_kv_caches(1, 64);
    Tensor logits = m.forward_cached(caches, ids(seq));
    EXPECT_EQ(next, infer::sample_token(logits.data<float>(), 257, o, 0));
    seq.push_back(next);
  }
}

// Greedy decoding (the prompt's prefill on the GEMM path, then one token per step on the GEMV and
// decode-attention path) picks, at every position, the argmax of the training forward's logits
// over the whole sequence, in f32 and with bf16 compute weights. Decoding attends in f32 over its
// f32 KV cache, so the training forward does too here (with bf16 activations it attends in bf16
// where the CPU's bf16 GEMMs are native, kernels::attention_dtype: a rounding that moves near-tied
// logits of these random tiny models apart).
class GreedyDecode : public ::testing::TestWithParam<std::tuple<std::string, DType>> {};

// Forces f32 attention while alive.
struct F32Attention {
  F32Attention() { kernels::force_f32_attention(true); }
  ~F32Attention() { kernels::force_f32_attention(false); }
};

TEST_P(GreedyDecode, EqualsTheTrainingForwardsArgmaxAtEveryPosition) {
  const auto [preset, dtype] = GetParam();
  models::TransformerModel m(tiny(preset));
  m.init_weights(5);
  m.set_compute_dtype(dtype);
  const GreedyRun run = greedy_run(m);
  const auto& generated = run.generated;
  const int64_t T = static_cast<int64_t>(run.seq.size());
  models::ChunkCtx ctx;
  const F32Attention f32_attention;
  const Tensor logits = m.head().logits(m.chunk(0).forward(ctx, ids(run.seq), 1, T));
  const int64_t V = m.config().vocab_size;
  for (size_t i = 0; i < generated.size(); ++i) {
    const float* row = logits.data<float>() + run.row_of(i) * V;
    for (int64_t v = 0; v < V; ++v) ASSERT_TRUE(std::isfinite(row[v])) << "position " << i << " id " << v;
    EXPECT_EQ(generated[i], std::max_element(row, row + V) - row) << "generated token " << i;
  }
}

// A forward of up to kernels::kDecodeRows new tokens runs the one-token kernels row by row (GEMV,
// decode attention over each row's causal prefix), so its rows carry exactly the bits of one-token
// steps: speculative verification then reproduces greedy decoding in bf16 as in f32. Contiguous
// cache (every row's hidden state) and paged cache (two sequences of different lengths, their last
// rows' logits). Planted: the GEMV reading every row's x from row 0, and the decode kernel letting
// every new token see all the others (no causal offset), each caught.
TEST_P(GreedyDecode, AFewTokensAtOnceHaveTheBitsOfOneTokenSteps) {
  const auto [preset, dtype] = GetParam();
  auto c = tiny(preset);
  c.max_position_embeddings = 128;
  models::TransformerModel m(c);
  m.init_weights(9);
  m.set_compute_dtype(dtype);
  const std::vector<int32_t> prompt = {72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108};  // 11: the GEMM path
  std::vector<int32_t> more;
  for (int64_t i = 0; i < kernels::kDecodeRows; ++i) more.push_back(static_cast<int32_t>((i * 53 + 7) % 257));
  const int64_t C = c.hidden_size, T = kernels::kDecodeRows;

  auto together = m.new_kv_caches(1, 64), apart = m.new_kv_caches(1, 64);
  m.forward_cached_hidden(together, ids(prompt));
  m.forward_cached_hidden(apart, ids(prompt));
  const Tensor rows = m.forward_cached_hidden(together, ids(more));
  ASSERT_EQ(rows.size(0), T);
  const size_t row_bytes = static_cast<size_t>(C) * dtype_size(rows.dtype());
  for (int64_t t = 0; t < T; ++t) {
    const Tensor one = m.forward_cached_hidden(apart, ids({more[static_cast<size_t>(t)]}));
    EXPECT_EQ(std::memcmp(static_cast<const std::byte*>(rows.raw()) + static_cast<size_t>(t) * row_bytes, one.raw(),
                          row_bytes),
              0)
        << "row " << t;
  }

  // Paged: sequence a has the prompt, b the prompt's first 6 tokens; both then take P = T / 2 tokens
  // at once in one cache (2P rows: the linears' GEMV too), one at a time in the other.
  nn::PagedKVCache joint = m.new_paged_kv_cache(8, 16, DType::F32), steps = m.new_paged_kv_cache(8, 16, DType::F32);
  nn::PagedSequence ja, jb, sa, sb;
  for (auto* s : {&ja, &jb}) ASSERT_TRUE(joint.reserve(*s, 64));
  for (auto* s : {&sa, &sb}) ASSERT_TRUE(steps.reserve(*s, 64));
  const std::vector<int32_t> head(prompt.begin(), prompt.begin() + 6);
  for (auto [cache, a, b] : {std::tuple{&joint, &ja, &jb}, std::tuple{&steps, &sa, &sb}}) {
    m.forward_paged(*cache, {a}, ids(prompt));
    m.forward_paged(*cache, {b}, ids(head));
  }
  const int64_t P = T / 2;
  std::vector<int32_t> two_rows(more.begin(), more.begin() + P);
  two_rows.insert(two_rows.end(), more.rbegin(), more.rbegin() + P);
  Tensor two = Tensor::empty({2, P}, DType::I32);
  std::copy(two_rows.begin(), two_rows.end(), two.data<int32_t>());
  const Tensor last = m.forward_paged(joint, {&ja, &jb}, two);
  Tensor want;
  for (int64_t t = 0; t < P; ++t) {
    Tensor pair = Tensor::empty({2, 1}, DType::I32);
    pair.data<int32_t>()[0] = two_rows[static_cast<size_t>(t)];
    pair.data<int32_t>()[1] = two_rows[static_cast<size_t>(P + t)];
    want = m.forward_paged(steps, {&sa, &sb}, pair);
  }
  ASSERT_EQ(last.nbytes(), want.nbytes());
  EXPECT_EQ(std::memcmp(last.raw(), want.raw(), want.nbytes()), 0) << "paged rows differ from one-token steps";
}

// Each generated token's logprob and its top alternatives are the log-softmax of the training
// forward's logits at its position (temperature 1, untruncated: also when the token was sampled at
// temperature 0.7 from the top 5). Planted: the logprobs scaled by 1 / 0.7, caught.
TEST_P(GreedyDecode, LogprobsAreTheTrainingForwardsLogSoftmax) {
  const auto [preset, dtype] = GetParam();
  models::TransformerModel m(tiny(preset));
  m.init_weights(5);
  m.set_compute_dtype(dtype);
  const std::vector<int32_t> prompt = {72, 101, 108, 108};
  for (const double temperature : {0.0, 0.7}) {
    infer::SamplingOptions o;
    o.temperature = temperature;
    o.top_k = 5;
    o.max_new_tokens = 20;
    o.logprobs = 3;
    std::vector<infer::GeneratedToken> got;
    const auto out = infer::generate(m, prompt, o, [&](const infer::GeneratedToken& t) {
      got.push_back(t);
      return true;
    });
    ASSERT_EQ(got.size(), out.size());
    std::vector<int32_t> seq = prompt;
    seq.insert(seq.end(), out.begin(), out.end() - 1);
    const int64_t T = static_cast<int64_t>(seq.size()), V = m.config().vocab_size;
    models::ChunkCtx ctx;
    const Tensor logits = m.head().logits(m.chunk(0).forward(ctx, ids(seq), 1, T));
    for (size_t i = 0; i < got.size(); ++i) {
      const float* row = logits.data<float>() + (static_cast<int64_t>(prompt.size() + i) - 1) * V;
      double mx = row[0], z = 0;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, double(row[v]));
      for (int64_t v = 0; v < V; ++v) z += std::exp(row[v] - mx);
      const auto want = [&](int32_t v) { return row[v] - mx - std::log(z); };
      // The cached decode and the training forward round apart: bf16 logits of these sharp models
      // differ by up to 0.06 (deepseek-v3-tiny), f32 by under 1e-5.
      const double tol = dtype == DType::BF16 ? 0.15 : 1e-4;
      ASSERT_TRUE(std::isfinite(got[i].logprob)) << "token " << i;
      EXPECT_NEAR(got[i].logprob, want(got[i].id), tol) << "token " << i << " at temperature " << temperature;
      ASSERT_EQ(got[i].top.size(), 3u);
      for (const infer::TokenLogprob& alt : got[i].top) EXPECT_NEAR(alt.logprob, want(alt.id), tol) << "token " << i;
      EXPECT_GE(got[i].top[0].logprob, got[i].top[1].logprob);
      EXPECT_GE(got[i].top[1].logprob, got[i].top[2].logprob);
      if (temperature == 0) {
        EXPECT_EQ(got[i].top[0].id, got[i].id) << "token " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GreedyDecode,
                         ::testing::Combine(::testing::Values("gpt-tiny", "llama-tiny", "deepseek-v3-tiny"),
                                            ::testing::Values(DType::F32, DType::BF16)),
                         [](const auto& info) {
                           std::string name = std::get<0>(info.param) + "_" + std::string(dtype_name(std::get<1>(info.param)));
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// 8-bit inference weights (int8 with a scale per row, FP8 E4M3 with a scale per 128 x 128 block):
// greedy decoding on the quantised GEMV picks, at every position, the argmax of the same quantised
// model's forward over the whole sequence (prefill's band-wise GEMM path); that forward is the fp32
// model's run on the dequantised weights (to float rounding), and its logits stay within the
// quantisation's reach of the fp32 model's. These sharp tiny models (init std 0.2) amplify weight
// noise through the layers: relative to the largest fp32 logit, measured int8 1.5% (gpt-tiny) and
// 3.5% (llama-tiny, SwiGLU multiplies two noisy projections), fp8-block 6.4% and 14%; against the
// dequantised model 0.8-2.2e-7.
class QuantizedDecode : public ::testing::TestWithParam<std::tuple<std::string, kernels::WeightQuant>> {};

using megaton::testing::relative_to_largest;

TEST_P(QuantizedDecode, EqualsItsOwnForwardsArgmaxAndTheDequantisedModel) {
  const auto [preset, q] = GetParam();
  models::TransformerModel fp32(tiny(preset)), dequantised(tiny(preset)), m(tiny(preset));
  for (auto* model : {&fp32, &dequantised, &m}) model->init_weights(5);
  const auto params_live = [] { return Allocator::host().stats().live[static_cast<size_t>(MemCategory::Params)]; };
  const size_t before = params_live();
  m.quantize_weights(q);
  // Each quantised weight but a tied head (the embedding's too) is held as its codes alone: its
  // fp32 value is freed, 3 of every 4 bytes, and f32_values reads what the codes stand for.
  size_t codes = 0;
  for (nn::Parameter* p : m.quantizable_weights()) {
    if (m.config().tie_embeddings && p == &m.head().weight()) continue;
    EXPECT_TRUE(p->value.shares_storage_with(p->quantized->codes)) << p->name;
    EXPECT_EQ(relative_to_largest(nn::f32_values(*p), kernels::dequantize_weight(*p->quantized)), 0.0) << p->name;
    codes += static_cast<size_t>(p->value.numel());
  }
  EXPECT_LE(params_live() + 2 * codes, before);
  const GreedyRun run = greedy_run(m);
  const auto& generated = run.generated;
  const auto& seq = run.seq;
  const int64_t T = static_cast<int64_t>(seq.size()), V = m.config().vocab_size;
  const auto hidden_of = [&](models::TransformerModel& model) {
    models::ChunkCtx ctx;
    return model.chunk(0).forward(ctx, ids(seq), 1, T);
  };
  const Tensor got = m.head().logits(hidden_of(m)), want_fp32 = fp32.head().logits(hidden_of(fp32));
  // The reference: every layer linear's weight replaced by what its codes stand for, and the head
  // applied to the dequantised head weight (not written back: a tied one is the embedding too).
  const nn::ParameterList params = dequantised.parameters(), quantised_params = m.parameters();
  ASSERT_EQ(params.size(), quantised_params.size());
  for (size_t i = 0; i < params.size(); ++i)
    if (quantised_params[i]->quantized && quantised_params[i] != &m.head().weight())
      params[i]->value.copy_from(kernels::dequantize_weight(*quantised_params[i]->quantized));
  dequantised.refresh_compute_weights();
  Tensor want = Tensor::empty({T, V}, DType::F32);
  kernels::linear_forward(kernels::ExecContext{}, want, hidden_of(dequantised).view({T, m.config().hidden_size}),
                          kernels::dequantize_weight(*m.head().weight().quantized), Tensor());
  EXPECT_LT(relative_to_largest(got, want), 1e-5);
  const double rel = relative_to_largest(got, want_fp32);
  EXPECT_GT(rel, 1e-4) << "the weights were not quantised";
  EXPECT_LT(rel, q == kernels::WeightQuant::Int8Row ? 0.06 : 0.25) << kernels::weight_quant_name(q);
  for (size_t i = 0; i < generated.size(); ++i) {
    const float* row = got.data<float>() + run.row_of(i) * V;
    EXPECT_EQ(generated[i], std::max_element(row, row + V) - row) << "generated token " << i;
  }
  // Training a quantised layer is refused, not run on weights that no longer exist.
  models::ModelCtx ctx;
  EXPECT_ANY_THROW(m.forward(ctx, ids(seq), ids(seq), true));
}

INSTANTIATE_TEST_SUITE_P(Models, QuantizedDecode,
                         ::testing::Combine(::testing::Values("gpt-tiny", "llama-tiny"),
                                            ::testing::Values(kernels::WeightQuant::Int8Row,
                                                              kernels::WeightQuant::Fp8Block)),
                         [](const auto& info) {
                           std::string name = std::get<0>(info.param) + "_" +
                                              std::string(kernels::weight_quant_name(std::get<1>(info.param)));
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });
