// Inputs the fuzzers of this folder found (or ones of their kind, made small by hand), replayed through
// the parsers' public functions in every build: each must now be an error naming the file, where it
// crashed, hit undefined behaviour or escaped as a JSON library exception naming nothing.
#include <gtest/gtest.h>

#include <filesystem>

#include "../support/temp_dir.h"
#include "megaton/ckpt/manifest.h"
#include "megaton/ckpt/safetensors.h"
#include "megaton/data/tokenizer.h"
#include "megaton/models/hf_format.h"
#include "megaton/train/train_state.h"

namespace megaton {
namespace {

using testing::TempDir;
using testing::write_bytes;

// safetensors_fuzzer: a number too large for a double in the header made nlohmann::json throw
// out_of_range, which load_safetensors did not catch (only parse_error).
TEST(FoundInputs, SafetensorsHeaderWithAnOverflowingNumber) {
  TempDir dir;
  const std::string header = "{\"a\": 11191111111110e0012743110316}";
  const uint64_t len = header.size();
  write_bytes(dir.file("m.safetensors"), std::string(reinterpret_cast<const char*>(&len), 8) + header);
  EXPECT_ERROR_CONTAINS(ckpt::load_safetensors(dir.file("m.safetensors")), dir.file("m.safetensors"),
                        "corrupt safetensors header");
}

// tiktoken_fuzzer (harness run on this input): rank 2^31 - 1 overflowed `rank + 1` and would size the
// vocabulary at 2^31 strings.
TEST(FoundInputs, TiktokenRankFarBeyondTheFile) {
  TempDir dir;
  write_bytes(dir.file("r.tiktoken"), "YQ== 2147483647\n");
  EXPECT_ERROR_CONTAINS(data::make_tokenizer("tiktoken:" + dir.file("r.tiktoken")), dir.file("r.tiktoken") + ":1",
                        "rank 2147483647 is out of range");
}

// The same two in GPT-2's vocab.json.
TEST(FoundInputs, Gpt2VocabularyIdFarBeyondTheFileOrAnOverflowingNumber) {
  TempDir dir;
  write_bytes(dir.file("merges.txt"), "");
  write_bytes(dir.file("vocab.json"), "{\"a\": 0, \"b\": 2147483647}");
  EXPECT_ERROR_CONTAINS(data::make_tokenizer("gpt2:" + dir.file("")), dir.file("vocab.json"),
                        "id 2147483647 is out of range");
  write_bytes(dir.file("vocab.json"), "{\"a\": 1e99999}");
  EXPECT_ERROR_CONTAINS(data::make_tokenizer("gpt2:" + dir.file("")), dir.file("vocab.json"), "malformed JSON");
}

// hf_config_fuzzer (harness run on these inputs): 1e30 where an integer belongs converted to int64
// with undefined behaviour; a number where a bool belongs escaped as nlohmann's type_error; 2^64 - 1
// wrapped to -1. Each must name the file and the key.
TEST(FoundInputs, HfConfigValuesOfTheWrongType) {
  TempDir dir;
  const std::string gpt2 = R"({"model_type": "gpt2", "vocab_size": 257, "n_positions": 64, "n_layer": 2, "n_head": 4, )";
  write_bytes(dir.file("config.json"), gpt2 + R"("n_embd": 1e30})");
  EXPECT_ERROR_CONTAINS(models::load_hf_config(dir.file("")), dir.file("config.json"), "key 'n_embd'");
  write_bytes(dir.file("config.json"), gpt2 + R"("n_embd": 32, "tie_word_embeddings": 1})");
  EXPECT_ERROR_CONTAINS(models::load_hf_config(dir.file("")), dir.file("config.json"), "key 'tie_word_embeddings'");
  write_bytes(dir.file("config.json"), gpt2 + R"("n_embd": 18446744073709551615})");
  EXPECT_ERROR_CONTAINS(models::load_hf_config(dir.file("")), dir.file("config.json"), "key 'n_embd'");
  write_bytes(dir.file("config.json"), gpt2 + R"("n_embd": 32})");
  EXPECT_EQ(models::load_hf_config(dir.file("")).hidden_size, 32);
}

// train_state_fuzzer (harness run on these inputs): a consumed-sample count near 2^63 overflowed in
// next_batch, a float step converted to int64 with undefined behaviour, negative counts passed.
TEST(FoundInputs, TrainStateCountsOutOfRange) {
  const train::TrainConfig config;  // seed 1234
  auto state = [](const std::string& step, const std::string& consumed) {
    return nlohmann::json::parse(R"({"step": )" + step + R"(, "data": {"consumed_samples": )" + consumed +
                                 R"(, "skipped_batches": [320, 336]}, "rng": {"seed": 1234},
        "lr_schedule": {"rewind_lr_factor": 0.5, "rewind_lr_steps": [10, 15]}, "optimizer": {"steps": 18},
        "rewind": {"rewinds": 1, "recent_losses": [5.5], "recent_grad_norms": [1.5]}})");
  };
  int64_t steps = 0;
  const auto p = train::state_from_json(state("20", "320"), config, "state.json", &steps);
  EXPECT_EQ(p.next_batch(16), 352);
  EXPECT_EQ(steps, 18);
  EXPECT_ERROR_CONTAINS(train::state_from_json(state("20", "9223372036854775800"), config, "state.json", &steps),
                        "state.json", "'data.consumed_samples'");
  EXPECT_ERROR_CONTAINS(train::state_from_json(state("1e30", "320"), config, "state.json", &steps), "state.json",
                        "'step'");
  EXPECT_ERROR_CONTAINS(train::state_from_json(state("20", "-16"), config, "state.json", &steps), "state.json",
                        "'data.consumed_samples'");
}

// manifest_fuzzer: a byte count too large for uint64 is parsed as a double, which get<uint64_t>()
// converted with undefined behaviour.
TEST(FoundInputs, ManifestByteCountBeyondUint64) {
  TempDir dir;
  write_bytes(dir.file("state.json"), "{}\n");
  write_bytes(dir.file("manifest.json"), R"({"format": "megaton-checkpoint", "files": {"state.json": )"
                                         R"({"bytes": 1777777777777777777777770, "xxh3_64": "0000000000000000"}}})");
  EXPECT_ERROR_CONTAINS(ckpt::verify_manifest(dir.file("")), "'state.json' bytes",
                        "must be an unsigned 64-bit integer");
}

}  // namespace
}  // namespace megaton
