#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "commands.h"
#include "option_range.h"
#include "megaton/data/preprocess.h"
#include "megaton/data/split_dataset.h"
#include "megaton/parallel/communicator.h"
#include "megaton/train/stop_signal.h"
#include "megaton/train/supervisor.h"
#include "megaton/train/trainer.h"

namespace megaton::app {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

// The demo corpus: every fortune file (Debian's `fortunes` package), one document per fortune,
// split 19:1 into train and validation by document. Built once under data/fortunes/.
std::pair<std::string, std::string> build_fortunes() {
  const fs::path dir = "data/fortunes";
  const std::string train = (dir / "train").string(), valid = (dir / "valid").string();
  if (fs::exists(train + ".idx") && fs::exists(valid + ".idx")) return {train, valid};
  if (!fs::is_directory(kFortunesDir))
    fail("the demo corpus ", kFortunesDir, " is missing: install Debian's 'fortunes' package");
  data::PreprocessOptions opts;
  for (const auto& e : fs::directory_iterator(kFortunesDir))
    if (e.is_regular_file() && !e.path().has_extension()) opts.inputs.push_back(e.path().string());
  std::sort(opts.inputs.begin(), opts.inputs.end());
  fs::create_directories(dir);
  opts.output_prefix = (dir / "all").string();
  opts.doc_separator = "%";
  opts.append_eod = true;
  std::printf("preparing the demo corpus from %zu fortune files in %s\n", opts.inputs.size(), kFortunesDir);
  data::preprocess(opts);
  auto counts = data::split_by_documents(opts.output_prefix, train, valid, 20);
  std::printf("demo corpus: %ld training and %ld validation documents\n", counts.train_documents,
              counts.valid_documents);
  return {train, valid};
}

// Under mpirun every rank gets here: rank 0 builds the corpus while the others wait for it
// (concurrent builds would write the same files).
std::pair<std::string, std::string> prepare_fortunes() {
  parallel::Communicator& world = parallel::world();
  std::pair<std::string, std::string> paths;
  if (world.rank() == 0) paths = build_fortunes();
  world.barrier();
  return world.rank() == 0 ? paths : build_fortunes();
}

// Built-in demo: a small byte-level GPT on the fortunes corpus, sized to finish in a few minutes
// on two cores. The corpus is only prepared when the user's --set does not name other data.
std::vector<std::string> demo_settings(const std::vector<std::string>& user_sets) {
  const bool own_data = std::any_of(user_sets.begin(), user_sets.end(),
                                    [](const std::string& s) { return s.starts_with("data.data_path="); });
  std::vector<std::string> settings;
  if (!own_data) {
    auto [train, valid] = prepare_fortunes();
    // The corpus is already split by document, so all of `train` trains.
    settings = {"data.data_path=\"" + train + "\"", "data.valid_data_path=\"" + valid + "\"", "data.split=\"100,0,0\""};
  }
  // The same global batch of 16 on any number of data-parallel ranks that divides it.
  const int ranks = parallel::world().size();
  settings.push_back("training.micro_batch_size=" + std::to_string(16 % ranks == 0 ? 16 / ranks : 16));
  settings.insert(settings.end(), {"model.preset=\"gpt-tiny\"",
          "training.global_batch_size=16",
          "training.seq_length=128",
          "training.train_iters=1000",
          "optimizer.lr=3e-3",
          "optimizer.min_lr=1e-4",
          "optimizer.lr_warmup_iters=50",
          "optimizer.weight_decay=0.1",
          "logging.run_dir=\"runs/demo\"",
          "logging.log_interval=25",
          "logging.eval_interval=250",
          "logging.eval_iters=40",
          "sample.prompt=\"The \"",
          "sample.tokens=124"});
  return settings;
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("train",
                                 "Train a model. Without --config: the built-in demo (byte-level GPT on Debian's "
                                 "fortunes corpus)");
  static std::string config;
  static std::vector<std::string> sets;
  static train::RunOptions options;
  static int max_restarts = 0;
  cmd->add_option("--config", config, "TOML config file ([model], [data], [training], [optimizer], [logging], "
                                      "[checkpoint], [rewind], [sample])")
      ->check(CLI::ExistingFile);
  cmd->add_option("--set", sets, "Override a key: section.key=value (repeatable), e.g. --set training.train_iters=10");
  cmd->add_option("--resume", options.resume,
                  "Continue from a checkpoint: 'auto' (the newest valid one in the run directory, if any) or a path "
                  "(a checkpoint directory, or a checkpoints directory to take the newest valid one from)");
  cmd->add_flag("--overwrite", options.overwrite,
               "Start over in a run directory that holds an earlier run (its metrics, checkpoints and final model are "
               "removed; checkpoints moved aside as corrupt are kept); with --resume auto: start over when no "
               "checkpoint passes verification");
  cmd->add_option("--inject", options.inject,
                  "Inject a fault (repeatable, for testing): nan@step=N, spike@step=N, crash@step=N, crash@save[=N], "
                  "fail@save[=N], slow@save=SECONDS, sigterm@step=N, fail@final; add ,rank=R to inject it on one rank of a data-parallel job only");
  static int nproc = 1;
  static std::string launcher;
  cmd->add_option("--max-restarts", max_restarts,
                  "Run training in a child process (with --nproc: the whole job) and restart it with --resume auto "
                  "when it dies, up to this many times")
      ->check(in_range(0, 1000));
  cmd->add_option("--nproc", nproc,
                  "Train data parallel on this many processes: starts the job as `mpirun -np N megaton train ...` "
                  "(the other arguments passed on) and waits for it; with --max-restarts, restarts the whole job when "
                  "any rank dies")
      ->check(in_range(1, 1 << 20));
  cmd->add_option("--launcher", launcher,
                  "With --nproc: the command that starts the ranks instead of `mpirun -np N` ({nproc} is replaced by "
                  "N), e.g. \"srun --mpi=pmix -n {nproc}\"; default: the MEGATON_LAUNCHER environment variable");
  cmd->callback([] {
    std::vector<std::string> overrides = config.empty() ? demo_settings(sets) : std::vector<std::string>{};
    overrides.insert(overrides.end(), sets.begin(), sets.end());
    train::TrainConfig cfg = train::load_train_config(config, overrides);  // config errors: no child started
    if (!launcher.empty() && nproc == 1) fail("--launcher '", launcher, "' starts a job: it needs --nproc N with N > 1");
    if ((nproc > 1 || max_restarts > 0) && parallel::launched_distributed())
      fail(nproc > 1 ? "--nproc" : "--max-restarts",
           " starts and supervises the job itself: run `megaton train --nproc N ...` alone, not under mpirun / srun");
    if (nproc > 1 || max_restarts > 0) {
      // Errors the job would meet on every rank, before anything is started.
      train::resolve_parallel_layout(cfg, nproc);
      train::FaultInjector::validate(options.inject, nproc);
      // The child gets this command line without --nproc, --launcher and --max-restarts; restarts
      // continue from the newest valid checkpoint.
      std::vector<std::string> args;
      if (nproc > 1) {
        const char* env = std::getenv("MEGATON_LAUNCHER");
        args = train::launch_command(!launcher.empty() ? launcher : env ? env : "", nproc);
      }
      args.insert(args.end(), {train::self_executable(), "train"});
      if (!config.empty()) args.insert(args.end(), {"--config", config});
      for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
      for (const std::string& f : options.inject) args.insert(args.end(), {"--inject", f});
      // --overwrite goes on to restarts too: with --resume auto it only starts over when no checkpoint
      // is valid, which a restart before the first checkpoint needs.
      if (options.overwrite) args.push_back("--overwrite");
      std::vector<std::string> restart_args = args;
      if (!options.resume.empty()) args.insert(args.end(), {"--resume", options.resume});
      restart_args.insert(restart_args.end(), {"--resume", "auto"});
      if (!train::supervise(args, restart_args, max_restarts, (fs::path(cfg.run_dir) / "metrics.jsonl").string()))
        throw CLI::RuntimeError(train::kStoppedExitStatus);
      return;
    }
    train::Trainer trainer(std::move(cfg), options);
    auto summary = trainer.run();
    if (summary.stopped) throw CLI::RuntimeError(train::kStoppedExitStatus);
    // Last, after the sample: the one number a run is judged by (rank 0 alone prints).
    if (summary.final_val_loss >= 0 && parallel::world().rank() == 0)
      std::printf("final validation loss: %.4f nats/token\n", summary.final_val_loss);
  });
}

}  // namespace megaton::app
