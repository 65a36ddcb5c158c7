// The executor running the trainer's stage: the no-pipelining schedule gives bitwise the gradients
// and loss of the plain forward/backward loop the trainer ran before schedules existed; with every
// W deferred too, except for a tied embedding, whose head and embedding contributions then add up
// in another order (all head parts first).
#include "megaton/pipeline/executor.h"
#include "megaton/pipeline/generators.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "../support/temp_dir.h"
#include "../support/tiny_model.h"
#include "megaton/nn/param_and_grad_buffer.h"
#include "megaton/train/training_stage.h"

using namespace megaton;

namespace {

constexpr int64_t kMicroBatch = 2, kSeq = 16;

// The m-th micro-batch of a step: deterministic tokens.
data::Batch make_batch(int64_t m) {
  data::Batch b{kMicroBatch, kSeq, {}, {}, {}};
  for (int64_t i = 0; i < kMicroBatch * kSeq; ++i) {
    b.inputs.push_back(static_cast<int32_t>((i * 11 + m * 29) % 257));
    b.targets.push_back(static_cast<int32_t>((i * 5 + m * 3 + 1) % 257));
  }
  return b;
}

struct StepResult {
  double loss;
  std::vector<float> grads;
};

// Today's trainer loop, written out: per micro-batch forward (loss scaled by 1/M) then backward.
StepResult plain_loop(const std::string& preset, int64_t M) {
  models::TransformerModel m(megaton::testing::tiny_config(preset));
  m.init_weights(11);
  nn::ParamAndGradBuffer buf(m.parameters(), 0);
  double loss = 0;
  for (int64_t i = 0; i < M; ++i) {
    const data::Batch b = make_batch(i);
    Tensor in = Tensor::empty({kMicroBatch, kSeq}, DType::I32), tg = Tensor::empty({kMicroBatch, kSeq}, DType::I32);
    std::copy(b.inputs.begin(), b.inputs.end(), in.data<int32_t>());
    std::copy(b.targets.begin(), b.targets.end(), tg.data<int32_t>());
    models::ModelCtx ctx;
    loss += m.forward(ctx, in, tg, true, 1.0f / static_cast<float>(M)).loss / static_cast<double>(M);
    m.backward(ctx);
  }
  const float* g = buf.grads().data<float>();
  return {loss, std::vector<float>(g, g + buf.grads().numel())};
}

StepResult through_executor(const std::string& preset, const pipeline::Schedule& schedule, bool defer_head,
                            int64_t chunks = 1) {
  models::TransformerModel m(megaton::testing::tiny_config(preset), chunks);
  m.init_weights(11);
  nn::ParamAndGradBuffer buf(m.parameters(), 0);
  int64_t next = 0;
  train::TrainingStage stage(
      m,
      [&](data::Batch& b) { b = make_batch(next++); },
      schedule.microbatches, defer_head);
  buf.begin_step(schedule.microbatches);
  pipeline::execute(schedule.ops[0], stage);
  buf.end_step();
  const float* g = buf.grads().data<float>();
  return {stage.mean_loss(), std::vector<float>(g, g + buf.grads().numel())};
}

// Records which StageRunner calls the executor makes.
struct RecordingRunner : pipeline::StageRunner {
  std::vector<std::string> calls;
  void forward(int64_t m, int c) override { calls.push_back("F" + std::to_string(m) + "." + std::to_string(c)); }
  void backward_input(int64_t m, int c) override { calls.push_back("B" + std::to_string(m) + "." + std::to_string(c)); }
  void backward_weight(int64_t m, int c) override { calls.push_back("W" + std::to_string(m) + "." + std::to_string(c)); }
  void backward(int64_t m, int c) override { calls.push_back("BW" + std::to_string(m) + "." + std::to_string(c)); }
  void prepare(const pipeline::Op& next) override { calls.push_back("prepare " + pipeline::op_name(next)); }
};

}  // namespace

// The head's deferred W adds the same chunk GEMMs in the same order, so untied models stay
// bitwise; the model split into two chunks, each run by its own F / B / W ops, runs the same
// kernels in the same order.
TEST(Executor, NoPipeliningEagerAndDeferredAreBitwiseThePlainLoop) {
  for (const std::string preset : {"gpt-tiny", "llama-tiny"}) {
    SCOPED_TRACE(preset);
    const StepResult want = plain_loop(preset, 3);
    ASSERT_TRUE(std::isfinite(want.loss));
    for (int64_t chunks : {1, 2})
      for (bool defer : {false, true}) {
        SCOPED_TRACE(std::string(defer ? "deferred W, " : "eager W, ") + std::to_string(chunks) + " chunks");
        const StepResult got =
            through_executor(preset, pipeline::no_pipelining(3, defer, static_cast<int>(chunks)), defer, chunks);
        EXPECT_EQ(got.loss, want.loss);
        ASSERT_EQ(got.grads.size(), want.grads.size());
        if (defer && megaton::testing::tiny_config(preset).tie_embeddings) {
          for (size_t i = 0; i < got.grads.size(); ++i)
            ASSERT_NEAR(got.grads[i], want.grads[i], 1e-6f * (std::abs(want.grads[i]) + 1e-3f)) << "element " << i;
        } else {
          EXPECT_EQ(std::memcmp(got.grads.data(), want.grads.data(), got.grads.size() * sizeof(float)), 0);
        }
      }
  }
}

TEST(Executor, ModelChunksCheckTheirSplitAndOrder) {
  EXPECT_ERROR_CONTAINS(models::TransformerModel(megaton::testing::tiny_config("gpt-tiny"), 3),
                        "cannot split 2 layers evenly into 3 model chunks");
  models::TransformerModel m(megaton::testing::tiny_config("gpt-tiny"), 2);
  ASSERT_EQ(m.num_chunks(), 2u);
  EXPECT_TRUE(m.chunk(0).is_first() && !m.chunk(0).is_last());
  EXPECT_TRUE(!m.chunk(1).is_first() && m.chunk(1).is_last());
  m.init_weights(1);
  const data::Batch b = make_batch(0);
  Tensor in = Tensor::empty({kMicroBatch, kSeq}, DType::I32), tg = Tensor::empty({kMicroBatch, kSeq}, DType::I32);
  std::copy(b.inputs.begin(), b.inputs.end(), in.data<int32_t>());
  std::copy(b.targets.begin(), b.targets.end(), tg.data<int32_t>());
  models::ModelCtx ctx;
  m.forward(ctx, in, tg, true);
  EXPECT_ERROR_CONTAINS(m.chunk(1).backward_weight(ctx.chunks[1]), "before its backward_input");
  EXPECT_ERROR_CONTAINS(m.chunk(0).backward_input(ctx.chunks[0], Tensor()), "needs the next chunk's input gradient");
  EXPECT_ERROR_CONTAINS(m.chunk(0).loss(ctx.chunks[0], in, tg, false, 1, false), "last model chunk only");
}

TEST(Executor, FusesABackwardInputWithItsOwnWeightGradientOnly) {
  RecordingRunner r;
  pipeline::execute({{pipeline::OpKind::Forward, 0},
                     {pipeline::OpKind::Forward, 1},
                     {pipeline::OpKind::BackwardInput, 0},
                     {pipeline::OpKind::BackwardWeight, 0},
                     {pipeline::OpKind::BackwardInput, 1},
                     {pipeline::OpKind::BackwardWeight, 0, 1},  // another chunk's W: not fused
                     {pipeline::OpKind::BackwardWeight, 1}},
                    r);
  EXPECT_EQ(r.calls, (std::vector<std::string>{"prepare F1", "F0.0", "prepare B0", "F1.0", "prepare B1", "BW0.0",
                                               "B1.0", "W0.1", "W1.0"}));
}

// A pipelined runner posts the receives of the next op that takes an input (F, B or F&B) while the
// op before it runs: announced once each, before the compute op ahead of it, never a W.
TEST(Executor, AnnouncesEachOpTakingAnInputOnceBeforeTheOpAheadOfIt) {
  RecordingRunner r;
  using pipeline::OpKind;
  pipeline::execute({{OpKind::Forward, 0},
                     {OpKind::BackwardInput, 0},
                     {OpKind::BackwardWeight, 0, 1},
                     {OpKind::ForwardBackward, 1, 0, 2, 1}},
                    r);
  EXPECT_EQ(r.calls, (std::vector<std::string>{"prepare B0", "F0.0", "prepare F1&B2.1", "B0.0", "W0.1", "F1.0", "B2.1"}));
}

// DualPipe's overlapped F&B: a runner without an overlapped kernel runs the F, then the B (with its
// W when the op is followed by that W, as one backward call).
TEST(Executor, RunsAnOverlappedForwardBackwardAsItsForwardThenItsBackward) {
  RecordingRunner r;
  using pipeline::OpKind;
  pipeline::execute({{OpKind::ForwardBackward, 3, 0, 1, 1},
                     {OpKind::BackwardWeight, 1, 1},  // the F&B's B's own W: fused
                     {OpKind::ForwardBackward, 4, 0, 2, 1},
                     {OpKind::BackwardWeight, 4, 0},  // the W of the F&B's forward micro-batch: not fused
                     {OpKind::BackwardWeight, 2, 1}},
                    r);
  EXPECT_EQ(r.calls,
            (std::vector<std::string>{"prepare F4&B2.1", "F3.0", "BW1.1", "F4.0", "B2.1", "W4.0", "W2.1"}));
}

TEST(Executor, CommunicationInASingleProcessIsAnErrorNamingTheOp) {
  RecordingRunner r;
  EXPECT_ERROR_CONTAINS(pipeline::execute({{pipeline::OpKind::SendForward, 4}}, r), "sendF4");
}

TEST(Executor, TrainingStageRejectsOutOfOrderAndUnfinishedSchedules) {
  models::TransformerModel m(megaton::testing::tiny_config("gpt-tiny"));
  m.init_weights(1);
  int64_t next = 0;
  auto source = [&](data::Batch& b) { b = make_batch(next++); };
  {
    train::TrainingStage stage(m, source, 2);
    EXPECT_THROW(stage.forward(1, 0), Error);         // micro-batch 0 must come first
    EXPECT_THROW(stage.backward_input(0, 0), Error);  // B before F
  }
  {
    train::TrainingStage stage(m, source, 2);
    stage.forward(0, 0);
    stage.backward(0, 0);
    EXPECT_THROW(stage.mean_loss(), Error);  // micro-batch 1 never ran
  }
  models::TransformerModel two(megaton::testing::tiny_config("gpt-tiny"), 2);
  two.init_weights(1);
  train::TrainingStage stage(two, source, 1);
  EXPECT_ERROR_CONTAINS(stage.forward(0, 1), "before its forward");  // chunk 1 before chunk 0
  stage.forward(0, 0);
  EXPECT_ERROR_CONTAINS(stage.backward_input(0, 0), "before the forward of every chunk");
  stage.forward(0, 1);
  EXPECT_ERROR_CONTAINS(stage.backward_input(0, 0), "the backward of every later chunk");
  EXPECT_ERROR_CONTAINS(stage.forward(0, 2), "chunk 2 of a model with 2");
}
