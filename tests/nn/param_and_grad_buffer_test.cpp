// The flat weight / gradient buffer: layout, bucket-ready announcements during backward, and the
// optimizer and grad norm running over the flat buffers.
#include "megaton/nn/param_and_grad_buffer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "../support/temp_dir.h"
#include "../support/tiny_model.h"
#include "megaton/models/transformer_model.h"
#include "megaton/optim/adamw.h"
#include "megaton/optim/grad_clip.h"

using namespace megaton;

namespace {

// Deterministic tokens and targets for one micro-batch.
std::pair<Tensor, Tensor> batch(int64_t B, int64_t T, int seed) {
  Tensor in = Tensor::empty({B, T}, DType::I32), tg = Tensor::empty({B, T}, DType::I32);
  for (int64_t i = 0; i < B * T; ++i) {
    in.data<int32_t>()[i] = static_cast<int32_t>((i * 7 + seed * 31) % 257);
    tg.data<int32_t>()[i] = static_cast<int32_t>((i * 13 + seed * 17) % 257);
  }
  return {in, tg};
}

void train_microbatches(models::TransformerModel& m, int microbatches) {
  for (int mb = 0; mb < microbatches; ++mb) {
    auto [in, tg] = batch(2, 16, mb);
    models::ModelCtx ctx;
    m.forward(ctx, in, tg, true, 1.0f / static_cast<float>(microbatches));
    m.backward(ctx);
  }
}

// Copies each bucket's gradients at the moment it is announced ready, so a test can check that
// nothing wrote to them afterwards (a gradient announced before it was final).
struct ReadyRecorder {
  const nn::ParamAndGradBuffer& buffer;
  std::vector<size_t> order;
  std::map<size_t, std::vector<float>> at_ready;

  explicit ReadyRecorder(nn::ParamAndGradBuffer& b) : buffer(b) {
    b.on_bucket_ready([this](size_t i) {
      order.push_back(i);
      const nn::GradBucket& bk = buffer.buckets()[i];
      const float* g = buffer.grads().data<float>() + bk.offset;
      at_ready[i].assign(g, g + bk.numel);
    });
  }
  // Names of the parameters whose gradient differs from what it was when its bucket fired.
  std::vector<std::string> changed_after_ready() const {
    std::vector<std::string> changed;
    for (const auto& [i, snapshot] : at_ready)
      for (const nn::Parameter* p : buffer.buckets()[i].params) {
        const int64_t off = buffer.offset_of(*p) - buffer.buckets()[i].offset;
        if (std::memcmp(snapshot.data() + off, p->grad.data<float>(), p->grad.nbytes()) != 0)
          changed.push_back(p->name);
      }
    return changed;
  }
};

}  // namespace

TEST(ParamAndGradBuffer, LaysParametersOutInReverseAlignedAndKeepsTheirValues) {
  models::TransformerModel m(megaton::testing::tiny_config("llama-tiny"));
  m.init_weights(3);
  std::map<std::string, std::vector<float>> before;
  for (auto* p : m.parameters()) before[p->name].assign(p->value.data<float>(), p->value.data<float>() + p->value.numel());
  nn::ParamAndGradBuffer buf(m.parameters(), 0);
  const auto& params = m.parameters();
  ASSERT_EQ(buf.params().size(), params.size());
  int64_t prev_end = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    nn::Parameter* p = buf.params()[i];
    EXPECT_EQ(p, params[params.size() - 1 - i]) << "buffer order is the reverse of registration";
    const int64_t off = buf.offset_of(*p);
    EXPECT_EQ(off % nn::ParamAndGradBuffer::kAlignElements, 0) << p->name;
    EXPECT_GE(off, prev_end) << p->name << " overlaps its predecessor";
    prev_end = off + p->value.numel();
    EXPECT_TRUE(p->value.shares_storage_with(buf.weights())) << p->name;
    EXPECT_TRUE(p->grad.shares_storage_with(buf.grads())) << p->name;
    EXPECT_EQ(p->value.storage_offset(), off);
    EXPECT_EQ(p->grad.storage_offset(), off);
    EXPECT_EQ(std::memcmp(p->value.data<float>(), before[p->name].data(), p->value.nbytes()), 0) << p->name;
  }
  EXPECT_LE(prev_end, buf.weights().numel());
  ASSERT_EQ(buf.buckets().size(), 1u);
  EXPECT_EQ(buf.buckets()[0].numel, buf.grads().numel());
}

TEST(ParamAndGradBuffer, CutsBucketsOfAtLeastBucketSizeWithoutSplittingAParameter) {
  models::TransformerModel m(megaton::testing::tiny_config("gpt-tiny"));
  const int64_t bucket_size = 5000;
  nn::ParamAndGradBuffer buf(m.parameters(), bucket_size);
  const auto& buckets = buf.buckets();
  ASSERT_GT(buckets.size(), 3u);
  int64_t next = 0;
  size_t seen = 0;
  for (size_t b = 0; b < buckets.size(); ++b) {
    EXPECT_EQ(buckets[b].offset, next) << "buckets tile the buffer";
    if (b + 1 < buckets.size()) {
      EXPECT_GE(buckets[b].numel, bucket_size) << "bucket " << b;
    }
    for (const nn::Parameter* p : buckets[b].params) {
      EXPECT_EQ(p, buf.params()[seen++]) << "buckets keep buffer order";
      EXPECT_GE(buf.offset_of(*p), buckets[b].offset);
      EXPECT_LE(buf.offset_of(*p) + p->value.numel(), buckets[b].offset + buckets[b].numel) << p->name;
    }
    next = buckets[b].offset + buckets[b].numel;
  }
  EXPECT_EQ(seen, buf.params().size());
  EXPECT_EQ(next, buf.grads().numel());
}

// Buckets fire in reverse order of use (head and last layers first, embedding last), each exactly
// once, only in the step's last micro-batch, and only once every gradient in them is final. With
// one parameter per bucket the order is checked parameter by parameter.
TEST(ParamAndGradBuffer, BucketsFireInReverseOrderOnceWhenTheirGradientsAreFinal) {
  for (const std::string preset : {"gpt-tiny", "llama-tiny"}) {
    SCOPED_TRACE(preset);
    models::TransformerModel m(megaton::testing::tiny_config(preset));
    m.init_weights(5);
    nn::ParamAndGradBuffer buf(m.parameters(), 1);
    ReadyRecorder rec(buf);
    buf.begin_step(3);
    train_microbatches(m, 2);
    EXPECT_TRUE(rec.order.empty()) << "a bucket fired before the last micro-batch";
    train_microbatches(m, 1);
    buf.end_step();
    std::vector<size_t> expected(buf.buckets().size());
    for (size_t i = 0; i < expected.size(); ++i) expected[i] = i;
    EXPECT_EQ(rec.order, expected);
    EXPECT_TRUE(rec.changed_after_ready().empty()) << rec.changed_after_ready().front();
  }
}

// The recorder above must notice a gradient written after its bucket fired: poison one and see.
TEST(ParamAndGradBuffer, AGradientWrittenAfterReadyIsDetected) {
  models::TransformerModel m(megaton::testing::tiny_config("gpt-tiny"));
  m.init_weights(5);
  nn::ParamAndGradBuffer buf(m.parameters(), 3000);
  ReadyRecorder rec(buf);
  buf.begin_step(1);
  train_microbatches(m, 1);
  buf.end_step();
  ASSERT_TRUE(rec.changed_after_ready().empty());
  nn::Parameter* poisoned = buf.buckets()[0].params.front();
  poisoned->grad.data<float>()[0] += 1.0f;
  EXPECT_EQ(rec.changed_after_ready(), std::vector<std::string>{poisoned->name});
}

// A tied word embedding gets gradient from the head (first) and the embedding (last): its bucket
// must wait for both.
TEST(ParamAndGradBuffer, TiedEmbeddingIsFinalOnlyAfterBothUses) {
  models::TransformerModel m(megaton::testing::tiny_config("gpt-tiny"));
  ASSERT_TRUE(m.config().tie_embeddings);
  EXPECT_EQ(m.embedding().word.uses, 2);
  m.init_weights(5);
  nn::ParamAndGradBuffer buf(m.parameters(), 1);  // one bucket per parameter
  ReadyRecorder rec(buf);
  buf.begin_step(1);
  train_microbatches(m, 1);
  buf.end_step();
  ASSERT_FALSE(rec.order.empty());
  EXPECT_EQ(buf.buckets()[rec.order.back()].params.front(), &m.embedding().word) << "word embedding fired early";
  EXPECT_TRUE(rec.changed_after_ready().empty());
}

TEST(ParamAndGradBuffer, MissingOrExtraAccumulationsAreErrorsNamingTheParameter) {
  models::TransformerModel m(megaton::testing::tiny_config("llama-tiny"));
  m.init_weights(5);
  nn::ParamAndGradBuffer buf(m.parameters(), 0);
  buf.begin_step(2);
  train_microbatches(m, 1);
  EXPECT_ERROR_CONTAINS(buf.end_step(), "is missing 1 of its 2 accumulations");
  buf.begin_step(1);
  train_microbatches(m, 1);
  EXPECT_THROW(train_microbatches(m, 1), Error);  // a second backward after every gradient was final
}

// Outside a step (evaluation with gradients) backward accumulates without announcing anything.
TEST(ParamAndGradBuffer, BackwardOutsideAStepAnnouncesNothing) {
  models::TransformerModel m(megaton::testing::tiny_config("gpt-tiny"));
  nn::ParamAndGradBuffer buf(m.parameters(), 0);
  ReadyRecorder rec(buf);
  train_microbatches(m, 2);
  EXPECT_TRUE(rec.order.empty());
}

// AdamW over the flat buffers updates exactly as AdamW over separate per-parameter tensors, and
// the flat grad norm equals the per-parameter one to rounding.
TEST(ParamAndGradBuffer, AdamWAndGradNormOverFlatBuffersMatchPerParameterOnes) {
  const auto cfg = megaton::testing::tiny_config("gpt-tiny");
  models::TransformerModel flat(cfg), separate(cfg);
  flat.init_weights(9);
  separate.init_weights(9);
  nn::ParamAndGradBuffer buf(flat.parameters(), 2000);
  optim::AdamW flat_opt(buf, {});
  optim::AdamW separate_opt(separate.parameters(), {});
  for (int step = 0; step < 3; ++step) {
    buf.begin_step(1);
    nn::zero_grads(separate.parameters());
    train_microbatches(flat, 1);
    train_microbatches(separate, 1);
    buf.end_step();
    const double flat_norm = optim::global_norm({buf.grads()});
    const double separate_norm = optim::global_grad_norm(separate.parameters());
    ASSERT_TRUE(std::isfinite(flat_norm));
    EXPECT_NEAR(flat_norm, separate_norm, 1e-12 * separate_norm);
    flat_opt.step(1e-3, 0.5);
    separate_opt.step(1e-3, 0.5);
  }
  for (size_t i = 0; i < flat.parameters().size(); ++i) {
    const nn::Parameter& a = *flat.parameters()[i];
    const nn::Parameter& b = *separate.parameters()[i];
    EXPECT_EQ(std::memcmp(a.value.data<float>(), b.value.data<float>(), a.value.nbytes()), 0) << a.name;
  }
  const auto flat_state = flat_opt.state_tensors(), separate_state = separate_opt.state_tensors();
  std::map<std::string, Tensor> by_name(separate_state.begin(), separate_state.end());
  ASSERT_EQ(flat_state.size(), separate_state.size());
  for (const auto& [name, t] : flat_state) {
    ASSERT_TRUE(by_name.count(name)) << name;
    EXPECT_EQ(std::memcmp(t.raw(), by_name[name].raw(), t.nbytes()), 0) << name;
  }
}
