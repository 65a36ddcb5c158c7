#include "megaton/data/token_stream.h"

#include <algorithm>

#include "megaton/core/error.h"

namespace megaton::data {

TokenStream::TokenStream(const std::string& prefix) : ds_(IndexedDataset::open(prefix)) {
  starts_.reserve(ds_.num_sequences() + 1);
  starts_.push_back(0);
  for (size_t i = 0; i < ds_.num_sequences(); ++i)
    starts_.push_back(starts_.back() + static_cast<int64_t>(ds_.sequence_length(i)));
}

void TokenStream::read(int64_t start, int64_t n, int32_t* out) const {
  if (start < 0 || n < 0 || start + n > size())
    fail("dataset '", ds_.prefix(), "': tokens [", start, ", ", start + n, ") are outside its ", size(), " tokens");
  // First sequence containing `start`; zero-length sequences are skipped naturally.
  size_t seq = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), start) - starts_.begin()) - 1;
  while (n > 0) {
    const int64_t offset = start - starts_[seq];
    const int64_t take = std::min<int64_t>(n, starts_[seq + 1] - start);
    if (take > 0) {
      auto part = ds_.get(seq, static_cast<size_t>(offset), static_cast<size_t>(take));
      std::copy(part.begin(), part.end(), out);
      out += take;
      start += take;
      n -= take;
    }
    ++seq;
  }
}

int32_t TokenStream::max_token(int64_t limit) const {
  const int64_t n = std::min(limit, size());
  std::vector<int32_t> buf(static_cast<size_t>(n));
  read(0, n, buf.data());
  return n ? *std::max_element(buf.begin(), buf.end()) : -1;
}

StreamSamples::StreamSamples(std::shared_ptr<const TokenStream> stream, int64_t seq_length, int64_t size)
    : stream_(std::move(stream)), T_(seq_length), samples_(stream_->num_samples(seq_length)) {
  if (samples_ == 0)
    fail("dataset '", stream_->dataset().prefix(), "' has ", stream_->size(), " tokens: not one sample of ", T_ + 1);
  size_ = size < 0 ? samples_ : size;
}

void StreamSamples::read(int64_t i, int32_t* out) const { stream_->read((i % samples_) * T_, T_ + 1, out); }

}  // namespace megaton::data
