// Data-parallel training: `mpirun -np 2 megaton train` gives the per-step losses and final weights of
// the single-process run (each rank trains on its half of every global batch and the gradient
// buckets are summed), with the reduction overlapped with backward or not, one bucket or many.
// In process, with a two-rank stand-in for the group: the first bucket's reduction is issued
// before backward has finished (before the embedding's weight gradient exists), every bucket
// exactly once, and the overlapped gradients equal the non-overlapped ones bitwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "../support/mpirun.h"
#include "../support/tiny_model.h"
#include "megaton/parallel/local_communicator.h"
#include "megaton/train/training_step.h"
#include "tiny_run.h"

using namespace megaton;
using megaton::testing::TinyRunDir;

namespace {

const std::string kShort = "--set training.train_iters=10 --set logging.save_interval=0 --set training.threads=1 ";

// The single-process run's 10 steps, losses and grad norms within 1e-5, final weights close.
void expect_same_training(const megaton::testing::Metrics& got, const megaton::testing::Metrics& want, const std::string& got_dir,
                          const std::string& want_dir, const std::string& what) {
  ASSERT_EQ(got.losses.size(), 10u) << what;
  ASSERT_EQ(want.losses.size(), 10u) << what;
  megaton::testing::expect_close_training(got, want, got_dir, want_dir, what);
}

class DataParallelRuns : public ::testing::TestWithParam<std::string> {};

TEST_P(DataParallelRuns, TwoRanksTrainLikeOneProcess) {
  TinyRunDir run(GetParam());
  const megaton::testing::Metrics single = run.train_ok("single", kShort);
  struct Variant {
    const char* name;
    std::string args;
  };
  for (const Variant& v : {Variant{"dp2", ""}, Variant{"dp2_no_overlap", "--set parallel.overlap_grad_reduce=false"},
                           Variant{"dp2_buckets", "--set parallel.bucket_size=4000 --set dp=2"}}) {
    const megaton::testing::CommandResult r = run.train_mpi(2, v.name, kShort + v.args, 300);
    ASSERT_EQ(r.exit_code, 0) << v.name << "\n" << r.output;
    EXPECT_NE(r.output.find("data parallel 2 ranks"), std::string::npos) << r.output;
    // Rank 0 alone prints: the last step's progress line appears once.
    size_t lines = 0;
    for (size_t p = r.output.find("step    10/10"); p != std::string::npos; p = r.output.find("step    10/10", p + 1))
      ++lines;
    EXPECT_EQ(lines, 1u) << r.output;
    const megaton::testing::Metrics dp = megaton::testing::read_metrics(run.run_dir(v.name));
    expect_same_training(dp, single, run.run_dir(v.name), run.run_dir("single"), v.name);
    for (const auto& rec : dp.steps) EXPECT_TRUE(rec.contains("comm_wait_s")) << rec.dump();
  }
}

INSTANTIATE_TEST_SUITE_P(Models, DataParallelRuns, ::testing::Values("gpt-tiny", "llama-tiny"),
                         [](const auto& info) { return info.param == "gpt-tiny" ? "gpt" : "llama"; });

TEST(DataParallel, LayoutErrorsNameTheSizes) {
  TinyRunDir run;
  megaton::testing::CommandResult r = run.train("bad_dp", kShort + "--set dp=2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("data_parallel_size"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("does not match the world: 1 processes"), std::string::npos) << r.output;
  // 8 samples per step cannot be split into micro-batches of 8 on each of 2 ranks.
  r = run.train_mpi(2, "bad_batch", kShort + "--set training.micro_batch_size=8", 300);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("micro_batch_size x data-parallel size (8 x 2)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank "), std::string::npos) << r.output;
}

// A two-rank data-parallel group inside one process: the other rank is taken to hold the same
// gradients, so a sum doubles them. Records each reduction and what backward had done by then.
// All-gathers (the distributed optimizer's weights) stay pending until waited for, and report
// their issue and their wait (the twin's block takes this rank's values).
class TwinGroup final : public parallel::Communicator {
 public:
  explicit TwinGroup(std::function<void(const Tensor&)> on_reduce,
                     std::function<void(const std::string&)> on_gather = nullptr)
      : on_reduce_(std::move(on_reduce)), on_gather_(std::move(on_gather)) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  const std::string& name() const override { return name_; }
  parallel::WorkHandle all_reduce_async(const Tensor& t, parallel::ReduceOp op) override {
    on_reduce_(t);
    if (op == parallel::ReduceOp::Sum) {
      if (t.dtype() == DType::F64) *t.data<double>() *= 2;
      else for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] *= 2;
    }
    return parallel::completed_work();
  }
  parallel::WorkHandle reduce_scatter_async(const Tensor& out, const Tensor& in, parallel::ReduceOp) override {
    for (int64_t i = 0; i < out.numel(); ++i) out.data<float>()[i] = 2 * in.data<float>()[i];  // block 0, twice
    return parallel::completed_work();
  }
  parallel::WorkHandle all_gather_async(const Tensor& out, const Tensor& in) override {
    if (!on_gather_) return none();
    on_gather_("issue " + out.name());
    return std::make_shared<PendingGather>(*this, out, in);
  }
  parallel::WorkHandle all_to_all_async(const Tensor&, std::span<const int64_t>, const Tensor&,
                                        std::span<const int64_t>) override {
    return none();
  }
  parallel::WorkHandle broadcast_async(const Tensor&, int) override { return none(); }
  parallel::WorkHandle send_async(const Tensor&, int, int) override { return none(); }
  parallel::WorkHandle recv_async(const Tensor&, int, int) override { return none(); }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int, const std::string&) override { return nullptr; }

 private:
  struct PendingGather final : parallel::Work {
    PendingGather(TwinGroup& g, Tensor out, Tensor in) : group(g), out(std::move(out)), in(std::move(in)) {}
    void wait() override {
      if (std::exchange(done, true)) return;
      group.on_gather_("wait " + out.name());
      std::memcpy(static_cast<char*>(out.raw()) + in.nbytes(), in.raw(), in.nbytes());
    }
    TwinGroup& group;
    Tensor out, in;
    bool done = false;
  };
  [[noreturn]] static parallel::WorkHandle none() { fail("TwinGroup: only all_reduce is used by data parallelism"); }
  std::string name_ = "dp";
  std::function<void(const Tensor&)> on_reduce_;
  std::function<void(const std::string&)> on_gather_;
};

class PatternSource final : public data::SampleSource {
 public:
  int64_t size() const override { return 1000; }
  int64_t seq_length() const override { return 16; }
  void read(int64_t i, int32_t* out) const override {
    for (int64_t t = 0; t <= 16; ++t) out[t] = static_cast<int32_t>((i * 31 + t * 7) % 257);
  }
};

struct Reduction {
  std::string bucket;
  bool position_grad_zero;  // the embedding's W (the last W of backward) had not run yet
};

std::pair<std::vector<Reduction>, std::vector<float>> one_step(bool overlap) {
  train::TrainConfig cfg;
  cfg.model = megaton::testing::tiny_config("gpt-tiny");
  cfg.micro_batch_size = 2;
  cfg.global_batch_size = 4;  // one micro-batch per rank: the embedding's grad is zero until its W
  cfg.seq_length = 16;
  cfg.data_parallel_size = 2;
  cfg.overlap_grad_reduce = overlap;
  cfg.bucket_size = 3000;
  cfg.num_workers = 1;
  models::TransformerModel m(cfg.model);
  m.init_weights(7);
  nn::Parameter* position = nullptr;
  for (nn::Parameter* p : m.parameters())
    if (p->name == "embedding.position_embeddings.weight") position = p;
  EXPECT_NE(position, nullptr);
  std::vector<Reduction> log;
  TwinGroup dp([&](const Tensor& t) {
    if (t.dtype() != DType::F32) return;  // the loss / norm scalars
    const float* g = position->grad.data<float>();
    log.push_back({t.name(), std::all_of(g, g + position->grad.numel(), [](float v) { return v == 0.0f; })});
  });
  parallel::LocalCommunicator pp("pp");  // no pipelining
  train::TrainingStep step(m, cfg, std::make_shared<PatternSource>(), dp, pp);
  EXPECT_GT(step.buffer().buckets().size(), 3u);
  const auto r = step.forward_backward(1, 0, 1e-3);
  EXPECT_TRUE(std::isfinite(r.loss) && std::isfinite(r.grad_norm));
  const float* g = step.buffer().grads().data<float>();
  return {log, std::vector<float>(g, g + step.buffer().grads().numel())};
}

}  // namespace

TEST(DataParallel, BucketsAreReducedDuringBackwardEachOnceAndLikeAfterIt) {
  const auto [overlapped, grads] = one_step(true);
  const auto [after, grads_after] = one_step(false);
  ASSERT_FALSE(overlapped.empty());
  EXPECT_TRUE(overlapped.front().position_grad_zero) << "the first bucket was reduced only after backward ended";
  EXPECT_FALSE(overlapped.back().position_grad_zero);
  for (const Reduction& r : after) EXPECT_FALSE(r.position_grad_zero) << r.bucket;
  // Every bucket once, in order (buckets fire in reverse order of use, which is buffer order).
  ASSERT_EQ(overlapped.size(), after.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(overlapped[i].bucket, "grad_bucket_" + std::to_string(i));
    EXPECT_EQ(after[i].bucket, "grad_bucket_" + std::to_string(i));
  }
  ASSERT_EQ(grads.size(), grads_after.size());
  EXPECT_EQ(std::memcmp(grads.data(), grads_after.data(), grads.size() * sizeof(float)), 0);
}

// overlap_param_gather: the distributed optimizer's step issues every bucket's weight gather, the
// last bucket (the first layers) first, and waits for none; the next forward waits for each right
// before its first module runs, so the first layers compute (their activations are live) while the
// last layers' weights are still in flight. Every bucket is waited for once, the embedding's first.
TEST(DataParallel, OverlappedParamGathersAreWaitedForByTheForwardInOrderOfUse) {
  train::TrainConfig cfg;
  cfg.model = megaton::testing::tiny_config("gpt-tiny");
  cfg.micro_batch_size = 2;
  cfg.global_batch_size = 4;
  cfg.seq_length = 16;
  cfg.data_parallel_size = 2;
  cfg.use_distributed_optimizer = true;
  cfg.overlap_param_gather = true;
  cfg.bucket_size = 3000;
  cfg.num_workers = 1;
  models::TransformerModel m(cfg.model);
  m.init_weights(7);
  std::vector<std::string> events;
  std::vector<size_t> live_activations;  // at each wait
  TwinGroup dp([](const Tensor&) {},
               [&](const std::string& e) {
                 events.push_back(e);
                 if (e.starts_with("wait "))
                   live_activations.push_back(Allocator::host().stats().live[static_cast<size_t>(MemCategory::Activations)]);
               });
  parallel::LocalCommunicator pp("pp");
  train::TrainingStep step(m, cfg, std::make_shared<PatternSource>(), dp, pp);
  const size_t buckets = step.buffer().buckets().size();
  ASSERT_GT(buckets, 3u);
  const auto first = step.forward_backward(1, 0, 1e-3);
  step.update(1e-3, first);
  ASSERT_EQ(events.size(), buckets);
  for (size_t i = 0; i < buckets; ++i) EXPECT_EQ(events[i], "issue param_bucket_" + std::to_string(buckets - 1 - i));
  events.clear();
  live_activations.clear();
  const auto second = step.forward_backward(2, 4, 1e-3);
  EXPECT_TRUE(std::isfinite(second.loss));
  ASSERT_EQ(events.size(), buckets);
  for (size_t i = 0; i < buckets; ++i) EXPECT_EQ(events[i], "wait param_bucket_" + std::to_string(buckets - 1 - i));
  // The activations saved so far grow from wait to wait: each layer ran between its bucket's wait
  // and the next one's (planted: every bucket waited for at the start of the forward, caught).
  EXPECT_TRUE(std::is_sorted(live_activations.begin(), live_activations.end()));
  EXPECT_GT(live_activations.back(), 4 * live_activations.front()) << "every gather was waited for before compute";
}

