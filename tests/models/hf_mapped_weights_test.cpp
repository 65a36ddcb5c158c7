// Weights served straight from a memory-mapped model.safetensors: tensors stored in the dtype and
// layout the run uses are views of the file (no copy, no clearing at start-up), the rest are copied
// from the mapping; writes never reach the file; what the model computes is bitwise what a copying
// load computes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <tuple>

#include "../support/byte_dataset.h"
#include "../support/temp_dir.h"
#include "../support/tiny_model.h"
#include "megaton/ckpt/safetensors.h"
#include "megaton/data/token_stream.h"
#include "megaton/infer/generate.h"
#include "megaton/models/hf_format.h"
#include "megaton/train/evaluate.h"

using namespace megaton;
using megaton::testing::TempDir;

namespace {

std::set<std::string> borrowed_values(models::TransformerModel& m) {
  std::set<std::string> out;
  for (const nn::Parameter* p : m.parameters())
    if (p->value.borrowed()) out.insert(p->name);
  return out;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

double loss_of(models::TransformerModel& m, const std::string& dataset) {
  data::StreamSamples stream(std::make_shared<data::TokenStream>(dataset), 32);
  return train::evaluate(m, stream, 4, 8).loss;
}

}  // namespace

TEST(MappedSafetensors, MapViewsTheFileAndWritesNeverReachIt) {
  TempDir dir;
  Tensor a = Tensor::empty({3, 5}, DType::F32, MemCategory::Other, "a");
  for (int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] = 0.5f * static_cast<float>(i);
  ckpt::save_safetensors(dir.file("t.safetensors"), {{"a", a}, {"b", a.to(DType::BF16)}});
  const std::string bytes = megaton::testing::read_bytes(dir.file("t.safetensors"));
  {
    ckpt::SafetensorsReader reader(dir.file("t.safetensors"));
    Tensor m = reader.map("a");
    ASSERT_TRUE(m.borrowed());
    EXPECT_TRUE(same_bytes(m, reader.read("a")));
    EXPECT_TRUE(same_bytes(reader.map("b"), a.to(DType::BF16)));
    m.data<float>()[7] = -1.0f;  // copy-on-write: this process's page only
    EXPECT_EQ(reader.map("a").data<float>()[7], -1.0f);
    EXPECT_EQ(reader.read("a").data<float>()[7], 3.5f);
  }
  EXPECT_EQ(megaton::testing::read_bytes(dir.file("t.safetensors")), bytes);
}

// A mapped file truncated under the process: reading a page past its new end ends the process with
// an error naming the file (exit 1), not a bare SIGBUS (planted: no handler installed, caught as
// death by signal).
TEST(MappedSafetensors, AFileTruncatedWhileMappedEndsTheProcessNamingIt) {
  TempDir dir;
  Tensor a = Tensor::zeros({1 << 16}, DType::F32, MemCategory::Other, "a");  // 256 KiB: many pages
  ckpt::save_safetensors(dir.file("t.safetensors"), {{"a", a}});
  ckpt::SafetensorsReader reader(dir.file("t.safetensors"));
  const Tensor m = reader.map("a");
  ASSERT_TRUE(m.borrowed());
  EXPECT_EXIT(
      {
        if (truncate(dir.file("t.safetensors").c_str(), 4096) != 0) std::_Exit(3);
        volatile float x = m.data<float>()[(1 << 16) - 1];
        (void)x;
        std::_Exit(2);  // the read went through: no fault
      },
      ::testing::ExitedWithCode(1), "t.safetensors' shrank while in use");
}

TEST(MappedSafetensors, TensorsOffTheirElementAlignmentComeBackAsCopies) {
  // A u8 [3] ahead of an f32 [2] puts the floats 3 bytes into the (8-aligned) data section.
  TempDir dir;
  Tensor u = Tensor::zeros({3}, DType::U8, MemCategory::Other, "u");
  Tensor f = Tensor::empty({2}, DType::F32, MemCategory::Other, "f");
  f.data<float>()[0] = 1.25f;
  f.data<float>()[1] = -7.0f;
  ckpt::save_safetensors(dir.file("t.safetensors"), {{"u", u}, {"f", f}});
  ckpt::SafetensorsReader reader(dir.file("t.safetensors"));
  const Tensor m = reader.map("f");
  EXPECT_FALSE(m.borrowed());
  EXPECT_TRUE(same_bytes(m, f));
  EXPECT_TRUE(reader.map("u").borrowed());
}

class MappedHfFolder : public ::testing::TestWithParam<std::string> {};

TEST_P(MappedHfFolder, ServingModelsViewTheFileAndComputeWhatACopyComputes) {
  TempDir dir;
  auto cfg = megaton::testing::tiny_config(GetParam());
  models::TransformerModel m(cfg);
  m.init_weights(5);
  megaton::testing::give_biases_and_norms_values(m.parameters());
  models::save_hf_model(m, dir.file("model"));
  megaton::testing::write_byte_dataset(dir.file("data"), 40);

  models::HfFolder copied = models::load_hf_folder(dir.file("model"), /*gradients=*/true);
  models::HfFolder mapped = models::load_hf_folder(dir.file("model"), /*gradients=*/false);
  EXPECT_TRUE(borrowed_values(*copied.model).empty());  // training writes its weights: copies
  const std::set<std::string> views = borrowed_values(*mapped.model);
  ASSERT_EQ(mapped.model->parameters().size(), m.parameters().size());
  for (size_t i = 0; i < m.parameters().size(); ++i)
    EXPECT_TRUE(same_bytes(mapped.model->parameters()[i]->value, m.parameters()[i]->value)) << m.parameters()[i]->name;
  const double loss = loss_of(*copied.model, dir.file("data"));
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_EQ(loss_of(*mapped.model, dir.file("data")), loss);

  // Which weights the file holds in the run's layout: the embedding everywhere; Llama's o_proj,
  // down_proj and [gate | up] (Megaton writes gate_proj then up_proj); never GPT-2's Conv1D weights
  // (stored transposed) nor a q / k / v split over query groups.
  EXPECT_TRUE(views.count("embedding.word_embeddings.weight")) << GetParam();
  const std::string l0 = "decoder.layers.0.";
  if (GetParam() == "llama-tiny") {
    for (const char* w : {"self_attention.linear_proj.weight", "mlp.linear_fc1.weight", "mlp.linear_fc2.weight",
                          "input_layernorm.weight"})
      EXPECT_TRUE(views.count(l0 + w)) << w;
    EXPECT_FALSE(views.count(l0 + "self_attention.linear_qkv.weight"));
  }
  if (GetParam() == "gpt-tiny") {
    EXPECT_TRUE(views.count("embedding.position_embeddings.weight"));
    EXPECT_FALSE(views.count(l0 + "self_attention.linear_proj.weight"));
    EXPECT_FALSE(views.count(l0 + "mlp.linear_fc1.weight"));
  }

  // A write into a mapped weight stays in this process.
  for (nn::Parameter* p : mapped.model->parameters())
    if (p->value.borrowed()) p->value.data<float>()[0] += 1.0f;
  mapped = models::load_hf_folder(dir.file("model"), /*gradients=*/false);
  for (size_t i = 0; i < m.parameters().size(); ++i)
    EXPECT_TRUE(same_bytes(mapped.model->parameters()[i]->value, m.parameters()[i]->value)) << m.parameters()[i]->name;
}

INSTANTIATE_TEST_SUITE_P(Presets, MappedHfFolder, ::testing::Values("gpt-tiny", "llama-tiny", "deepseek-v3-tiny"),
                         [](const auto& info) { return info.param.substr(0, info.param.find('-')); });

TEST(MappedHfFolder, TensorsOffACacheLineAreCopied) {
  // HF's writer starts the data 8-byte aligned: 8 more bytes of header put every tensor 8 bytes past a
  // cache line, where a view would split every vector load.
  TempDir dir;
  models::TransformerModel m(megaton::testing::tiny_config("llama-tiny"));
  m.init_weights(8);
  models::save_hf_model(m, dir.file("model"));
  const std::string file = dir.file("model/model.safetensors");
  std::string bytes = megaton::testing::read_bytes(file);
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  ASSERT_EQ((8 + header) % 64, 0u) << "Megaton's writer aligns the data section to 64 bytes";
  bytes.insert(8 + header, 8, ' ');
  header += 8;
  std::memcpy(bytes.data(), &header, 8);
  megaton::testing::write_bytes(file, bytes);
  models::HfFolder shifted = models::load_hf_folder(dir.file("model"), /*gradients=*/false);
  EXPECT_TRUE(borrowed_values(*shifted.model).empty());
  for (size_t i = 0; i < m.parameters().size(); ++i)
    EXPECT_TRUE(same_bytes(shifted.model->parameters()[i]->value, m.parameters()[i]->value)) << m.parameters()[i]->name;
}

// A model loaded to serve in bf16 holds its GEMM weights in bf16 alone (a bf16 file's as views of it)
// and computes what f32 main weights with rounded bf16 copies compute, greedy decoding included: the
// same bits from a bf16 file, whose f32 values are the widened bf16 ones; from an f32 file, the same
// loss where the embedding output is rounded to bf16 either way (no learned positions to add first),
// and the same ids too where no MLA layer absorbs its up-projections (made from the f32 values, or
// from the bf16 ones).
class Bf16OnlyFolder : public ::testing::TestWithParam<std::tuple<std::string, DType>> {};

TEST_P(Bf16OnlyFolder, HoldsNoF32GemmWeightsAndComputesTheSame) {
  const auto [preset, file_dtype] = GetParam();
  TempDir dir;
  models::TransformerModel m(megaton::testing::tiny_config(preset));
  m.init_weights(6);
  models::save_hf_model(m, dir.file("model"), file_dtype);
  megaton::testing::write_byte_dataset(dir.file("data"), 40);
  models::HfFolder copied = models::load_hf_folder(dir.file("model"), /*gradients=*/false);
  copied.model->set_compute_dtype(DType::BF16);  // f32 main weights, rounded bf16 copies
  models::HfFolder held = models::load_hf_folder(dir.file("model"), /*gradients=*/false, {DType::BF16});
  held.model->set_compute_dtype(DType::BF16);
  std::set<const nn::Parameter*> gemm;
  for (const nn::Parameter* p : held.model->gemm_weights()) gemm.insert(p);
  ASSERT_FALSE(gemm.empty());
  int lent = 0;
  for (size_t i = 0; i < copied.model->parameters().size(); ++i) {
    const nn::Parameter& a = *copied.model->parameters()[i];
    const nn::Parameter& b = *held.model->parameters()[i];
    ASSERT_EQ(a.compute.defined(), b.compute.defined()) << a.name;
    if (!gemm.count(&b)) {
      EXPECT_TRUE(same_bytes(a.value, b.value)) << a.name;
      continue;
    }
    EXPECT_EQ(b.value.dtype(), DType::BF16) << a.name << ": no f32 main weight";
    EXPECT_TRUE(b.compute.shares_storage_with(b.value)) << a.name << ": the value is its own compute copy";
    EXPECT_TRUE(same_bytes(a.compute, b.value)) << a.name;
    lent += b.value.borrowed();
  }
  // A bf16 file's tensors in the run's layout that start on a cache line are views of it; an f32
  // file's are rounded into fresh memory.
  if (file_dtype == DType::BF16 && preset == "llama-tiny") {
    EXPECT_GT(lent, 0);
  }
  if (file_dtype == DType::F32) {
    EXPECT_EQ(lent, 0);
  }

  const double loss = loss_of(*held.model, dir.file("data"));
  EXPECT_TRUE(std::isfinite(loss));
  const bool same_bits = file_dtype == DType::BF16 || !m.embedding().position.value.defined();
  if (same_bits)
    EXPECT_EQ(loss, loss_of(*copied.model, dir.file("data")));
  else
    EXPECT_NEAR(loss, loss_of(*copied.model, dir.file("data")), 1e-2);
  infer::SamplingOptions o;
  o.temperature = 0;
  o.max_new_tokens = 12;
  const std::vector<int32_t> prompt = {5, 17, 3};
  const auto ids = infer::generate(*held.model, prompt, o);
  EXPECT_EQ(ids.size(), 12u);
  if (file_dtype == DType::BF16 || preset == "llama-tiny") {
    EXPECT_EQ(ids, infer::generate(*copied.model, prompt, o));
  }
  nn::refresh_compute_copies(held.model->parameters());  // nothing to copy: the copies are the values
  EXPECT_EQ(loss_of(*held.model, dir.file("data")), loss);

  try {
    held.model->set_compute_dtype(DType::F32);
    FAIL() << "a bf16-only model computed in f32";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("held in bf16 only"), std::string::npos) << e.what();
  }
  EXPECT_THROW(models::load_hf_folder(dir.file("model"), /*gradients=*/true, {DType::BF16}), std::exception);
}

INSTANTIATE_TEST_SUITE_P(PresetsAndFileDtypes, Bf16OnlyFolder,
                         ::testing::Combine(::testing::Values("gpt-tiny", "llama-tiny", "deepseek-v3-tiny"),
                                            ::testing::Values(DType::F32, DType::BF16)),
                         [](const auto& info) {
                           const std::string& preset = std::get<0>(info.param);
                           return preset.substr(0, preset.find('-')) + "_" +
                                  std::string(dtype_name(std::get<1>(info.param)));
                         });

TEST(MappedHfFolder, UnclearedValuesAreAllWrittenPaddingIncluded) {
  // A loader building its model with nn::UnclearedValues must leave no byte of the allocation's old
  // contents: NaN-filled values stand in for them; the padded vocabulary's rows no tensor holds are zero.
  TempDir dir;
  auto cfg = megaton::testing::tiny_config("gpt-tiny");
  cfg.make_vocab_size_divisible_by = 128;
  models::TransformerModel m(cfg);
  m.init_weights(7);
  const auto hf = models::to_hf_tensors(m);
  std::unique_ptr<models::TransformerModel> back;
  {
    const nn::UnclearedValues uncleared;
    back = std::make_unique<models::TransformerModel>(cfg);
  }
  for (nn::Parameter* p : back->parameters())
    for (int64_t i = 0; i < p->value.numel(); ++i) p->value.data<float>()[i] = std::numeric_limits<float>::quiet_NaN();
  std::map<std::string, Tensor> tensors(hf.begin(), hf.end());
  models::load_hf_tensors(*back, tensors, "exported");
  for (size_t i = 0; i < m.parameters().size(); ++i)
    EXPECT_TRUE(same_bytes(back->parameters()[i]->value, m.parameters()[i]->value)) << m.parameters()[i]->name;
  const Tensor& word = back->embedding().word.value;
  ASSERT_GT(word.size(0), cfg.vocab_size);
  EXPECT_EQ(word.data<float>()[cfg.vocab_size * word.size(1)], 0.0f);
}
