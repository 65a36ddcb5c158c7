#include <cstring>

#include "megaton/core/error.h"
#include "megaton/data/indexed_dataset.h"
#include "megaton/data/token_cast.h"

namespace megaton::data {

IndexedDatasetWriter::IndexedDatasetWriter(std::string prefix, DType dtype)
    : prefix_(std::move(prefix)), dtype_(dtype), bin_(prefix_ + ".bin") {
  megatron_dtype_code(dtype_);  // reject dtypes the format cannot name before any tokens arrive
}

template <typename In>
void IndexedDatasetWriter::append(std::span<const In> tokens) {
  if (finalized_) fail(prefix_, ": add_sequence after finalize()");
  if (tokens.size() > static_cast<size_t>(INT32_MAX))
    fail(prefix_, ": a sequence of ", tokens.size(), " tokens exceeds the format's int32 length field");
  visit_token_type(dtype_, [&](auto tag) {
    using T = typename decltype(tag)::type;
    scratch_.resize(tokens.size() * sizeof(T));
    T* dst = reinterpret_cast<T*>(scratch_.data());  // operator new storage is aligned for any scalar
    size_t bad = convert_tokens(tokens.data(), tokens.size(), dst);
    if (bad != tokens.size())
      fail(prefix_, ".bin: token ", tokens[bad], " (sequence ", lengths_.size(), ", position ", bad,
           ") is not representable in the dataset dtype ", dtype_name(dtype_));
    bin_.write(dst, scratch_.size());
  });
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
}

void IndexedDatasetWriter::add_sequence(std::span<const int32_t> tokens) { append(tokens); }
void IndexedDatasetWriter::add_sequence(std::span<const int64_t> tokens) { append(tokens); }

void IndexedDatasetWriter::end_document() {
  if (finalized_) fail(prefix_, ": end_document after finalize()");
  doc_indices_.push_back(static_cast<int64_t>(lengths_.size()));
}

void IndexedDatasetWriter::add_document(std::span<const int32_t> tokens) {
  append(tokens);
  end_document();
}

void IndexedDatasetWriter::add_document(std::span<const int64_t> tokens) {
  append(tokens);
  end_document();
}

void IndexedDatasetWriter::finalize() {
  if (finalized_) fail(prefix_, ": finalize() called twice");
  if (static_cast<size_t>(doc_indices_.back()) != lengths_.size())
    fail(prefix_, ": ", lengths_.size() - doc_indices_.back(),
         " sequences were added after the last end_document(); end the document before finalize()");

  std::vector<int64_t> pointers(lengths_.size());
  int64_t pos = 0;
  for (size_t i = 0; i < lengths_.size(); ++i) {
    pointers[i] = pos;
    pos += static_cast<int64_t>(lengths_[i]) * static_cast<int64_t>(dtype_size(dtype_));
  }
  uint64_t seqs = lengths_.size();
  uint64_t docs = doc_indices_.size();
  uint8_t code = megatron_dtype_code(dtype_);

  AtomicFile idx(prefix_ + ".idx");
  idx.write(kIndexMagic.data(), kIndexMagic.size());
  idx.write(&kIndexVersion, sizeof kIndexVersion);
  idx.write(&code, 1);
  idx.write(&seqs, sizeof seqs);
  idx.write(&docs, sizeof docs);
  idx.write(lengths_.data(), lengths_.size() * sizeof(int32_t));
  idx.write(pointers.data(), pointers.size() * sizeof(int64_t));
  idx.write(doc_indices_.data(), doc_indices_.size() * sizeof(int64_t));
  // The index goes last, so a new index never points into an old data file.
  bin_.commit();
  idx.commit();
  finalized_ = true;
}

}  // namespace megaton::data
