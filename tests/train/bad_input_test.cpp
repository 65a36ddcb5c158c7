// Bad input: one-line error naming the key or file, non-zero exit, no run directory written.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../support/byte_dataset.h"
#include "../support/run_command.h"
#include "../support/temp_dir.h"

using megaton::testing::run_command;
using megaton::testing::TempDir;

namespace {

struct BadCase {
  const char* name;
  std::string toml;        // config body; DATA is replaced by a valid dataset prefix
  const char* must_name;   // text the error must contain
};

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t p = 0; (p = s.find(from, p)) != std::string::npos; p += to.size()) s.replace(p, from.size(), to);
}

}  // namespace

TEST(BadInput, ConfigAndDataErrorsNameTheCulpritAndWriteNothing) {
  TempDir dir;
  megaton::testing::write_byte_dataset(dir.file("data"), 50);
  // The [training] table of every case, with `extra` keys added to it.
  auto training = [](const std::string& extra) {
    std::string t = "[training]\nseq_length = 16\nmicro_batch_size = 2\nglobal_batch_size = 2\n" + extra;
    if (extra.find("train_iters") == std::string::npos) t += "train_iters = 2\n";
    return t;
  };
  const std::string base = "[data]\ndata_path = \"DATA\"\n" + training("");
  const std::vector<BadCase> cases = {
      {"key in the wrong section", base + "lr = 0.1\n", "did you mean 'optimizer.lr'"},
      {"typo", base + "[optimizer]\nweight_decy = 0.1\n", "optimizer.weight_decay"},
      {"wrong type", base + "[logging]\nlog_interval = \"often\"\n", "logging.log_interval"},
      {"heads vs hidden", base + "[model]\nhidden_size = 100\nnum_attention_heads = 7\nnum_query_groups = 7\n",
       "num_attention_heads"},
      {"batch divisibility", "[data]\ndata_path = \"DATA\"\n[training]\nmicro_batch_size = 3\nglobal_batch_size = 4\n",
       "training.global_batch_size"},
      {"missing data", "[data]\ndata_path = \"/nonexistent/corpus\"\n", "/nonexistent/corpus"},
      {"vocab mismatch", base + "[model]\nvocab_size = 100\n", "vocab"},
      {"bad enum", base + "[model]\nnormalization = \"BatchNorm\"\n", "BatchNorm"},
      {"toml syntax", base + "[optimizer\nlr = 1\n", ".toml:"},
      // Numbers from outside are range-checked before any size is computed from them (issue 8).
      {"huge positions", base + "[model]\nmax_position_embeddings = 4611686018427387905\n", "max_position_embeddings"},
      {"huge hidden", base + "[model]\nhidden_size = 99999999999\n", "hidden_size"},
      {"negative head dim", base + "[model]\nkv_channels = -1\n", "kv_channels"},
      {"huge vocab", base + "[model]\nvocab_size = 4294967296\n", "vocab_size"},
      {"huge train_iters", training("train_iters = 4611686018427387904\n"), "training.train_iters"},
      {"huge eval_iters", base + "[logging]\neval_iters = 9223372036854775807\n", "logging.eval_iters"},
      {"too many loader threads", "[data]\ndata_path = \"DATA\"\nnum_workers = 100000\n" + training(""),
       "data.num_workers"},
      {"too many threads", training("threads = 100000\n"), "training.threads"},
      // Hyper-parameters that can only train NaN are refused up front.
      {"infinite lr", base + "[optimizer]\nlr = inf\n", "optimizer.lr"},
      {"nan weight decay", base + "[optimizer]\nweight_decay = nan\n", "optimizer.weight_decay"},
      {"negative clip", base + "[optimizer]\nclip_grad = -1.0\n", "optimizer.clip_grad"},
      {"negative norm epsilon", base + "[model]\nnorm_epsilon = -1.0\n", "norm_epsilon"},
      {"zero init std", base + "[model]\ninit_method_std = 0.0\n", "init_method_std"},
      {"negative rotary base", base + "[model]\nrotary_base = -5.0\n", "rotary_base"},
      // What would fail at the end fails at the start: the sample prompt must leave room.
      {"prompt too long", base + "[sample]\ntokens = 5\nprompt = \"" + std::string(40, 'x') + "\"\n", "sample.prompt"},
  };
  for (const auto& c : cases) {
    std::string toml = c.toml;
    replace_all(toml, "DATA", dir.file("data"));
    const std::string run_dir = dir.file(std::string("run_") + std::to_string(&c - cases.data()));
    toml += "[logging]\nrun_dir = \"" + run_dir + "\"\n";
    if (c.toml.find("[logging]") != std::string::npos) {  // keep one [logging] table
      replace_all(toml, "[logging]\nrun_dir", "run_dir");
    }
    const std::string path = dir.file("cfg.toml");
    std::ofstream(path) << toml;
    auto r = run_command(std::string(MEGATON_BINARY) + " train --config " + path);
    EXPECT_NE(r.exit_code, 0) << c.name;
    EXPECT_NE(r.output.find("error: "), std::string::npos) << c.name << ": " << r.output;
    EXPECT_NE(r.output.find(c.must_name), std::string::npos) << c.name << ": " << r.output;
    EXPECT_FALSE(std::filesystem::exists(run_dir)) << c.name << " wrote " << run_dir;
  }
}

TEST(BadInput, SetOverrideErrorsNameTheKey) {
  auto r = run_command(std::string(MEGATON_BINARY) + " train --set training.train_itres=5");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("training.train_iters"), std::string::npos) << r.output;
  r = run_command(std::string(MEGATON_BINARY) + " train --set training.train_iters=many");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("training.train_iters"), std::string::npos) << r.output;
}

TEST(BadInput, BenchGemmShapesNamesABadDeviceOrDtype) {
  const std::string bench = std::string(MEGATON_BINARY) + " bench --gemm-shapes --model gpt-tiny --steps 1 ";
  auto r = run_command(bench + "--device gpu");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("unknown device 'gpu'"), std::string::npos) << r.output;
  r = run_command(bench + "--dtype f16");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--dtype f16 on the cpu: the CPU GEMMs run f32 or bf16"), std::string::npos) << r.output;
  r = run_command(bench + "--cpu-gemm mkl");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--cpu-gemm"), std::string::npos) << r.output;
  r = run_command(bench + "--dtype f17");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("f17"), std::string::npos) << r.output;
  for (const char* dtype : {"f32", "bf16"}) {  // the cpu path still runs and prints every shape, in both dtypes
    r = run_command(bench + "--batch 1 --seq-len 16 --dtype " + dtype);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(std::string(dtype) + " GEMMs on "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("output_layer  wgrad"), std::string::npos) << r.output;
  }
}

TEST(BadInput, BadFaultSpecsAndResumePathsNameTheCulprit) {
  TempDir dir;
  megaton::testing::write_byte_dataset(dir.file("data"), 50);
  const std::string train = std::string(MEGATON_BINARY) + " train --set data.data_path=\\\"" + dir.file("data") +
                            "\\\" --set logging.run_dir=\\\"" + dir.file("run") + "\\\" ";
  auto r = run_command(train + "--inject boom@step=3");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--inject boom@step=3"), std::string::npos) << r.output;
  r = run_command(train + "--inject nan@step=x");
  EXPECT_NE(r.output.find("not a positive step number"), std::string::npos) << r.output;
  r = run_command(train + "--resume " + dir.file("nowhere"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find(dir.file("nowhere")), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir.file("run")));
}

TEST(BadInput, EvalOnMissingModelOrTruncatedIndexNamesTheFile) {
  TempDir dir;
  megaton::testing::write_byte_dataset(dir.file("data"), 20);
  auto r = run_command(std::string(MEGATON_BINARY) + " eval --model " + (dir.file("nomodel")) + " --data " + (dir.file("data")) +
                       " --seq-len 8");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("nomodel"), std::string::npos) << r.output;
  std::filesystem::resize_file(dir.file("data.idx"), std::filesystem::file_size(dir.file("data.idx")) - 5);
  r = run_command(std::string(MEGATON_BINARY) + " preprocess --help >/dev/null; " + MEGATON_BINARY +
                  " train --set data.data_path=\\\"" + (dir.file("data")) + "\\\" --set logging.run_dir=\\\"" +
                  (dir.file("run")) + "\\\"");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("data.idx"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir.file("run")));
}

TEST(BadInput, PreprocessWorkersOutOfRangeIsAnError) {
  TempDir dir;
  std::ofstream(dir.file("in.txt")) << "hello\n";
  auto r = run_command(std::string(MEGATON_BINARY) + " preprocess --input " + dir.file("in.txt") + " --output-prefix " +
                       dir.file("out") + " --workers 100000");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("workers must be in [0, 1024]"), std::string::npos) << r.output;
}
