// Issue 8, principle 6: files that are not what they should be (a FIFO, a device, a directory given as
// a model, tokenizer, config or dataset file) or that change under a running job (a dataset truncated
// while memory-mapped) give an error naming the file, not a hang or SIGBUS.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <functional>

#include "../support/byte_dataset.h"
#include "../support/run_command.h"
#include "../support/temp_dir.h"
#include "megaton/ckpt/manifest.h"
#include "megaton/ckpt/safetensors.h"
#include "megaton/data/data_loader.h"
#include "megaton/data/indexed_dataset.h"
#include "megaton/data/preprocess.h"
#include "megaton/data/token_stream.h"
#include "megaton/data/tokenizer.h"
#include "megaton/models/hf_format.h"
#include "megaton/train/train_config.h"

namespace megaton {
namespace {

using testing::TempDir;

// Opening a FIFO that no process writes to blocks forever: the alarm turns a regression into a
// failure (the default SIGALRM action ends the test binary) instead of a test that never ends.
class HostileFiles : public ::testing::Test {
 protected:
  void SetUp() override { alarm(60); }
  void TearDown() override { alarm(0); }

  std::string fifo(const std::string& name) const {
    const std::string path = dir_.file(name);
    EXPECT_EQ(mkfifo(path.c_str(), 0600), 0) << path;
    return path;
  }
  std::string directory(const std::string& name) const {
    std::filesystem::create_directories(dir_.file(name));
    return dir_.file(name);
  }

  TempDir dir_;
};

// Every reader of an outside file, given one that is `kind` ("a FIFO", "a directory", ...), must name
// the file and what it is.
void expect_rejected(const std::function<void()>& read, const std::string& path, const std::string& kind) {
  EXPECT_ERROR_CONTAINS(read(), path, "is " + kind);
}

TEST_F(HostileFiles, AFifoGivenAsAnyInputFileIsNamedNotWaitedOn) {
  const std::string model = directory("model");
  const std::string config_json = fifo("model/config.json");
  expect_rejected([&] { models::load_hf_config(model); }, config_json, "a FIFO (named pipe)");
  const std::string weights = fifo("model.safetensors");
  expect_rejected([&] { ckpt::load_safetensors(weights); }, weights, "a FIFO (named pipe)");
  const std::string toml = fifo("run.toml");
  expect_rejected([&] { train::load_train_config(toml, {}); }, toml, "a FIFO (named pipe)");
  const std::string tiktoken = fifo("ranks.tiktoken");
  expect_rejected([&] { data::make_tokenizer("tiktoken:" + tiktoken); }, tiktoken, "a FIFO (named pipe)");
  const std::string spm = fifo("spm.model");
  expect_rejected([&] { data::make_tokenizer("sentencepiece:" + spm); }, spm, "a FIFO (named pipe)");
  testing::write_byte_dataset(dir_.file("data"), 5);
  std::filesystem::remove(dir_.file("data.bin"));
  const std::string bin = fifo("data.bin");
  expect_rejected([&] { data::IndexedDataset::open(dir_.file("data")); }, bin, "a FIFO (named pipe)");
  // Two more of our own: a preprocessing input and a checkpoint's manifest.
  const std::string input = fifo("corpus.jsonl");
  data::PreprocessOptions opts;
  opts.inputs = {input};
  opts.output_prefix = dir_.file("out");
  opts.progress = false;
  expect_rejected([&] { data::preprocess(opts); }, input, "a FIFO (named pipe)");
  const std::string checkpoint = directory("step_000001");
  const std::string manifest = fifo("step_000001/manifest.json");
  expect_rejected([&] { ckpt::verify_manifest(checkpoint); }, manifest, "a FIFO (named pipe)");
}

TEST_F(HostileFiles, ADirectoryOrDeviceGivenAsAFileIsNamed) {
  const std::string model = directory("model");
  const std::string config_json = directory("model/config.json");
  expect_rejected([&] { models::load_hf_config(model); }, config_json, "a directory");
  const std::string toml = directory("run.toml");
  expect_rejected([&] { train::load_train_config(toml, {}); }, toml, "a directory");
  const std::string gpt2 = directory("gpt2");
  const std::string vocab = directory("gpt2/vocab.json");
  expect_rejected([&] { data::make_tokenizer("gpt2:" + gpt2); }, vocab, "a directory");
  testing::write_byte_dataset(dir_.file("data"), 5);
  std::filesystem::remove(dir_.file("data.idx"));
  const std::string idx = directory("data.idx");
  expect_rejected([&] { data::IndexedDataset::open(dir_.file("data")); }, idx, "a directory");
  // Devices: /dev/zero as weights would read as an empty file, /dev/null as a config as no keys.
  expect_rejected([&] { ckpt::load_safetensors("/dev/zero"); }, "/dev/zero", "a character device");
  expect_rejected([&] { train::load_train_config("/dev/null", {}); }, "/dev/null", "a character device");
}

// The CLI end to end: `eval` of a model folder whose config.json is a FIFO ends at once with one line
// naming it (`timeout` keeps a regression from hanging the suite).
TEST_F(HostileFiles, EvalOfAModelWithAFifoConfigExitsNamingIt) {
  const std::string model = directory("model");
  const std::string config_json = fifo("model/config.json");
  testing::write_byte_dataset(dir_.file("data"), 5);
  const auto r = testing::run_command("timeout 30 " + std::string(MEGATON_BINARY) + " eval --model " + model +
                                      " --data " + dir_.file("data") + " --seq-len 8");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(config_json + " is a FIFO (named pipe), not a regular file"), std::string::npos) << r.output;
}

// Enough byte documents that the .bin spans several pages: truncating it leaves mapped pages past the
// end of the file, whose reads raise SIGBUS.
constexpr int kDocs = 400;

TEST_F(HostileFiles, ABinTruncatedWhileMappedIsAnErrorNamingIt) {
  const std::string prefix = dir_.file("data");
  testing::write_byte_dataset(prefix, kDocs);
  const auto ds = data::IndexedDataset::open(prefix);
  ASSERT_GT(std::filesystem::file_size(prefix + ".bin"), 4 * 4096u);
  const auto last = ds.num_sequences() - 1;
  EXPECT_EQ(ds.get(last).size(), ds.sequence_length(last));
  std::filesystem::resize_file(prefix + ".bin", 0);
  EXPECT_ERROR_CONTAINS(ds.get(last), prefix + ".bin", "changed while in use", "is now 0 bytes");
  // The index is still intact, and a fault caught once leaves later faults caught too.
  EXPECT_GT(ds.sequence_length(0), 0u);
  EXPECT_ERROR_CONTAINS(ds.get(0), prefix + ".bin", "changed while in use");
}

TEST_F(HostileFiles, AnIdxTruncatedWhileMappedIsAnErrorNamingIt) {
  const std::string prefix = dir_.file("data");
  testing::write_byte_dataset(prefix, kDocs);
  const auto ds = data::IndexedDataset::open(prefix);
  std::filesystem::resize_file(prefix + ".idx", 0);
  EXPECT_ERROR_CONTAINS(ds.sequence_length(ds.num_sequences() - 1), prefix + ".idx", "changed while in use");
  EXPECT_ERROR_CONTAINS(ds.get(0), prefix + ".idx", "changed while in use");
}

// As in training: the loader's worker threads read the samples, and the fault on a worker becomes
// the error next() rethrows.
TEST_F(HostileFiles, ABinTruncatedUnderTheLoaderThreadsStopsItWithTheFileNamed) {
  const std::string prefix = dir_.file("data");
  testing::write_byte_dataset(prefix, kDocs);
  auto samples = std::make_shared<data::StreamSamples>(std::make_shared<data::TokenStream>(prefix), 16);
  data::DataLoaderOptions opts;
  opts.micro_batch_size = 2;
  data::DataLoader loader(samples, opts);
  data::Batch batch;
  ASSERT_TRUE(loader.next(batch));
  std::filesystem::resize_file(prefix + ".bin", 0);
  EXPECT_ERROR_CONTAINS(
      [&] {
        while (loader.next(batch)) {
        }
      }(),
      prefix + ".bin", "changed while in use");
}

}  // namespace
}  // namespace megaton
