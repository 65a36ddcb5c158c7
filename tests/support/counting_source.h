// A SampleSource whose sample i is the tokens i * 1000 + t (t = 0..T), so any read tells which sample
// it was; reading a sample listed in fail_at throws, to test error paths.
#pragma once
#include <set>

#include "megaton/core/error.h"
#include "megaton/data/sample_source.h"

namespace megaton::testing {

class CountingSource final : public data::SampleSource {
 public:
  CountingSource(int64_t size, int64_t T, std::set<int64_t> fail_at = {})
      : size_(size), T_(T), fail_at_(std::move(fail_at)) {}
  int64_t size() const override { return size_; }
  int64_t seq_length() const override { return T_; }
  void read(int64_t i, int32_t* out) const override {
    if (fail_at_.count(i)) fail("counting source: sample ", i, " is unreadable");
    for (int64_t t = 0; t <= T_; ++t) out[t] = static_cast<int32_t>(i * 1000 + t);
  }

 private:
  int64_t size_, T_;
  std::set<int64_t> fail_at_;
};

}  // namespace megaton::testing
