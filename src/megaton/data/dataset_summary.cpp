#include "megaton/data/dataset_summary.h"

#include <algorithm>
#include <limits>
#include <unordered_map>

namespace megaton::data {

namespace {
// Ids below this are counted in a flat array (every real vocabulary); others, negative ones included, in
// a hash map, so a dataset of arbitrary int64 tokens still summarises.
constexpr int64_t kDenseIds = int64_t{1} << 22;
}  // namespace

DatasetSummary summarize(const IndexedDataset& ds, size_t top) {
  DatasetSummary s;
  s.dtype = ds.dtype();
  s.sequences = static_cast<int64_t>(ds.num_sequences());
  s.documents = static_cast<int64_t>(ds.num_documents());
  s.min_length = s.sequences ? std::numeric_limits<int64_t>::max() : 0;
  s.min_token = std::numeric_limits<int64_t>::max();
  s.max_token = std::numeric_limits<int64_t>::min();
  std::vector<int64_t> dense;
  std::unordered_map<int64_t, int64_t> sparse;
  for (size_t i = 0; i < ds.num_sequences(); ++i) {
    const std::vector<int64_t> tokens = ds.get_int64(i);
    const auto n = static_cast<int64_t>(tokens.size());
    s.tokens += n;
    s.min_length = std::min(s.min_length, n);
    s.max_length = std::max(s.max_length, n);
    for (int64_t t : tokens) {
      s.min_token = std::min(s.min_token, t);
      s.max_token = std::max(s.max_token, t);
      if (t >= 0 && t < kDenseIds) {
        if (static_cast<size_t>(t) >= dense.size()) dense.resize(static_cast<size_t>(t) + 1, 0);
        ++dense[static_cast<size_t>(t)];
      } else {
        ++sparse[t];
      }
    }
  }
  if (s.tokens == 0) s.min_token = s.max_token = 0;
  s.mean_length = s.sequences ? static_cast<double>(s.tokens) / static_cast<double>(s.sequences) : 0;

  std::vector<std::pair<int64_t, int64_t>> counts(sparse.begin(), sparse.end());
  for (size_t id = 0; id < dense.size(); ++id)
    if (dense[id]) counts.emplace_back(static_cast<int64_t>(id), dense[id]);
  s.distinct_tokens = static_cast<int64_t>(counts.size());
  const size_t k = std::min(top, counts.size());
  std::partial_sort(
      counts.begin(), counts.begin() + static_cast<std::ptrdiff_t>(k), counts.end(),
      [](const auto& a, const auto& b) { return a.second != b.second ? a.second > b.second : a.first < b.first; });
  s.top_tokens.assign(counts.begin(), counts.begin() + static_cast<std::ptrdiff_t>(k));
  return s;
}

}  // namespace megaton::data
