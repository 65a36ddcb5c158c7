// Bad input: one-line error naming the key or file, non-zero exit, no run directory written.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../support/byte_dataset.h"
#include "../support/run_command.h"
#include "../support/temp_dir.h"
#include "megaton/data/indexed_dataset.h"

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
  // Token ids up to 299: made by a tokenizer larger than `byte` (257 ids).
  {
    megaton::data::IndexedDatasetWriter w(dir.file("wide"), megaton::DType::U16);
    for (int d = 0; d < 20; ++d) {
      std::vector<int32_t> doc;
      for (int i = 0; i < 40; ++i) doc.push_back((d * 41 + i * 7) % 300);
      w.add_document(doc);
    }
    w.finalize();
  }
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
      // ... the tokenizer that decodes the sample must know every id of the data (the model is larger),
      {"data from another tokenizer", "[data]\ndata_path = \"WIDE\"\n" + training("") +
           "[model]\nvocab_size = 512\n[sample]\ntokens = 5\n", "data.tokenizer"},
      // ... and validation must have data when eval_interval asks for it.
      {"eval without validation data", "[data]\ndata_path = \"DATA\"\nsplit = \"100,0,0\"\n" + training("") +
           "[logging]\neval_interval = 1\n", "logging.eval_interval"},
      // Values from the file parsed strictly: no float for an integer, no string for a bool.
      {"float for an integer", training("train_iters = 5.0\n") + "[data]\ndata_path = \"DATA\"\n", "training.train_iters"},
      {"string for a bool", "[data]\ndata_path = \"DATA\"\nshuffle = \"yes\"\n" + training(""), "data.shuffle"},
      {"integer for a bool", base + "[checkpoint]\nasync_save = 1\n", "checkpoint.async_save"},
  };
  for (const auto& c : cases) {
    std::string toml = c.toml;
    replace_all(toml, "DATA", dir.file("data"));
    replace_all(toml, "WIDE", dir.file("wide"));
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
  // A value is wholly one value of the key's type: no exponent or fraction for an integer, no
  // trailing junk, no second line smuggling another key in, only true / false for a bool.
  for (const std::string set : {"training.train_iters=1e3", "training.train_iters=5.0", "training.train_iters=5abc",
                                 "training.seed=--5", "data.shuffle=yes", "data.shuffle=1", "optimizer.lr=0.1x",
                                 "training.train_iters=\"$(printf '5\\nlogging.log_interval=1')\""}) {
    const std::string key = set.substr(0, set.find('='));
    r = run_command(std::string(MEGATON_BINARY) + " train --set " + set);
    EXPECT_NE(r.exit_code, 0) << set;
    EXPECT_NE(r.output.find("error: --set " + key), std::string::npos) << set << ": " << r.output;
  }
}

// Principle 7: a mistyped command lists the commands, an out-of-range or malformed number prints
// the range in plain numbers, a file where a directory belongs (and the reverse) is named; each one
// line and a non-zero exit.
TEST(BadInput, CommandLineErrorsSayWhatIsExpected) {
  TempDir dir;
  std::ofstream(dir.file("file")) << "x";
  megaton::testing::write_byte_dataset(dir.file("data"), 50);
  const std::string m = std::string(MEGATON_BINARY) + " ";
  const std::string gen = m + "generate --model " + dir.file("file") + " --prompt a ";
  const std::string eval = m + "eval --model " + dir.file("nomodel") + " --data " + dir.file("nodata") + " ";
  struct Case {
    std::string command, message;
  };
  for (const Case& c : std::vector<Case>{
           {m + "trian", "error: unknown command 'megaton trian'; the commands are: train, eval, generate, serve, preprocess"},
           {m, "error: megaton needs a command: train, eval, generate"},
           {m + "data show x", "error: unknown command 'megaton data show'; the commands are: inspect, bench"},
           {m + "tokenizer", "error: megaton tokenizer needs a command: train, encode, decode"},
           {gen + "--top-p 2", "--top-p: 2 is out of range: must be in [0, 1]"},
           {gen + "--temperature nan", "--temperature: 'nan' is not a finite number"},
           {gen + "--top-k -1", "--top-k: -1 is out of range: must be at least 0"},
           {eval + "--seq-len -3", "--seq-len: -3 is out of range: must be at least 1"},
           {eval + "--seq-len 8.0", "--seq-len: '8.0' is not a whole number"},
           {eval + "--seq-len 1e3", "--seq-len: '1e3' is not a whole number"},
           {eval + "--seq-len 99999999999999999999", "--seq-len: 99999999999999999999 is out of range: must be in [1, "
                                                     "9223372036854775807]"},
           {eval + "--seq-len 8 --max-samples -5", "--max-samples: -5 is out of range: must be at least 1"},
           {m + "schedule --pp 5000", "--pp: 5000 is out of range: must be in [1, 4096]"},
           {m + "train --nproc 0", "--nproc: 0 is out of range: must be in [1, 1048576]"},
           {m + "data bench x --seq-length 8 --num-workers 100000", "--num-workers: 100000 is out of range: must be in [1, 256]"},
           // A file where a directory belongs, and a directory where a file belongs.
           {gen, "model '" + dir.file("file") + "' is a file; expected an HF model folder"},
           {m + "train --config " + dir.file(""), "--config: File is actually a directory"},
           {m + "train --resume " + dir.file("file") + " --set data.data_path=\\\"" + dir.file("data") +
                "\\\" --set logging.run_dir=\\\"" + dir.file("run") + "\\\"",
            "checkpoint path '" + dir.file("file") + "' is a file"},
       }) {
    const auto r = run_command(c.command);
    EXPECT_NE(r.exit_code, 0) << c.command;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.command << ":\n" << r.output;
  }
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

TEST(BadInput, BenchFusionKernelsNamesABadDtypeAndTimesEveryFusion) {
  const std::string bench = std::string(MEGATON_BINARY) + " bench --fusion-kernels --steps 1 --batch 1 --seq-len 16 ";
  auto r = run_command(bench + "--dtype f16");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--fusion-kernels --dtype f16: f32 or bf16"), std::string::npos) << r.output;
  for (const char* model : {"gpt-tiny", "llama-tiny"}) {  // GeLU + LayerNorm, SwiGLU + RMSNorm
    r = run_command(bench + "--json --model " + model);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    for (const char* line : {R"("fusion":"bias_activation","pass":"forward")", R"("fusion":"bias_activation","pass":"backward")",
                             R"("fusion":"residual_norm","pass":"forward")", R"("fusion":"residual_norm","pass":"backward")",
                             R"("fusion":"layernorm_linear tensorwise","pass":"forward")",
                             R"("fusion":"layernorm_mlp blockwise","pass":"forward")"})
      EXPECT_NE(r.output.find(line), std::string::npos) << line << " in " << r.output;
  }
  r = run_command(std::string(MEGATON_BINARY) + " bench --model gpt-tiny --steps 1 --fusion sometimes");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--fusion"), std::string::npos) << r.output;
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
