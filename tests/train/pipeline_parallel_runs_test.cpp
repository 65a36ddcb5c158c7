// Pipeline parallelism end to end: `mpirun -np N megaton train --set pp=P` with every schedule the
// trainer runs trains the tiny GPT (tied embeddings) and Llama (GQA) models, split into 4 layers,
// like one process: per-step losses and grad norms within 1e-5 relative, final weights within 1e-5
// (1e-4 with tp2, as for tensor parallelism alone). Each stage runs the same kernels on the same
// shapes, so the untied Llama trains bit for bit at pp2 under every schedule; GPT's tied embedding
// sums its two copies' gradients (the first and the last stage's) in another order. pp2 with 1F1B,
// ZB-H1, ZB-H2, ZB-V, DualPipe, DualPipeV and interleaved (vpp2); pp4 with every schedule (1F1B
// and ZB-H1 here, DualPipe and the rest in tests of their own, with the 8 micro-batches and layers
// they need); uneven first / last stages; pp2 x dp2 (plain and distributed optimizer) and pp2 x tp2
// on four ranks. A pp2 checkpoint resumes at pp2 bitwise like the uninterrupted run and in one
// process like the single-process run, and the reverse; each stage holds about half the
// parameters; bad layouts are refused naming the sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#include "tiny_run.h"

using megaton::testing::Metrics;
using megaton::testing::TinyRunDir;
using Variant = megaton::testing::MpiVariant;

namespace {

// 4 layers (4 model chunks at pp4 or pp2 x 2 chunks per rank), 4 micro-batches of 2 per step.
const std::string kShort =
    "--set training.train_iters=8 --set logging.save_interval=0 --set training.threads=1 --set model.num_layers=4 "
    "--set training.micro_batch_size=2 ";

// weight_tol: 1e-5, or 1e-4 with tensor parallelism (tiny_run.h: the split forward's rounding).
void expect_like(const TinyRunDir& run, const Metrics& got, const std::string& name, const Metrics& want,
                 const std::string& want_name, double weight_tol = 1e-5) {
  ASSERT_EQ(got.losses.size(), 8u) << name;
  megaton::testing::expect_close_training(got, want, run.run_dir(name), run.run_dir(want_name), name, weight_tol);
}

class PipelineParallelRuns : public ::testing::TestWithParam<std::string> {};

TEST_P(PipelineParallelRuns, EverySchedulesTrainsLikeOneProcess) {
  TinyRunDir run(GetParam());
  const Metrics single = run.train_ok("single", kShort);
  const auto pp2 = [](const std::string& kind, const std::string& chunks) {
    return Variant{"", 2, "--set pp=2 --set parallel.pipeline_schedule='\"" + kind + "\"'",
                   "pipeline parallel 2 stages, schedule '" + kind + "', " + chunks + " model chunks"};
  };
  std::vector<Variant> variants;
  for (const auto& [name, kind, chunks] : std::vector<std::tuple<const char*, std::string, std::string>>{
           {"pp2_1f1b", "1f1b", "2"},
           {"pp2_zbh1", "zb-h1", "2"},
           {"pp2_zbh2", "zb-h2", "2"},
           {"pp2_zbv", "zbv", "4"},
           {"pp2_dualpipev", "dualpipev", "4"},
           {"pp2_dualpipe", "dualpipe", "2"}}) {
    variants.push_back(pp2(kind, chunks));
    variants.back().name = name;
  }
  variants.push_back({"pp2_vpp2", 2,
                      "--set pp=2 --set parallel.pipeline_schedule='\"interleaved\"' "
                      "--set parallel.virtual_pipeline_model_parallel_size=2",
                      "schedule 'interleaved', 4 model chunks"});
  variants.push_back({"pp4_1f1b", 4, "--set pp=4", "pipeline parallel 4 stages, schedule '1f1b', 4 model chunks"});
  variants.push_back({"pp4_zbh1", 4, "--set pp=4 --set parallel.pipeline_schedule='\"zb-h1\"'",
                      "pipeline parallel 4 stages, schedule 'zb-h1'"});
  // Megatron's uneven first / last stages: [1, 3] layers, and [1, 1, 2] over three ranks.
  variants.push_back({"pp2_first1", 2, "--set pp=2 --set parallel.decoder_first_pipeline_num_layers=1",
                      "pipeline parallel 2 stages, schedule '1f1b', 2 model chunks"});
  variants.push_back({"pp3_last2", 3,
                      "--set pp=3 --set parallel.pipeline_schedule='\"zb-h1\"' "
                      "--set parallel.decoder_last_pipeline_num_layers=2",
                      "pipeline parallel 3 stages, schedule 'zb-h1', 3 model chunks"});
  variants.push_back({"pp2_dp2", 4, "--set pp=2", "pipeline parallel 2 stages, schedule '1f1b', 2 model chunks | data "
                                                   "parallel 2 ranks"});
  // The distributed optimizer shards each stage's own buffer over dp (the tied copies summed first).
  variants.push_back({"pp2_dp2_distopt", 4, "--set pp=2 --set parallel.use_distributed_optimizer=true",
                      "pipeline parallel 2 stages, schedule '1f1b', 2 model chunks | data parallel 2 ranks, "
                      "distributed optimizer"});
  variants.push_back({"pp2_tp2", 4, "--set pp=2 --set tp=2 --set parallel.sequence_parallel=true",
                      "tensor parallel 2 ranks + sequence parallel (parameters per rank) | pipeline parallel 2"});
  for (const Variant& v : variants) {
    const Metrics got = run.train_mpi_ok(v.np, v.name, kShort + v.args, v.banner);
    const bool tp = v.args.find("tp=2") != std::string::npos;
    expect_like(run, got, v.name, single, "single", tp ? 1e-4 : 1e-5);
    // Without tied embeddings or other parallelism every gradient element is accumulated in the
    // same order as in one process (each on its own stage): bit for bit. (DualPipe's two copies
    // each sum half the micro-batches, then each other's.)
    if (GetParam() == "llama-tiny" && v.np == 2 && v.name != "pp2_dualpipe") {
      EXPECT_EQ(got.losses, single.losses) << v.name;
      megaton::testing::expect_bitwise_equal(megaton::testing::final_weights(run.run_dir(v.name)),
                                             megaton::testing::final_weights(run.run_dir("single")));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, PipelineParallelRuns, ::testing::Values("gpt-tiny", "llama-tiny"),
                         [](const auto& info) { return info.param == "gpt-tiny" ? "gpt" : "llama"; });

// A checkpoint holds the whole model gathered from the stages (state_snapshot.h), so a pp2
// checkpoint is a one-process checkpoint: it resumes at pp2 bit for bit like the uninterrupted pp2
// run, and in one process like the single-process run; a one-process checkpoint resumes at pp2
// (uneven stages, each rank taking its layers' weights and Adam moments) like the single run.
TEST(PipelineParallel, CheckpointsResumeBitwiseAndAcrossLayouts) {
  TinyRunDir run("gpt-tiny");
  const std::string pp2 = "--set pp=2 --set parallel.pipeline_schedule='\"zbv\"' ";
  megaton::testing::expect_resumes_bitwise(run, "pp2", kShort + pp2, 2, "pipeline parallel 2");
  const std::string stop = "--set training.exit_interval=4 ";
  EXPECT_EQ(run.train_mpi_ok(2, "at_pp1", kShort + pp2 + stop, "pipeline parallel 2").losses.size(), 4u);
  const Metrics at_pp1 = run.train_ok("at_pp1", kShort + "--resume auto");
  const Metrics single = run.train_ok("single", kShort);
  expect_like(run, at_pp1, "at_pp1", single, "single");
  EXPECT_EQ(run.train_ok("at_pp2", kShort + stop).losses.size(), 4u);
  const Metrics at_pp2 =
      run.train_mpi_ok(2, "at_pp2", kShort + "--set pp=2 --set parallel.decoder_last_pipeline_num_layers=3 --resume auto",
                       "pipeline parallel 2");
  expect_like(run, at_pp2, "at_pp2", single, "single");
}

// DualPipe keeps two copies of every stage (stages r and p-1-r hold the same two model chunks, one
// per direction) and sums their gradients: at pp4 with 8 micro-batches it trains like one process;
// its checkpoints hold one copy, so a pp2 DualPipe run resumes bitwise and its checkpoint resumes
// in one process like the single-process run.
TEST(PipelineParallel, DualPipeTrainsLikeOneProcessAndResumes) {
  TinyRunDir run("gpt-tiny");
  const std::string eight = kShort + "--set training.global_batch_size=16 ";
  const std::string dualpipe = "--set parallel.pipeline_schedule='\"dualpipe\"' ";
  const Metrics single = run.train_ok("single", eight);
  const Metrics pp4 = run.train_mpi_ok(4, "pp4", eight + "--set pp=4 " + dualpipe,
                                       "pipeline parallel 4 stages, schedule 'dualpipe', 4 model chunks");
  expect_like(run, pp4, "pp4", single, "single");
  // The copy pairs inside each data-parallel replica; with the distributed optimizer the pair sums
  // the shards it owns.
  for (const std::string distopt : {"false", "true"}) {
    const std::string name = "pp2_dp2_distopt_" + distopt;
    const Metrics dp2 =
        run.train_mpi_ok(4, name, eight + "--set pp=2 " + dualpipe + "--set parallel.use_distributed_optimizer=" + distopt,
                         "schedule 'dualpipe', 2 model chunks | data parallel 2 ranks");
    expect_like(run, dp2, name, single, "single");
  }
  megaton::testing::expect_resumes_bitwise(run, "pp2", kShort + "--set pp=2 " + dualpipe, 2, "schedule 'dualpipe'");
  const std::string stop = "--set training.exit_interval=4 ";
  EXPECT_EQ(run.train_mpi_ok(2, "at_pp1", kShort + "--set pp=2 " + dualpipe + stop, "schedule 'dualpipe'").losses.size(),
            4u);
  const Metrics at_pp1 = run.train_ok("at_pp1", kShort + "--resume auto");
  expect_like(run, at_pp1, "at_pp1", run.train_ok("single4", kShort), "single4");
}

// The schedules with more model chunks than stages, and ZB-H2, at pp4: 8 layers (8 model chunks
// for the V schedules and interleaved vpp2) and 8 micro-batches.
TEST(PipelineParallel, MoreSchedulesAtFourStagesTrainLikeOneProcess) {
  TinyRunDir run("gpt-tiny");
  const std::string eight = kShort + "--set model.num_layers=8 --set training.global_batch_size=16 ";
  const Metrics single = run.train_ok("single", eight);
  for (const auto& [kind, chunks] : std::vector<std::pair<std::string, std::string>>{
           {"zb-h2", "4"}, {"interleaved", "8"}, {"zbv", "8"}, {"dualpipev", "8"}}) {
    const std::string vpp = kind == "interleaved" ? "--set parallel.virtual_pipeline_model_parallel_size=2 " : "";
    const Metrics got = run.train_mpi_ok(4, kind, eight + "--set pp=4 --set parallel.pipeline_schedule='\"" + kind +
                                                      "\"' " + vpp,
                                         "pipeline parallel 4 stages, schedule '" + kind + "', " + chunks + " model chunks");
    expect_like(run, got, kind, single, "single");
  }
}

// A rewind under pipeline parallelism restores the whole-model snapshot into each stage: after an
// injected NaN at step 6 the run goes back to step 4 (from memory, then from the step-4 checkpoint
// on disk) and replays step 5 with exactly its loss before (read_metrics checks every repeated
// step), then trains on.
TEST(PipelineParallel, RewindRestoresEveryStage) {
  TinyRunDir run("gpt-tiny");
  const std::string args = kShort + "--set pp=2 --set rewind.enabled=true --set rewind.window=20 --inject nan@step=6 ";
  for (const auto& [name, from] : std::vector<std::pair<std::string, std::string>>{
           {"memory", "--set rewind.snapshot_interval=2"},
           {"disk", "--set rewind.snapshot_interval=0 --set logging.save_interval=2"},
           // DualPipe: both copies of each stage restored (the snapshot holds one).
           {"memory_dualpipe", "--set rewind.snapshot_interval=2 --set parallel.pipeline_schedule='\"dualpipe\"'"}}) {
    const Metrics m = run.train_mpi_ok(2, name, args + from, "pipeline parallel 2");
    ASSERT_EQ(m.events_of("rewind").size(), 1u) << name;
    const auto r = m.events_of("rewind")[0];
    EXPECT_EQ(r["restored_step"], 4) << name;
    EXPECT_NE(r["restored_from"].get<std::string>().find(name == "disk" ? "step_000004" : "memory"),
              std::string::npos)
        << r.dump();
    EXPECT_EQ(m.losses.size(), 8u) << name;
  }
}

// Zero Bubble's optimizer post-validation at pp2 under ZB-H2: every stage steps before the
// pipeline-wide grad norm is known and undoes the step where clipping or the NaN check would have
// changed it. With clip_grad between the clean run's smallest and largest norms (so both cases
// occur) and a NaN at step 6 rewound, the untied Llama trains bitwise like the same run without it.
TEST(PipelineParallel, OptimizerPostValidationTrainsBitwiseLikeWithout) {
  TinyRunDir run("llama-tiny");
  const std::string zbh2 = kShort + "--set pp=2 --set parallel.pipeline_schedule='\"zb-h2\"' ";
  const Metrics probe = run.train_mpi_ok(2, "probe", zbh2, "schedule 'zb-h2'");
  std::vector<double> norms;
  for (const auto& r : probe.steps) norms.push_back(r["grad_norm"].get<double>());
  std::sort(norms.begin(), norms.end());
  const std::string args = zbh2 + "--set optimizer.clip_grad=" + std::to_string(norms[norms.size() / 2]) +
                           " --set rewind.enabled=true --set rewind.window=20 --inject nan@step=6 ";
  const Metrics plain = run.train_mpi_ok(2, "plain", args, "schedule 'zb-h2'");
  const Metrics post = run.train_mpi_ok(2, "post", args + "--set parallel.optimizer_post_validation=true",
                                        "schedule 'zb-h2'");
  ASSERT_EQ(post.losses.size(), 8u);
  EXPECT_EQ(post.events_of("rewind").size(), 1u);
  std::map<std::string, int> outcomes;
  for (const auto& r : post.steps) ++outcomes[r.value("post_validation", "")];
  EXPECT_GT(outcomes["kept"], 0);
  EXPECT_GT(outcomes["redone"], 1);  // the clipped steps and the NaN one
  for (const auto& [step, loss] : plain.losses) {
    EXPECT_EQ(post.losses.at(step), loss) << "step " << step;
    EXPECT_EQ(post.last.at(step)["grad_norm"], plain.last.at(step)["grad_norm"]) << "step " << step;
  }
  megaton::testing::expect_bitwise_equal(megaton::testing::final_weights(run.run_dir("post")),
                                         megaton::testing::final_weights(run.run_dir("plain")));
  const megaton::testing::CommandResult r = run.train(
      "refused", kShort + "--set parallel.optimizer_post_validation=true --set parallel.use_distributed_optimizer=true");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("'parallel.optimizer_post_validation': is not supported with parallel.use_distributed_optimizer"),
            std::string::npos)
      << r.output;
}

// Each stage holds its own layers only: with 4 layers at pp2 the first rank keeps half of them. The
// allocator's per-category peaks after the first step (metrics.jsonl, rank 0) for parameters,
// gradients and optimizer state stay below 0.7x of one process's. Llama is untied: rank 0 holds the
// embedding and 2 layers, rank 1 the same-sized head, the final norm and 2 layers, so rank 0's
// share is 0.50 (measured); 0.7 leaves room for a model whose embedding outweighs its head (GPT's
// learned positions) while a rank holding every layer (the layout before stages: 1.0, or ~0.75 for
// all layers without the head) fails.
TEST(PipelineParallel, StagesHoldAboutHalfTheParametersGradsAndOptimizerState) {
  TinyRunDir run("llama-tiny");
  run.train_ok("single", kShort);
  run.train_mpi_ok(2, "pp2", kShort + "--set pp=2", "pipeline parallel 2");
  const auto peaks = [&](const std::string& name) {
    const Metrics m = megaton::testing::read_metrics(run.run_dir(name));
    return m.steps.at(0).at("peak_memory_mb");  // after the first step
  };
  const auto single = peaks("single"), pp2 = peaks("pp2");
  for (const char* category : {"params", "grads", "optimizer"}) {
    const double ratio = pp2.at(category).get<double>() / single.at(category).get<double>();
    EXPECT_LT(ratio, 0.7) << category << ": " << pp2.at(category) << " MB at pp2 vs " << single.at(category) << " MB";
    std::printf("%s: %.4f MB at pp2 (rank 0) vs %.4f MB in one process: %.3f\n", category,
                pp2.at(category).get<double>(), single.at(category).get<double>(), ratio);
    EXPECT_GT(ratio, 0.4) << category;  // rank 0 still holds its half and the embedding
  }
}

TEST(PipelineParallel, BadLayoutsNameTheSizes) {
  TinyRunDir run("gpt-tiny");
  // 3 layers do not split over 2 stages.
  megaton::testing::CommandResult r = run.train_mpi(2, "layers", kShort + "--set pp=2 --set model.num_layers=3", 120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("3 layers do not split evenly into 2 pipeline model chunks"), std::string::npos) << r.output;
  // ZB-V holds 2 chunks per rank: 4 model chunks for 2 layers.
  r = run.train("zbv", kShort + "--set pp=2 --set model.num_layers=2 --set parallel.pipeline_schedule='\"zbv\"'");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("2 layers do not split evenly into 4 pipeline model chunks"), std::string::npos) << r.output;
  // pp 2 does not divide a world of 3.
  r = run.train_mpi(3, "world", kShort + "--set pp=2", 120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("world size 3 is not divisible by tensor_model_parallel_size 1 x context_parallel_size 1 x "
                          "pipeline_model_parallel_size 2"),
            std::string::npos)
      << r.output;
  // Interleaving needs micro-batches in multiples of the stages: 3 (global batch 6 of 2) over 2.
  r = run.train_mpi(2, "interleaved",
                    kShort + "--set pp=2 --set training.global_batch_size=6 --set parallel.pipeline_schedule="
                             "'\"interleaved\"' --set parallel.virtual_pipeline_model_parallel_size=2",
                    120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("interleaved 1F1B needs the micro-batches (3) to be a multiple of the pipeline stages (2)"),
            std::string::npos)
      << r.output;
  // Uneven stages that do not add up name the keys and the sizes.
  r = run.train("uneven", kShort + "--set pp=3 --set parallel.decoder_first_pipeline_num_layers=1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("config key 'parallel.decoder_first_pipeline_num_layers': decoder_first_pipeline_num_layers 1 "
                          "leave 3 of model.num_layers 4 layers, which do not split evenly into the other 2 pipeline "
                          "ranks"),
            std::string::npos)
      << r.output;
  r = run.train("vpp", kShort + "--set parallel.virtual_pipeline_model_parallel_size=2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("needs parallel.pipeline_schedule = \"interleaved\""), std::string::npos) << r.output;
  r = run.train("kind", kShort + "--set parallel.pipeline_schedule='\"gpipe\"'");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("'gpipe' is not one of 1f1b, interleaved"), std::string::npos) << r.output;
}

}  // namespace

// logging.trace: RUN/trace.json is a Chrome trace with one row per rank holding every op the
// rank ran, timed: each micro-batch's F, B and W once per step (a W run inside its B's call is
// that B's "+W"), one op after another on each rank.
TEST(PipelineParallel, TraceHoldsEveryRanksTimedOps) {
  TinyRunDir run("gpt-tiny");
  const std::string args = "--set training.train_iters=3 --set optimizer.lr_warmup_iters=1 --set logging.save_interval=0 "
                           "--set training.threads=1 "
                           "--set training.global_batch_size=16 --set logging.trace=true ";
  for (const auto& [name, np, extra] : std::vector<std::tuple<std::string, int, std::string>>{
           {"single", 1, ""}, {"zbh1", 2, "--set pp=2 --set parallel.pipeline_schedule=zb-h1 "}}) {
    SCOPED_TRACE(name);
    if (np == 1) run.train_ok(name, args + extra);
    else run.train_mpi_ok(np, name, args + extra, "pipeline parallel 2");
    const auto trace = nlohmann::json::parse(megaton::testing::read_bytes(run.run_dir(name) + "/trace.json"));
    EXPECT_EQ(trace["otherData"]["steps"], 3);
    std::vector<std::string> rows;
    std::map<int, std::vector<nlohmann::json>> ops;  // per rank
    for (const auto& e : trace["traceEvents"])
      if (e["ph"] == "M") rows.push_back(e["args"]["name"]);
      else ops[e["pid"].get<int>()].push_back(e);
    ASSERT_EQ(rows.size(), static_cast<size_t>(np));
    EXPECT_EQ(rows[0], "rank 0 (pp 0, dp 0, tp 0)");
    if (np > 1) {
      EXPECT_EQ(rows[1], "rank 1 (pp 1, dp 0, tp 0)");
    }
    for (int r = 0; r < np; ++r) {
      std::map<char, int> counts;  // F, B, W (a "+W" counts for its W too)
      double end = 0;
      for (const auto& e : ops[r]) {
        const auto op = e["name"].get<std::string>();
        ++counts[op[0]];
        if (op.ends_with("+W")) ++counts['W'];
        const double ts = e["ts"].get<double>(), dur = e["dur"].get<double>();
        EXPECT_GE(dur, 0) << op;
        EXPECT_GE(ts, end - 1e-3) << op << ": overlaps the previous op of rank " << r;
        end = ts + dur;
      }
      for (const char k : {'F', 'B', 'W'}) EXPECT_EQ(counts[k], 3 * 4) << "rank " << r << " op " << k;
    }
  }
}
