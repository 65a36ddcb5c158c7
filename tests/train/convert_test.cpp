// `megaton convert`: a training checkpoint as an HF model folder. From a single-process run it is
// the run's own export byte for byte; with --weights-dtype bf16 every tensor is the f32 one rounded
// to bf16 (half the file), loading back as exactly those values. Bad input is refused naming it.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "megaton/ckpt/safetensors.h"
#include "megaton/models/hf_format.h"
#include "tiny_run.h"

using namespace megaton;
using megaton::testing::run_command;
using megaton::testing::TinyRunDir;

TEST(Convert, CheckpointToHfFolderInF32AndBf16) {
  namespace fs = std::filesystem;
  TinyRunDir run("llama-tiny");
  run.train_ok("run", "--set training.train_iters=6 --set logging.save_interval=6 --set optimizer.lr_warmup_iters=1 ");
  const std::string convert = std::string(MEGATON_BINARY) + " convert --input " + run.run_dir("run") + "/checkpoints ";
  const std::string f32 = run.run_dir("f32"), bf16 = run.run_dir("bf16");
  auto r = run_command(convert + "--output " + f32);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(megaton::testing::read_bytes(f32 + "/model.safetensors"),
            megaton::testing::read_bytes(run.run_dir("run") + "/final/model.safetensors"));
  r = run_command(convert + "--output " + bf16 + " --weights-dtype bf16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto wide = ckpt::load_safetensors(f32 + "/model.safetensors");
  const auto narrow = ckpt::load_safetensors(bf16 + "/model.safetensors");
  ASSERT_EQ(narrow.size(), wide.size());
  for (const auto& [name, t] : wide) {
    const Tensor& n = narrow.at(name);
    ASSERT_EQ(n.dtype(), DType::BF16) << name;
    const Tensor rounded = t.to(DType::BF16);
    EXPECT_EQ(std::memcmp(n.raw(), rounded.raw(), n.nbytes()), 0) << name;
  }
  EXPECT_LT(fs::file_size(bf16 + "/model.safetensors"), fs::file_size(f32 + "/model.safetensors") * 11 / 20);

  // Loaded, the bf16 folder's model holds exactly the f32 one's weights rounded to bf16, and it
  // generates.
  const auto wide_model = models::load_hf_model(f32), narrow_model = models::load_hf_model(bf16);
  for (size_t i = 0; i < wide_model->parameters().size(); ++i) {
    const Tensor& w = wide_model->parameters()[i]->value;
    const Tensor back = w.to(DType::BF16).to(DType::F32);
    EXPECT_EQ(std::memcmp(narrow_model->parameters()[i]->value.raw(), back.raw(), back.nbytes()), 0)
        << wide_model->parameters()[i]->name;
  }
  const auto generated = run_command(std::string(MEGATON_BINARY) + " generate --prompt-ids 1,2,3 --max-new-tokens 12 "
                                     "--precision bf16 --threads 1 --model " + bf16);
  EXPECT_EQ(generated.exit_code, 0) << generated.output;

  // A checkpoint given where an HF folder belongs is named, with the way out.
  const std::string step = run.run_dir("run") + "/checkpoints/step_000006";
  r = run_command(std::string(MEGATON_BINARY) + " generate --prompt-ids 1 --max-new-tokens 1 --model " + step);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("sharded training checkpoint"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("megaton convert --input " + step), std::string::npos) << r.output;
  // Bad input: no checkpoint there, another dtype, an output that exists.
  r = run_command(std::string(MEGATON_BINARY) + " convert --input " + run.run_dir("missing") + " --output " +
                  run.run_dir("x"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find(run.run_dir("missing")), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(run.run_dir("x")));
  r = run_command(convert + "--output " + run.run_dir("y") + " --weights-dtype fp16");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--weights-dtype"), std::string::npos) << r.output;
  r = run_command(convert + "--output " + f32);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("already exists"), std::string::npos) << r.output;
}
