// Quantised HF folders (models/hf_quantized.h): what `megaton convert --weights-dtype fp8-block|int8`
// stores, that loading gives back exactly the values the codes stand for, and that inference
// through the stored codes equals the model run on those values.
#include "megaton/models/hf_quantized.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <tuple>

#include "../support/run_command.h"
#include "../support/temp_dir.h"
#include "../support/tiny_model.h"
#include "megaton/ckpt/safetensors.h"
#include "megaton/data/tokenizer.h"
#include "megaton/core/regular_file.h"
#include "megaton/infer/generate.h"
#include "megaton/models/hf_format.h"

using namespace megaton;
using kernels::WeightQuant;
using megaton::testing::relative_to_largest;
using megaton::testing::TempDir;

namespace {

// 2 layers of the tiny presets: llama-tiny's fused qkv [q 96 | k 32 | v 32] per kv group and its
// 1024-row gate|up straddle 128-row blocks; gpt-tiny stores Conv1D weights [in, out].
models::TransformerConfig config_of(const std::string& name) {
  auto c = models::preset(name == "llama-interleaved" ? "llama-tiny" : name);
  c.num_layers = 2;
  if (name == "llama-interleaved") c.rope_layout = kernels::RopeLayout::Interleaved;
  return c;
}

bool is_layer_weight(const std::string& name) {
  return name.find("layers.") != std::string::npos || name.find("transformer.h.") != std::string::npos
             ? name.ends_with("proj.weight") || name.ends_with("c_attn.weight") || name.ends_with("c_fc.weight")
             : name == "lm_head.weight";
}

// The final norm's output over 24 positions (the head's input).
Tensor hidden_of(models::TransformerModel& m) {
  const int64_t T = 24;
  Tensor ids = Tensor::empty({1, T}, DType::I32);
  for (int64_t t = 0; t < T; ++t) ids.data<int32_t>()[t] = static_cast<int32_t>((t * 37 + 11) % 250);
  models::ChunkCtx ctx;
  return m.chunk(0).forward(ctx, ids, 1, T);
}

// "llama_tiny_int8": a test name from a (model, quantisation) parameter.
std::string model_and_quant(const ::testing::TestParamInfo<std::tuple<std::string, WeightQuant>>& info) {
  std::string n = std::get<0>(info.param) + "_" + std::string(kernels::weight_quant_name(std::get<1>(info.param)));
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(read_regular_file(path, "test")); }
void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

}  // namespace

class HfQuantized : public ::testing::TestWithParam<std::tuple<std::string, WeightQuant>> {};

TEST_P(HfQuantized, StoresCodesAndScalesAndLoadsTheirValues) {
  const auto [name, q] = GetParam();
  const auto c = config_of(name);
  TempDir dir;
  models::TransformerModel m(c);
  m.init_weights(3);
  const std::string folder = dir.file("q");
  models::save_hf_model(m, folder, DType::BF16, q);

  const auto config = read_json(folder + "/config.json");
  EXPECT_EQ(config["quantization_config"], models::quantization_config(q));
  const auto stored = ckpt::load_safetensors(folder + "/model.safetensors");
  const std::map<std::string, Tensor> f32 = [&] {
    std::map<std::string, Tensor> t;
    for (auto& [n, v] : models::to_hf_tensors(m)) t.emplace(n, v);
    return t;
  }();
  int quantised = 0;
  for (const auto& [n, w] : f32) {
    const Tensor& s = stored.at(n);
    if (!is_layer_weight(n)) {
      EXPECT_EQ(s.dtype(), DType::BF16) << n;
      EXPECT_FALSE(stored.count(models::scale_inv_name(n))) << n;
      continue;
    }
    ++quantised;
    ASSERT_EQ(s.dtype(), q == WeightQuant::Int8Row ? DType::I8 : DType::F8E4M3) << n;
    const bool transposed = name == "gpt-tiny";
    const auto sq = models::check_stored(s, stored.at(models::scale_inv_name(n)), q, transposed, n, "test");
    // Each value within half a quantum of the f32 weight: int8's quantum is the scale; E4M3's is
    // 2^-3 of the code's binade (2^-9 below the normal range), times the scale.
    const Tensor deq = models::dequantize_stored(sq);
    const auto* codes = static_cast<const uint8_t*>(s.raw());
    for (int64_t i = 0; i < w.numel(); ++i) {
      const int64_t r = i / w.size(1), k = i % w.size(1);
      const float code = models::decode_code(codes[i], s.dtype());
      const double quantum =
          q == WeightQuant::Int8Row ? 1.0 : std::ldexp(1.0, std::max(std::ilogb(std::max(std::abs(code), 1e-30f)), -6) - 3);
      ASSERT_LE(std::abs(deq.data<float>()[i] - w.data<float>()[i]), 0.5 * quantum * sq.scale(r, k) * (1 + 1e-6))
          << n << " element " << i;
    }
    if (transposed && q == WeightQuant::Int8Row) {
      EXPECT_EQ(sq.scale_inv.size(0), 1) << n << ": one scale per output";
    }
  }
  // GPT-2: c_attn, attn.c_proj, c_fc, mlp.c_proj (tied head); Llama: q, k, v, o, gate, up, down and lm_head.
  const bool gpt = c.position_embedding == models::PositionEmbedding::LearnedAbsolute;
  ASSERT_FALSE(gpt ? !c.tie_embeddings : c.tie_embeddings);
  EXPECT_EQ(quantised, gpt ? 4 * c.num_layers : 7 * c.num_layers + 1);

  // Loaded: each weight holds exactly what its stored codes stand for, in Megaton's layout; the
  // codes handed back (row-level scales) stand for the same values.
  models::HfFolder loaded = models::load_hf_folder(folder);
  ASSERT_EQ(loaded.quantization, q);
  for (auto& [n, v] : models::to_hf_tensors(*loaded.model)) {
    const Tensor& s = stored.at(n);
    const Tensor want = is_layer_weight(n) ? models::dequantize_stored(models::check_stored(
                                                 s, stored.at(models::scale_inv_name(n)), q, name == "gpt-tiny", n, "t"))
                                           : s.to(DType::F32);
    ASSERT_EQ(std::memcmp(v.raw(), want.raw(), want.nbytes()), 0) << n;
  }
  EXPECT_EQ(loaded.quantized.size(), static_cast<size_t>(gpt ? 4 * c.num_layers : 4 * c.num_layers + 1));
  for (const auto& [param, w] : loaded.quantized) {
    // Rows that share their stored block's scales share one scale row again (kernels::with_row_bands):
    // 128-row bands, or a head's rows in the fused qkv, whose heads of q, k and v alternate. int8's
    // scales are per row. Planted (the banding skipped): caught.
    const bool qkv = param->name.find("linear_qkv") != std::string::npos;
    EXPECT_EQ(w->block_rows, q == WeightQuant::Int8Row ? 1 : qkv ? c.head_dim() : 128) << param->name;
    const Tensor values = kernels::dequantize_weight(*w);
    ASSERT_EQ(std::memcmp(values.raw(), param->value.raw(), values.nbytes()), 0) << param->name;
  }

  // Inference through the stored codes equals the model on their values, and is the quantised
  // model, not the fp32 one.
  // A tied head is not stored in 8 bits (it is the embedding) but quantised on install, so the
  // head's input is what must agree.
  const Tensor on_values = hidden_of(*loaded.model);
  loaded.model->install_quantized_weights(q, loaded.quantized);
  for (nn::Parameter* p : loaded.model->quantizable_weights()) {
    ASSERT_TRUE(p->quantized) << p->name;
    if (!c.tie_embeddings || p != &loaded.model->output_weight()) {
      EXPECT_EQ(p->quantized, loaded.quantized.at(p)) << p->name;
    }
  }
  const Tensor on_codes = hidden_of(*loaded.model);
  EXPECT_LT(relative_to_largest(on_codes, on_values), 1e-5);
  const double off = relative_to_largest(loaded.model->head().logits(on_codes), m.head().logits(hidden_of(m)));
  EXPECT_GT(off, 1e-4) << "the weights were not quantised";
  EXPECT_LT(off, q == WeightQuant::Int8Row ? 0.06 : 0.25);
}

INSTANTIATE_TEST_SUITE_P(Models, HfQuantized,
                         ::testing::Combine(::testing::Values("gpt-tiny", "llama-tiny", "llama-interleaved"),
                                            ::testing::Values(WeightQuant::Int8Row, WeightQuant::Fp8Block)),
                         model_and_quant);

// Served as stored (ServeWeights::codes): each quantised weight is held as its codes alone, the very
// storage the kernels read (a view of the file where it lies in the run's layout), with no dequantised
// f32 copy; greedy decoding equals the model that keeps
// the dequantised values, in fp32 and in bf16 (MLA's absorbed products from the codes' values).
// A tied embedding stays the file's bf16 in both.
class HfQuantizedServed : public ::testing::TestWithParam<std::tuple<std::string, WeightQuant>> {};

TEST_P(HfQuantizedServed, HoldsTheCodesAloneAndDecodesTheSame) {
  const auto [name, q] = GetParam();
  TempDir dir;
  models::TransformerModel m(config_of(name));
  m.init_weights(5);
  const std::string folder = dir.file("q");
  models::save_hf_model(m, folder, DType::BF16, q);
  const DType code = q == WeightQuant::Int8Row ? DType::I8 : DType::F8E4M3;
  for (const DType precision : {DType::F32, DType::BF16}) {
    models::HfFolder kept = models::load_hf_folder(folder, /*gradients=*/false);
    kept.model->install_quantized_weights(q, kept.quantized);
    kept.model->set_compute_dtype(precision);
    models::HfFolder held = models::load_hf_folder(folder, /*gradients=*/false, {precision, /*codes=*/true});
    ASSERT_EQ(held.quantized.size(), kept.quantized.size());
    held.model->install_quantized_weights(q, held.quantized);
    held.model->set_compute_dtype(precision);
    int mapped = 0;
    for (const auto& [param, w] : held.quantized) {
      mapped += param->value.borrowed();
      EXPECT_EQ(param->value.dtype(), code) << param->name << ": no dequantised copy";
      EXPECT_TRUE(param->value.shares_storage_with(param->quantized->codes)) << param->name;
      EXPECT_EQ(param->quantized, w) << param->name;
      EXPECT_FALSE(param->compute.defined()) << param->name;
      EXPECT_TRUE(relative_to_largest(nn::f32_values(*param), kernels::dequantize_weight(*w)) == 0) << param->name;
    }
    // A tied head is quantised from the embedding, whose table the fp32 run holds as the file's bf16
    // too (planted: widened to f32, caught).
    if (held.model->config().tie_embeddings) {
      EXPECT_EQ(held.model->embedding().word.value.dtype(), DType::BF16);
      EXPECT_TRUE(held.model->embedding().word.value.borrowed());
    }
    // Codes in the run's layout are views of the file (o_proj, down_proj, [gate | up]); GPT-2's Conv1D
    // weights are stored transposed, so copied.
    if (name == "gpt-tiny")
      EXPECT_EQ(mapped, 0);
    else
      EXPECT_GT(mapped, 0);
    infer::SamplingOptions o;
    o.temperature = 0;
    o.max_new_tokens = 12;
    const std::vector<int32_t> prompt = {7, 19, 3, 250};
    const auto ids = infer::generate(*held.model, prompt, o);
    EXPECT_EQ(ids.size(), 12u);
    EXPECT_EQ(ids, infer::generate(*kept.model, prompt, o)) << dtype_name(precision);
  }
  EXPECT_THROW(models::load_hf_folder(folder, /*gradients=*/true, {DType::F32, /*codes=*/true}), std::exception);
}

INSTANTIATE_TEST_SUITE_P(Models, HfQuantizedServed,
                         ::testing::Combine(::testing::Values("gpt-tiny", "llama-tiny", "deepseek-v3-tiny"),
                                            ::testing::Values(WeightQuant::Int8Row, WeightQuant::Fp8Block)),
                         model_and_quant);

// A folder whose stored weights do not add up is refused by name, never loaded half-scaled.
TEST(HfQuantizedErrors, NameWhatIsWrong) {
  TempDir dir;
  models::TransformerModel m(config_of("llama-tiny"));
  m.init_weights(4);
  const std::string good = dir.file("good");
  models::save_hf_model(m, good, DType::BF16, WeightQuant::Fp8Block);
  const auto tensors = ckpt::load_safetensors(good + "/model.safetensors");
  const std::string q = "model.layers.0.self_attn.q_proj.weight", k = "model.layers.0.self_attn.k_proj.weight";
  int n = 0;
  // A copy of the good folder with its tensors edited, or its config.
  auto expect_refused = [&](const std::function<void(std::map<std::string, Tensor>&, nlohmann::json&)>& edit,
                            const std::string& message) {
    const std::string bad = dir.file("bad" + std::to_string(++n));
    std::filesystem::create_directories(bad);
    auto t = tensors;
    auto config = read_json(good + "/config.json");
    edit(t, config);
    std::vector<std::pair<std::string, Tensor>> list(t.begin(), t.end());
    ckpt::save_safetensors(bad + "/model.safetensors", list);
    write_text(bad + "/config.json", config.dump());
    try {
      models::load_hf_folder(bad);
      ADD_FAILURE() << "loaded; expected an error containing: " << message;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  };
  expect_refused([](auto&, auto& config) { config.erase("quantization_config"); }, "no quantization_config");
  expect_refused([&](auto& t, auto&) { t.erase(models::scale_inv_name(q)); }, models::scale_inv_name(q) + "' is missing");
  expect_refused([&](auto& t, auto&) { t[models::scale_inv_name(q)] = Tensor::zeros({1, 2}, DType::F32); },
                 "expected F32 [2, 2]");
  expect_refused(
      [&](auto& t, auto&) {
        Tensor s = t.at(models::scale_inv_name(q)).to(DType::F32);
        s.data<float>()[3] = NAN;
        t[models::scale_inv_name(q)] = s;
      },
      "must be finite");
  expect_refused(
      [&](auto& t, auto&) {
        Tensor c = t.at(q).to(DType::F8E4M3);
        static_cast<uint8_t*>(c.raw())[7] = 0xff;
        t[q] = c;
      },
      "NaN code at element 7");
  // k_proj in f32 beside a quantised q_proj: one fused weight, half of it unscaled.
  expect_refused(
      [&](auto& t, auto&) {
        t[k] = t.at(k).to(DType::F32);
        t.erase(models::scale_inv_name(k));
      },
      "stored partly quantised");
  expect_refused([](auto&, auto& config) { config["quantization_config"]["weight_block_size"] = {1, 128}; },
                 "weight_block_size [1,128] is not supported");
  expect_refused([](auto&, auto& config) { config["quantization_config"]["quant_method"] = "gptq"; },
                 "quant_method \"gptq\" is not supported");
}

// `megaton convert` re-stores an HF folder in 8 bits; `generate` then decodes through the stored codes.
TEST(HfQuantizedCli, ConvertThenGenerate) {
  TempDir dir;
  models::TransformerModel m(config_of("llama-tiny"));
  m.init_weights(6);
  models::save_hf_model(m, dir.file("f32"));
  const std::string bin = MEGATON_BINARY;
  const auto convert = megaton::testing::run_command(bin + " convert --input " + dir.file("f32") + " --output " +
                                                     dir.file("fp8") + " --weights-dtype fp8-block");
  ASSERT_EQ(convert.exit_code, 0) << convert.output;
  const auto r = megaton::testing::run_command(bin + " generate --model " + dir.file("fp8") +
                                               " --prompt Hello --max-new-tokens 24 --temperature 0 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  models::HfFolder f = models::load_hf_folder(dir.file("fp8"));
  f.model->install_quantized_weights(*f.quantization, f.quantized);
  infer::SamplingOptions o;
  o.temperature = 0;
  o.max_new_tokens = 24;
  o.stop_token = data::make_tokenizer("byte")->eod();
  const auto prompt = data::make_tokenizer("byte")->encode("Hello");
  EXPECT_EQ(nlohmann::json::parse(r.output)["ids"].get<std::vector<int32_t>>(), infer::generate(*f.model, prompt, o));
  // Into a folder that holds something: refused, nothing overwritten.
  const auto again = megaton::testing::run_command(bin + " convert --input " + dir.file("f32") + " --output " +
                                                   dir.file("fp8") + " --weights-dtype int8");
  EXPECT_NE(again.exit_code, 0);
  EXPECT_EQ(read_json(dir.file("fp8") + "/config.json")["quantization_config"]["quant_method"], "fp8");
}
