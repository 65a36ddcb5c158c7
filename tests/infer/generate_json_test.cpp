// `megaton generate --json`: one JSON object with the timings and the generated ids and text, the
// ids those of greedy generation in-process from the same saved model.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "../support/run_command.h"
#include "../support/temp_dir.h"
#include "../support/tiny_model.h"
#include "megaton/data/tokenizer.h"
#include "megaton/infer/generate.h"
#include "megaton/kernels/quantized_linear.h"
#include "megaton/models/hf_format.h"

using namespace megaton;

namespace {

bool positive_finite(const nlohmann::json& v) { return v.is_number() && std::isfinite(v.get<double>()) && v > 0; }

}  // namespace

TEST(GenerateJson, PrintsTimingsTextAndTheGreedyIds) {
  megaton::testing::TempDir dir;
  auto config = megaton::testing::tiny_config("llama-tiny");
  config.init_method_std = 0.2;
  models::TransformerModel m(config);
  m.init_weights(6);
  models::save_hf_model(m, dir.file("model"));

  const auto r = megaton::testing::run_command(std::string(MEGATON_BINARY) + " generate --model " + dir.file("model") +
                                      " --prompt Hello --max-new-tokens 12 --temperature 0 --json --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);  // the whole output is one object
  for (const char* key : {"load_s", "prefill_s", "prefill_tokens_per_s"}) EXPECT_TRUE(positive_finite(j[key])) << key;
  EXPECT_EQ(j["prompt_tokens"], 5);
  EXPECT_EQ(j["threads"], 2);

  const auto tok = data::make_tokenizer("byte");
  auto loaded = models::load_hf_model(dir.file("model"));
  infer::SamplingOptions o;
  o.temperature = 0;
  o.max_new_tokens = 12;
  o.stop_token = tok->eod();
  const std::vector<int32_t> want = infer::generate(*loaded, tok->encode("Hello"), o);
  ASSERT_EQ(j["ids"].get<std::vector<int32_t>>(), want);
  EXPECT_EQ(j["decode_tokens"], static_cast<int64_t>(want.size()) - 1);
  if (want.size() > 1) {
    EXPECT_TRUE(positive_finite(j["decode_s"]));
    EXPECT_TRUE(positive_finite(j["decode_tokens_per_s"]));
    EXPECT_NEAR(j["decode_tokens_per_s"].get<double>(), j["decode_tokens"].get<double>() / j["decode_s"].get<double>(),
                1e-9 * j["decode_tokens_per_s"].get<double>());
  }
  // The decoded continuation, its bytes that are not UTF-8 (a random byte model emits many) replaced.
  const std::string text =
      nlohmann::json(tok->decode(want)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  EXPECT_EQ(j["text"], nlohmann::json::parse(text));
}

// --prompt-ids feeds ids as they are (another tool's prompt, e.g. a lone BOS): the same continuation as
// the text that encodes to them; ids beyond the vocabulary and a missing prompt are errors.
TEST(GenerateJson, PromptIdsAreThePromptsTokens) {
  megaton::testing::TempDir dir;
  auto config = megaton::testing::tiny_config("gpt-tiny");
  config.init_method_std = 0.2;  // sharp: the continuation depends on every prompt token
  models::TransformerModel m(config);
  m.init_weights(7);
  models::save_hf_model(m, dir.file("model"));
  const std::string gen = std::string(MEGATON_BINARY) + " generate --model " + dir.file("model") +
                          " --max-new-tokens 6 --temperature 0 --json ";
  const auto ids = [](const megaton::testing::CommandResult& r) {
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return nlohmann::json::parse(r.output)["ids"].get<std::vector<int32_t>>();
  };
  const auto from_ids = ids(megaton::testing::run_command(gen + "--prompt-ids 72,105"));
  EXPECT_EQ(from_ids, ids(megaton::testing::run_command(gen + "--prompt Hi")));
  EXPECT_NE(from_ids, ids(megaton::testing::run_command(gen + "--prompt-ids 105")));
  const auto big = megaton::testing::run_command(gen + "--prompt-ids 72,300");
  EXPECT_NE(big.exit_code, 0);
  EXPECT_NE(big.output.find("--prompt-ids: id 300 is out of range: the model's vocab_size is 257"), std::string::npos)
      << big.output;
  const auto none = megaton::testing::run_command(gen);
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.output.find("generate needs --prompt TEXT or --prompt-ids IDS"), std::string::npos) << none.output;
}

// A model vocabulary larger than the tokenizer's (padded, or another tokenizer's): only ids the
// tokenizer can decode are generated.
TEST(GenerateJson, GeneratesOnlyIdsTheTokenizerDecodes) {
  megaton::testing::TempDir dir;
  auto config = megaton::testing::tiny_config("llama-tiny");
  config.vocab_size = 1000;
  config.init_method_std = 0.2;
  models::TransformerModel m(config);
  m.init_weights(8);
  models::save_hf_model(m, dir.file("model"));
  const auto r = megaton::testing::run_command(std::string(MEGATON_BINARY) + " generate --model " + dir.file("model") +
                                               " --prompt Hello --max-new-tokens 20 --temperature 0 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto ids = nlohmann::json::parse(r.output)["ids"].get<std::vector<int32_t>>();
  EXPECT_EQ(ids.size(), 20u);
  for (int32_t id : ids) EXPECT_LT(id, 257);
}

// --precision bf16 decodes with the bf16 compute copies: the ids of in-process bf16 generation,
// which differ from fp32's for this model (so the flag cannot be silently ignored).
TEST(GenerateJson, PrecisionBf16UsesTheBf16Weights) {
  megaton::testing::TempDir dir;
  auto config = megaton::testing::tiny_config("llama-tiny");
  config.init_method_std = 0.05;  // flat enough that bf16 rounding changes some greedy picks
  models::TransformerModel m(config);
  m.init_weights(9);
  models::save_hf_model(m, dir.file("model"));
  const auto r = megaton::testing::run_command(std::string(MEGATON_BINARY) + " generate --model " + dir.file("model") +
                                               " --prompt Hello --max-new-tokens 40 --temperature 0 --json --precision bf16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["precision"], "bf16");
  auto loaded = models::load_hf_model(dir.file("model"));
  infer::SamplingOptions o;
  o.temperature = 0;
  o.max_new_tokens = 40;
  o.stop_token = data::make_tokenizer("byte")->eod();
  const auto prompt = data::make_tokenizer("byte")->encode("Hello");
  const auto fp32 = infer::generate(*loaded, prompt, o);
  loaded->set_compute_dtype(DType::BF16);
  const auto bf16 = infer::generate(*loaded, prompt, o);
  ASSERT_NE(fp32, bf16) << "pick a model whose bf16 greedy ids differ from fp32's";
  EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(), bf16);
}

// --weights-dtype int8 / fp8-block decode on 8-bit weights: the ids of in-process generation with
// the same quantisation, which differ from fp32's for this model (the flag cannot be ignored).
TEST(GenerateJson, WeightsDtypeQuantisesTheWeights) {
  megaton::testing::TempDir dir;
  auto config = megaton::testing::tiny_config("llama-tiny");
  config.init_method_std = 0.05;  // flat enough that quantisation changes some greedy picks
  models::TransformerModel m(config);
  m.init_weights(9);
  models::save_hf_model(m, dir.file("model"));
  infer::SamplingOptions o;
  o.temperature = 0;
  o.max_new_tokens = 40;
  o.stop_token = data::make_tokenizer("byte")->eod();
  const auto prompt = data::make_tokenizer("byte")->encode("Hello");
  const auto fp32 = infer::generate(*models::load_hf_model(dir.file("model")), prompt, o);
  for (const char* dtype : {"int8", "fp8-block"}) {
    const auto r = megaton::testing::run_command(std::string(MEGATON_BINARY) + " generate --model " + dir.file("model") +
                                                 " --prompt Hello --max-new-tokens 40 --temperature 0 --json --weights-dtype " +
                                                 dtype);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto j = nlohmann::json::parse(r.output);
    EXPECT_EQ(j["weights_dtype"], dtype);
    auto loaded = models::load_hf_model(dir.file("model"));
    loaded->quantize_weights(kernels::weight_quant_from_name(dtype));
    const auto quantised = infer::generate(*loaded, prompt, o);
    ASSERT_NE(fp32, quantised) << "pick a model whose " << dtype << " greedy ids differ from fp32's";
    EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(), quantised) << dtype;
  }
  const auto bad = megaton::testing::run_command(std::string(MEGATON_BINARY) + " generate --model " + dir.file("model") +
                                                 " --prompt Hello --weights-dtype int4");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--weights-dtype"), std::string::npos) << bad.output;
}

// --kv-cache-dtype bf16 on an f32 model: the ids of in-process generation with a bf16 cache, and
// log-probabilities that differ from the f32 cache's (the flag cannot be silently ignored; planted:
// the option parsed but not applied, caught); fp8 is refused (contiguous caches hold f32 or bf16).
TEST(GenerateJson, KvCacheDtypeBf16RoundsTheCache) {
  megaton::testing::TempDir dir;
  models::TransformerModel m(megaton::testing::tiny_config("llama-tiny"));
  m.init_weights(9);
  models::save_hf_model(m, dir.file("model"));
  infer::SamplingOptions o;
  o.temperature = 0;
  o.max_new_tokens = 30;
  o.stop_token = -1;
  auto loaded = models::load_hf_model(dir.file("model"));
  loaded->set_kv_cache_dtype(DType::BF16);
  const auto bf16 = infer::generate(*loaded, data::make_tokenizer("byte")->encode("Hello"), o);
  const auto run = [&](const char* kv) {
    const auto r =
        megaton::testing::run_command(std::string(MEGATON_BINARY) + " generate --model " + dir.file("model") +
                                      " --prompt Hello --max-new-tokens 30 --temperature 0 --json --ignore-eos "
                                      "--logprobs 0 --kv-cache-dtype " +
                                      kv);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return nlohmann::json::parse(r.output);
  };
  const auto j = run("bf16"), f32 = run("f32");
  EXPECT_EQ(j["kv_cache_dtype"], "bf16");
  EXPECT_EQ(f32["kv_cache_dtype"], "f32");
  EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(), bf16);
  ASSERT_EQ(j["logprobs"].size(), f32["logprobs"].size());
  int differ = 0;
  for (size_t i = 0; i < j["logprobs"].size(); ++i)
    differ += j["logprobs"][i]["logprob"] != f32["logprobs"][i]["logprob"];
  EXPECT_GT(differ, 0) << "the bf16 cache's log-probabilities equal the f32 cache's";
  const auto bad = megaton::testing::run_command(std::string(MEGATON_BINARY) + " generate --model " +
                                                 dir.file("model") + " --prompt Hello --kv-cache-dtype fp8");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--kv-cache-dtype"), std::string::npos) << bad.output;
}

// --draft-model: the main model's greedy ids, with the draft's acceptance reported; the main model
// as its own draft has every proposal accepted.
TEST(GenerateJson, DraftModelGivesTheGreedyIdsAndItsAcceptance) {
  megaton::testing::TempDir dir;
  models::TransformerModel m(megaton::testing::tiny_config("llama-tiny")), small([] {
    auto c = megaton::testing::tiny_config("llama-tiny");
    c.num_layers = 1;
    return c;
  }());
  m.init_weights(9);
  small.init_weights(3);
  models::save_hf_model(m, dir.file("main"));
  models::save_hf_model(small, dir.file("draft"));
  const std::string base = std::string(MEGATON_BINARY) + " generate --model " + dir.file("main") +
                           " --prompt Hello --max-new-tokens 30 --temperature 0 --json";
  const auto plain = megaton::testing::run_command(base);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const auto want = nlohmann::json::parse(plain.output)["ids"];
  for (const char* draft : {"main", "draft"}) {
    const auto r = megaton::testing::run_command(base + " --draft-model " + dir.file(draft) + " --draft-tokens 3");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto j = nlohmann::json::parse(r.output);
    EXPECT_EQ(j["ids"], want) << draft;
    EXPECT_GT(j["speculative"]["drafted"], 0) << draft;
    if (std::string(draft) == "main") {
      EXPECT_EQ(j["speculative"]["acceptance_rate"], 1.0);
    }
  }
  const auto sampled = megaton::testing::run_command(std::string(MEGATON_BINARY) + " generate --model " +
                                                     dir.file("main") + " --prompt Hello --temperature 0.5 --draft-model " +
                                                     dir.file("draft"));
  EXPECT_NE(sampled.exit_code, 0);
  EXPECT_NE(sampled.output.find("greedily"), std::string::npos) << sampled.output;
}

// --ignore-eos: a model whose greedy text ends at the end-of-document token within 40 tokens goes on
// to all 40, the first ones unchanged.
TEST(GenerateJson, IgnoreEosGoesOnToMaxNewTokens) {
  megaton::testing::TempDir dir;
  auto config = megaton::testing::tiny_config("llama-tiny");
  config.init_method_std = 0.5;
  const auto tok = data::make_tokenizer("byte");
  infer::SamplingOptions o;
  o.temperature = 0;
  o.max_new_tokens = 40;
  o.stop_token = tok->eod();
  const auto prompt = tok->encode("Hello");
  std::vector<int32_t> stopped;
  for (uint64_t seed = 1; seed < 200 && (stopped.empty() || stopped.size() == 40u); ++seed) {
    models::TransformerModel m(config);
    m.init_weights(seed);
    // Make the end-of-document token likely, so some seed stops early.
    float* head = m.output_weight().value.data<float>() + static_cast<int64_t>(tok->eod()) * config.hidden_size;
    for (int64_t i = 0; i < config.hidden_size; ++i) head[i] *= 4.0f;
    stopped = infer::generate(m, prompt, o);
    if (stopped.size() < 40u) models::save_hf_model(m, dir.file("model"));
  }
  ASSERT_LT(stopped.size(), 40u) << "no seed stopped early";
  ASSERT_EQ(stopped.back(), tok->eod());
  const auto r = megaton::testing::run_command(std::string(MEGATON_BINARY) + " generate --model " + dir.file("model") +
                                               " --prompt Hello --max-new-tokens 40 --temperature 0 --json --ignore-eos");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto ids = nlohmann::json::parse(r.output)["ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), 40u);
  EXPECT_TRUE(std::equal(stopped.begin(), stopped.end(), ids.begin()));
}
