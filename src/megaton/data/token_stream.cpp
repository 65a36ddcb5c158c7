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

void read_samples(const TokenStream& stream, const int64_t* ids, int64_t B, int64_t T, int32_t* inputs,
                  int32_t* targets) {
  std::vector<int32_t> buf(static_cast<size_t>(T + 1));
  for (int64_t b = 0; b < B; ++b) {
    stream.read(ids[b] * T, T + 1, buf.data());
    std::copy_n(buf.begin(), T, inputs + b * T);
    std::copy_n(buf.begin() + 1, T, targets + b * T);
  }
}

}  // namespace megaton::data
