// The layout search: only layouts that fit the device's memory (less the margin) are kept, each with
// the lightest activation recompute that makes it fit, ranked by step time.
#include "megaton/plan/search.h"

#include <gtest/gtest.h>

#include "megaton/plan/shipped_systems.h"

using namespace megaton;
using namespace megaton::plan;

namespace {

double peak_of(const std::vector<std::string>& extra) {
  std::vector<std::string> sets = {"training.seq_length=128", "training.global_batch_size=16",
                                   "training.micro_batch_size=16"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  train::TrainConfig c = train::load_train_config("", sets);
  train::resolve_parallel_layout(c, 1);
  return plan_step(c, *shipped_system("h100")).peak_memory_bytes;
}

}  // namespace

TEST(Search, KeepsWhatFitsWithTheLightestRecomputeFastestFirst) {
  // A device between the largest micro-batch's peak with full recompute and without any.
  const double none = peak_of({}), full = peak_of({"training.recompute_granularity=\"full\""});
  ASSERT_LT(full, none);
  SystemSpec s = *shipped_system("h100");
  SearchSpace space;
  space.devices = 1;
  space.global_batch = 16;
  space.seq_length = 128;
  space.memory_margin = 0.1;
  s.memory_bytes = (none + full) / 2 / (1 - space.memory_margin);
  const SearchResult r = search(space, s, 100);
  // Micro-batch 16 fits neither without recompute nor with selective core_attn (it keeps most
  // activations): two extra plans; full recompute fits.
  EXPECT_EQ(r.planned, r.fitting + 2);
  ASSERT_EQ(r.best.size(), r.fitting);
  bool recomputed = false;
  for (size_t i = 0; i < r.best.size(); ++i) {
    EXPECT_LE(r.best[i].plan.peak_memory_bytes, (1 - space.memory_margin) * s.memory_bytes);
    if (i > 0) {
      EXPECT_GE(r.best[i].plan.step_time_s, r.best[i - 1].plan.step_time_s);
    }
    const bool full_here = r.best[i].settings.find("recompute_granularity=\"full\"") != std::string::npos;
    // Only the largest micro-batch needs recompute, and it takes the lightest setting that fits.
    EXPECT_EQ(full_here, r.best[i].settings.find("micro_batch_size=16") != std::string::npos) << r.best[i].settings;
    recomputed = recomputed || full_here;
  }
  EXPECT_TRUE(recomputed);
  // Nothing fits a device smaller than every layout's peak.
  s.memory_bytes = 1e6;
  EXPECT_TRUE(search(space, s, 10).best.empty());
}
