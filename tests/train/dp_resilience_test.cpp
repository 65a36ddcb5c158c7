// Resilience of data-parallel jobs: faults on one rank (`--inject ...,rank=R`), agreed decisions,
// restarts of the whole job (`megaton train --nproc N --max-restarts R`) and checkpoints that do
// not depend on the number of ranks.
// - A NaN on rank 1 alone stops every rank at that step (no rewind: a diverged run fails) or is
//   rewound by every rank (rewind on), like the single-process run with the same NaN, within the
//   1e-5 of data parallelism; so is a loss spike that rank 1 alone sees.
// - SIGTERM to rank 1 alone, or to every rank, or to the supervisor of a --nproc job, stops every
//   rank after the same step with a checkpoint and exit status 3; the job resumes bitwise.
// - Rank 1 killed by SIGKILL mid-run, at dp2 and at tp2 (sharded checkpoints): the supervisor
//   restarts the job from the newest checkpoint and it ends bitwise equal to the clean run.
// - A dp2 run stopped and resumed at dp2 equals the uninterrupted one bitwise; resumed at dp1 from
//   the dp2 checkpoint, within 1e-5.
// - Bad rank qualifiers and launcher settings are refused naming what is wrong, before anything runs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <tuple>
#include <functional>

#include "megaton/ckpt/checkpoint_dir.h"
#include "megaton/core/error.h"
#include "megaton/train/fault_injection.h"
#include "megaton/train/supervisor.h"
#include "tiny_run.h"

using namespace megaton;
using namespace megaton::testing;
namespace fs = std::filesystem;

namespace {

const std::string kShort = "--set training.train_iters=10 --set logging.save_interval=0 ";

// The error text of a FaultInjector built from `specs` for a job of `world` ranks ("" when none).
std::string inject_error(const std::vector<std::string>& specs, int world, int rank = 0) {
  TempDir dir;
  try {
    train::FaultInjector f(specs, dir.file("run"), rank, world);
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

}  // namespace

TEST(DpResilience, RankQualifierIsParsedAndRangeCheckedNamingTheSpec) {
  EXPECT_EQ(inject_error({"nan@step=5,rank=1", "crash@step=7,rank=0", "spike@step=3"}, 2), "");
  struct Case {
    std::string spec;
    int world;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {"nan@step=5,rank=2", 2, "--inject nan@step=5,rank=2: there is no rank 2: the job has 2 processes (ranks 0 to 1)"},
           {"nan@step=5,rank=1", 1, "--inject nan@step=5,rank=1: there is no rank 1: the job has 1 process (rank 0)"},
           {"crash@step=7,rank=x", 2, "--inject crash@step=7,rank=x: 'x' is not a rank number"},
           {"crash@step=7,rank=-1", 2, "--inject crash@step=7,rank=-1: '-1' is not a rank number"},
           {"crash@step=7,rank=", 2, "--inject crash@step=7,rank=: '' is not a rank number"},
           {"nan@step=5,node=1", 2, "--inject nan@step=5,node=1: unknown qualifier 'node=1' (expected rank=R)"},
           {"nan@step=5,rank=0,rank=1", 2, "--inject nan@step=5,rank=0,rank=1: rank given twice"},
           {"nan@step=x,rank=1", 2, "--inject nan@step=x,rank=1: 'x' is not a positive step number"},
           {"boom@step=3,rank=1", 2, "--inject boom@step=3,rank=1: expected nan@step=N"},
           {"crash@save=10,rank=1", 2, "--inject crash@save=10,rank=1: checkpoints and the final model are written by rank 0 alone"},
           {"fail@final,rank=1", 2, "--inject fail@final,rank=1: checkpoints and the final model are written by rank 0 alone"},
           {"fail@final=3", 2, "--inject fail@final=3: expected nan@step=N"},
       }) {
    const std::string e = inject_error({c.spec}, c.world);
    EXPECT_NE(e.find(c.message), std::string::npos) << c.spec << ": " << e;
  }
  // From the command line: refused before anything starts, single-process or --nproc.
  TinyRunDir d;
  CommandResult r = d.train("single", kShort + "--inject nan@step=5,rank=1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--inject nan@step=5,rank=1: there is no rank 1"), std::string::npos) << r.output;
  r = run_command(mpi_env() + d.command("job", kShort + "--nproc 2 --inject crash@step=3,rank=2"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--inject crash@step=3,rank=2: there is no rank 2: the job has 2 processes"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("[rank "), std::string::npos) << "the job was started:\n" << r.output;
  EXPECT_FALSE(fs::exists(d.run_dir("single")));
  EXPECT_FALSE(fs::exists(d.run_dir("job")));
}

TEST(DpResilience, AFaultWithARankFiresOnThatRankAloneAndOncePerRunDirectory) {
  TempDir dir;
  const std::vector<std::string> specs = {"nan@step=2,rank=1", "spike@step=3"};
  auto poisoned = [](train::FaultInjector& f, int64_t step) {
    Tensor g = Tensor::zeros({4}, DType::F32);
    g.data<float>()[0] = 1;
    double loss = 1;
    f.corrupt_gradients(step, g, loss);
    return std::isnan(loss) ? "nan" : loss == 10 ? "spike" : "";
  };
  {
    train::FaultInjector rank0(specs, dir.file("run"), 0, 2), rank1(specs, dir.file("run"), 1, 2);
    EXPECT_STREQ(poisoned(rank0, 2), "");
    EXPECT_STREQ(poisoned(rank1, 2), "nan");
    EXPECT_STREQ(poisoned(rank0, 3), "spike");  // no rank: every rank
    EXPECT_STREQ(poisoned(rank1, 3), "spike");
  }
  EXPECT_EQ(read_bytes(dir.file("run/injected_faults.rank1")), "nan@step=2,rank=1\nspike@step=3\n");
  EXPECT_EQ(read_bytes(dir.file("run/injected_faults")), "spike@step=3\n");
  // A restarted job meets neither again, on any rank (nor in a single process resuming it).
  train::FaultInjector rank0(specs, dir.file("run"), 0, 2), rank1(specs, dir.file("run"), 1, 2),
      alone({"spike@step=3"}, dir.file("run"));
  EXPECT_STREQ(poisoned(rank1, 2), "");
  EXPECT_STREQ(poisoned(rank0, 3), "");
  EXPECT_STREQ(poisoned(rank1, 3), "");
  EXPECT_STREQ(poisoned(alone, 3), "");
}

// A NaN in rank 1's gradients after the reduction: rank 0's own gradients are fine, yet every rank
// must stop (no rewind: a diverged run is a failed run) or rewind (rewind on), exactly as a single
// process meeting the NaN does; otherwise the replicas part ways and rank 0 saves weights unlike the
// single-process run.
TEST(DpResilience, NanOnOneRankStopsOrIsRewoundByEveryRank) {
  TinyRunDir d;
  // No rewind: every rank stops at step 4, before its update, with a non-zero exit and no final model.
  CommandResult r = d.train("single", kShort + "--inject nan@step=4");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("step 4: loss is nan: the run diverged and cannot rewind"), std::string::npos) << r.output;
  const Metrics single = read_metrics(d.run_dir("single"));
  r = d.train_mpi(2, "dp2", kShort + "--inject nan@step=4,rank=1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("injected fault: nan@step=4,rank=1 (step 4, rank 1)"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("injected fault: nan@step=4,rank=1 (step 4)"), std::string::npos) << "fired on rank 0:\n"
                                                                                           << r.output;
  // Rank 0's own verdict decides (its norm is the group's NaN): both ranks stop with the same words.
  EXPECT_NE(r.output.find("[rank 0] error: step 4: rank 0: grad norm is nan: the run diverged"), std::string::npos)
      << r.output;
  const Metrics dp = read_metrics(d.run_dir("dp2"));
  for (const Metrics* m : {&single, &dp}) {
    ASSERT_EQ(m->losses.size(), 3u);
    ASSERT_EQ(m->events_of("diverged").size(), 1u);
    EXPECT_EQ(m->events_of("diverged")[0]["step"], 4);
  }
  for (int64_t step = 1; step <= 3; ++step)
    EXPECT_NEAR(dp.losses.at(step), single.losses.at(step), 1e-5 * single.losses.at(step)) << step;
  EXPECT_FALSE(fs::exists(d.run_dir("single") + "/final"));
  EXPECT_FALSE(fs::exists(d.run_dir("dp2") + "/final"));

  // Rewind: every rank restores the step-0 snapshot and skips the batch of step 4.
  const std::string rewind = kShort + "--set rewind.enabled=true ";
  const Metrics single_rw = d.train_ok("single_rewind", rewind + "--inject nan@step=4");
  r = d.train_mpi(2, "dp2_rewind", rewind + "--inject nan@step=4,rank=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step 4: rank 0: grad norm is nan; rewound to step 0"), std::string::npos) << r.output;
  const Metrics dp_rw = read_metrics(d.run_dir("dp2_rewind"));
  ASSERT_EQ(single_rw.events_of("rewind").size(), 1u);
  ASSERT_EQ(dp_rw.events_of("rewind").size(), 1u);
  const auto e = dp_rw.events_of("rewind")[0];
  EXPECT_EQ(e["restored_step"], 0);
  EXPECT_EQ(e["skipped_batches"], nlohmann::json::array({3 * 8}));
  EXPECT_EQ(e["skipped_batches"], single_rw.events_of("rewind")[0]["skipped_batches"]);
  ASSERT_EQ(dp_rw.losses.size(), 10u);
  expect_close_training(dp_rw, single_rw, d.run_dir("dp2_rewind"), d.run_dir("single_rewind"), "rewound NaN");
}

// A loss spike that only rank 1 sees (its loss and gradients x10 after the reduction): the anomaly
// detectors disagree, rank 1's verdict decides for all, and the job ends like the single process
// meeting the spike.
TEST(DpResilience, ASpikeOneRankAloneSeesRewindsEveryRank) {
  TinyRunDir d;
  const std::string spike = "--set training.train_iters=14 --set logging.save_interval=0 --set rewind.enabled=true "
                            "--set rewind.window=6 --set rewind.snapshot_interval=5 ";
  const Metrics single = d.train_ok("single", spike + "--inject spike@step=12");
  const CommandResult r = d.train_mpi(2, "dp2", spike + "--inject spike@step=12,rank=1", 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Metrics dp = read_metrics(d.run_dir("dp2"));
  ASSERT_EQ(single.events_of("rewind").size(), 1u);
  ASSERT_EQ(dp.events_of("rewind").size(), 1u);
  const auto e = dp.events_of("rewind")[0];
  EXPECT_EQ(e["reason"].get<std::string>().rfind("rank 1: loss ", 0), 0u) << e.dump();
  EXPECT_EQ(e["restored_step"], 10);
  EXPECT_EQ(e["skipped_batches"], single.events_of("rewind")[0]["skipped_batches"]);
  ASSERT_EQ(dp.losses.size(), 14u);
  expect_close_training(dp, single, d.run_dir("dp2"), d.run_dir("single"), "rewound spike");
}

// Rank 1 dies by SIGKILL at step 7 (as a crashed node would): mpirun ends the job, the supervisor
// starts it again with --resume auto from the step-4 checkpoint, and the job ends bitwise equal to
// the clean one.
TEST(DpResilience, ARankKilledMidRunRestartsTheWholeJobBitwise) {
  // Data parallel (each rank a replica) and tensor parallel (each rank half of every split tensor,
  // each writing its own checkpoint shard).
  for (const auto& [layout, args, banner] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"dp2", "", "data parallel 2 ranks"}, {"tp2", "--set tp=2 ", "tensor parallel 2 ranks"}}) {
    SCOPED_TRACE(layout);
    TinyRunDir d;
    const std::string job = "--nproc 2 --set training.train_iters=10 --set logging.save_interval=4 "
                            "--set checkpoint.async_save=false " + args;
    const CommandResult clean = run_command(mpi_env(120) + d.command("clean", job));
    ASSERT_EQ(clean.exit_code, 0) << clean.output;
    EXPECT_NE(clean.output.find(banner), std::string::npos) << clean.output;
    // Rank 0 alone prints the summary line.
    const size_t summary = clean.output.find("final validation loss");
    ASSERT_NE(summary, std::string::npos) << clean.output;
    EXPECT_EQ(clean.output.find("final validation loss", summary + 1), std::string::npos) << clean.output;
    const CommandResult r =
        run_command(mpi_env(120) + d.command("crashed", job + "--max-restarts 2 --inject crash@step=7,rank=1"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("injected fault: crash@step=7: killing the process"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("exited on signal 9"), std::string::npos) << "not a SIGKILL (Open MPI's report):\n" << r.output;
    EXPECT_NE(r.output.find("the training job (mpirun)"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("restart 1 of 2"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("restart 2 of 2"), std::string::npos) << r.output;
    const Metrics m = read_metrics(d.run_dir("crashed"));
    ASSERT_EQ(m.events_of("resume").size(), 1u);
    EXPECT_EQ(m.events_of("resume")[0]["step"], 4);
    EXPECT_TRUE(fs::exists(d.run_dir("crashed") + "/injected_faults.rank1"));
    const Metrics c = read_metrics(d.run_dir("clean"));
    ASSERT_EQ(c.losses.size(), 10u);
    EXPECT_EQ(m.losses, c.losses);
    expect_bitwise_equal(final_weights(d.run_dir("clean")), final_weights(d.run_dir("crashed")));
  }
}

// The checkpoint of a data-parallel run holds the one replicated state: resumed at dp2 it continues
// bit for bit; resumed by a single process it continues as the single process would (within the
// 1e-5 of summing each batch's gradient in two halves or in one).
TEST(DpResilience, Dp2CheckpointResumesAtDp2BitwiseAndAtDp1Closely) {
  TinyRunDir d;
  const Metrics clean = [&] {
    const CommandResult r = d.train_mpi(2, "clean", kShort);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return read_metrics(d.run_dir("clean"));
  }();
  CommandResult r = d.train_mpi(2, "stopped", kShort + "--set training.exit_interval=5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(read_metrics(d.run_dir("stopped")).losses.size(), 5u);
  // At dp1, in another run directory, from the dp2 run's step-5 checkpoint.
  const Metrics dp1 = d.train_ok("dp1", kShort + "--resume " + d.run_dir("stopped") + "/checkpoints/step_000005");
  r = d.train_mpi(2, "stopped", kShort + "--resume auto");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Metrics dp2 = read_metrics(d.run_dir("stopped"));
  ASSERT_EQ(clean.losses.size(), 10u);
  EXPECT_EQ(dp2.losses, clean.losses);
  ASSERT_EQ(dp2.events_of("resume").size(), 1u);
  EXPECT_EQ(dp2.events_of("resume")[0]["step"], 5);
  expect_bitwise_equal(final_weights(d.run_dir("clean")), final_weights(d.run_dir("stopped")));

  ASSERT_EQ(dp1.losses.size(), 5u);
  Metrics clean_tail = clean;
  for (int64_t step = 1; step <= 5; ++step) clean_tail.losses.erase(step);
  expect_close_training(dp1, clean_tail, d.run_dir("dp1"), d.run_dir("clean"), "dp1 resumed from dp2");
}

// A stop signal that reaches one rank alone (or every rank) stops all of them after the same step:
// rank 0 writes the checkpoint, every rank exits with status 3 once it is on disk, and the job resumed
// from it ends bitwise equal to the uninterrupted one.
TEST(DpResilience, ASignalToOneRankOrAllStopsEveryRankAfterTheSameStep) {
  TinyRunDir d;
  const CommandResult clean = d.train_mpi(2, "clean", kShort);
  ASSERT_EQ(clean.exit_code, 0) << clean.output;
  struct Case {
    std::string name, inject, reason;
    int64_t step;
  };
  for (const Case& c : std::vector<Case>{{"one", "sigterm@step=3,rank=1", "rank 1: SIGTERM", 3},
                                         {"all", "sigterm@step=6", "rank 0: SIGTERM", 6}}) {
    CommandResult r = d.train_mpi(2, c.name, kShort + "--inject " + c.inject);
    EXPECT_EQ(r.exit_code, 3) << r.output;
    EXPECT_NE(r.output.find("stopped by a signal (" + c.reason + ") after step " + std::to_string(c.step)),
              std::string::npos)
        << r.output;
    const Metrics stopped = read_metrics(d.run_dir(c.name));
    ASSERT_EQ(stopped.events_of("stopped").size(), 1u) << c.name;
    EXPECT_EQ(stopped.events_of("stopped")[0]["step"], c.step);
    EXPECT_EQ(stopped.losses.size(), static_cast<size_t>(c.step));
    EXPECT_FALSE(fs::exists(d.run_dir(c.name) + "/final"));
    r = d.train_mpi(2, c.name, kShort + "--resume auto");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const Metrics resumed = read_metrics(d.run_dir(c.name));
    ASSERT_EQ(resumed.events_of("resume").size(), 1u);
    EXPECT_EQ(resumed.events_of("resume")[0]["step"], c.step);
    EXPECT_EQ(resumed.losses, read_metrics(d.run_dir("clean")).losses) << c.name;
    expect_bitwise_equal(final_weights(d.run_dir("clean")), final_weights(d.run_dir(c.name)));
  }
}

// SIGTERM to the supervisor of a --nproc job: it asks the ranks to stop through its stop file (mpirun
// would kill them a second after passing a signal on), they write a checkpoint and stop, and the
// supervisor exits with status 3 without restarting; the stop file goes with it.
TEST(DpResilience, SigtermToTheSupervisorOfAJobStopsItWithACheckpoint) {
  TinyRunDir d;
  const std::string run = d.run_dir("job");
  const CommandResult r = run_and_signal(mpi_environment() + d.command("job", "--nproc 2 --max-restarts 2 --set "
                                                                         "training.train_iters=100000 --set "
                                                                         "optimizer.lr_decay_iters=100 --set "
                                                                         "logging.save_interval=0"),
                                        run + "/metrics.jsonl", {"TERM"}, d.run_dir("job.log"));
  EXPECT_NE(r.output.find("exit=3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the training job (mpirun) stopped after writing a checkpoint; not restarting"),
            std::string::npos)
      << r.output;
  const Metrics m = read_metrics(run);
  ASSERT_EQ(m.events_of("stopped").size(), 1u) << r.output;
  const int64_t step = m.events_of("stopped")[0]["step"].get<int64_t>();
  EXPECT_EQ(m.steps.size(), static_cast<size_t>(step));
  EXPECT_TRUE(fs::exists(run + "/checkpoints/" + ckpt::checkpoint_name(step) + "/manifest.json")) << step;
  EXPECT_TRUE(m.events_of("resume").empty()) << "restarted";
  for (const auto& e : fs::directory_iterator(run))
    EXPECT_FALSE(e.path().filename().string().starts_with("stop_requested")) << e.path();
}

TEST(DpResilience, LaunchCommandAndItsErrors) {
  const auto cmd = train::launch_command("", 3);
  ASSERT_GE(cmd.size(), 3u);
  EXPECT_EQ(std::vector<std::string>(cmd.begin(), cmd.begin() + 3), (std::vector<std::string>{"mpirun", "-np", "3"}));
  EXPECT_EQ(std::count(cmd.begin(), cmd.end(), "--allow-run-as-root"), ::geteuid() == 0 ? 1 : 0);
  EXPECT_EQ(train::launch_command("env  FOO={nproc} mpirun -n {nproc}", 4),
            (std::vector<std::string>{"env", "FOO=4", "mpirun", "-n", "4"}));
  auto error = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error([] { train::launch_command("no-such-launcher -n {nproc}", 2); })
                .find("launcher program 'no-such-launcher' not found in PATH (from the launcher 'no-such-launcher -n {nproc}')"),
            std::string::npos);

  TinyRunDir d;
  CommandResult r = run_command("MEGATON_LAUNCHER='no-such-launcher -n {nproc}' " + d.command("run", kShort + "--nproc 2"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("'no-such-launcher' not found"), std::string::npos) << r.output;
  r = d.train("run", kShort + "--launcher 'mpirun -np 2'");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--launcher 'mpirun -np 2' starts a job: it needs --nproc N with N > 1"), std::string::npos)
      << r.output;
  // Under mpirun, --nproc would start a job per rank.
  r = d.train_mpi(2, "run", kShort + "--nproc 2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("not under mpirun"), std::string::npos) << r.output;
  // A layout the job cannot have is refused before it starts; a job whose ranks fail while setting
  // up (here: no data) is not restarted, that would fail the same way.
  r = run_command(mpi_env() + d.command("run", kShort + "--nproc 2 --max-restarts 2 --set training.micro_batch_size=8"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("micro_batch_size x data-parallel size (8 x 2)"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("[rank "), std::string::npos) << "the job was started:\n" << r.output;
  r = run_command(mpi_env() + d.command("run", kShort + "--nproc 2 --max-restarts 2 --set data.data_path='\"" +
                                                     d.run_dir("missing") + "\"'"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("[rank "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("before it started training"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("not restarting"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("restart 1 of 2"), std::string::npos) << r.output;
}
