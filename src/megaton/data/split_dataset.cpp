#include "megaton/data/split_dataset.h"

#include "megaton/core/error.h"
#include "megaton/data/indexed_dataset.h"

namespace megaton::data {

SplitCounts split_by_documents(const std::string& prefix, const std::string& train_prefix,
                               const std::string& valid_prefix, int64_t valid_every) {
  if (valid_every < 2) fail("split_by_documents: valid_every must be at least 2, got ", valid_every);
  IndexedDataset in = IndexedDataset::open(prefix);
  IndexedDatasetWriter train(train_prefix, in.dtype()), valid(valid_prefix, in.dtype());
  SplitCounts counts;
  auto docs = in.document_indices();
  for (size_t d = 0; d + 1 < docs.size(); ++d) {
    const bool to_valid = (static_cast<int64_t>(d) + 1) % valid_every == 0;
    IndexedDatasetWriter& out = to_valid ? valid : train;
    for (int64_t s = docs[d]; s < docs[d + 1]; ++s) out.add_sequence(in.get_int64(static_cast<size_t>(s)));
    out.end_document();
    ++(to_valid ? counts.valid_documents : counts.train_documents);
  }
  train.finalize();
  valid.finalize();
  return counts;
}

}  // namespace megaton::data
