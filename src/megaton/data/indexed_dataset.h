// Megatron-LM's indexed dataset (megatron/core/datasets/indexed_dataset.py), so that token files made
// by Megatron's preprocess_data.py train here unchanged and ours train there.
//
// PREFIX.bin holds the tokens of every sequence back to back. PREFIX.idx holds, little-endian:
//   9 bytes   magic "MMIDIDX\0\0"
//   u64       version (1)
//   u8        dtype code of the tokens (megatron_dtype_code)
//   u64       S, the sequence count
//   u64       D, the count of document indices (documents + 1)
//   i32[S]    sequence lengths in tokens
//   i64[S]    sequence byte offsets into .bin
//   i64[D]    document indices: document i is sequences [idx[i], idx[i+1]); idx[0] = 0, idx[D-1] = S
#pragma once
#include <array>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "megaton/core/atomic_file.h"
#include "megaton/core/dtype.h"
#include "megaton/data/mapped_file.h"

namespace megaton::data {

inline constexpr std::array<char, 9> kIndexMagic{'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr uint64_t kIndexVersion = 1;
inline constexpr size_t kIndexHeaderBytes = 9 + 8 + 1 + 8 + 8;

// Megatron's dtype codes: uint8=1 int8=2 int16=3 int32=4 int64=5 float64=6 float32=7 uint16=8.
uint8_t megatron_dtype_code(DType t);          // throws for dtypes without a code (bf16, f16, u32, u64)
DType dtype_from_megatron_code(uint8_t code);  // throws listing the valid codes

// The token dtype Megatron's preprocess_data.py picks: uint16 for vocabularies under 65500, else int32.
DType smallest_token_dtype(int64_t vocab_size);

// Streams tokens to PREFIX.bin.tmp; finalize() writes PREFIX.idx.tmp and renames both into place.
// Destroying an unfinalized writer removes the temporaries, so a failed run leaves nothing behind.
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(std::string prefix, DType dtype);

  // Tokens must be representable in the dataset dtype exactly; otherwise an error names the token.
  void add_sequence(std::span<const int32_t> tokens);
  void add_sequence(std::span<const int64_t> tokens);
  // Closes the current document: the sequences added since the previous end_document().
  void end_document();
  void add_document(std::span<const int32_t> tokens);
  void add_document(std::span<const int64_t> tokens);
  void finalize();

  size_t num_sequences() const { return lengths_.size(); }
  size_t num_documents() const { return doc_indices_.size() - 1; }

 private:
  template <typename In>
  void append(std::span<const In> tokens);

  std::string prefix_;
  DType dtype_;
  AtomicFile bin_;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> doc_indices_{0};
  std::vector<uint8_t> scratch_;  // one sequence converted to the dataset dtype
  bool finalized_ = false;
};

class IndexedDataset {
 public:
  static constexpr size_t kAll = std::numeric_limits<size_t>::max();

  // Maps PREFIX.idx and PREFIX.bin and validates the index completely, so later reads cannot fault
  // unless a file shrinks while mapped; that is an error naming it (not SIGBUS).
  static IndexedDataset open(const std::string& prefix);

  size_t num_sequences() const { return num_sequences_; }
  size_t num_documents() const { return doc_indices_.size() - 1; }
  DType dtype() const { return dtype_; }
  size_t sequence_length(size_t seq) const;
  // num_documents() + 1 entries; document i is sequences [d[i], d[i+1]).
  std::span<const int64_t> document_indices() const { return doc_indices_; }
  const std::string& prefix() const { return prefix_; }

  // Tokens [offset, offset + length) of a sequence (length clipped to the sequence end when kAll),
  // converted from the stored dtype; a token that does not fit the result type is an error.
  std::vector<int32_t> get(size_t seq, size_t offset = 0, size_t length = kAll) const;
  std::vector<int64_t> get_int64(size_t seq, size_t offset = 0, size_t length = kAll) const;
  // The same into out (length tokens, no kAll), without allocating: the sampling hot path.
  void get(size_t seq, size_t offset, size_t length, int32_t* out) const;

 private:
  IndexedDataset() = default;
  template <typename Out>
  std::vector<Out> read(size_t seq, size_t offset, size_t length) const;
  template <typename Out>
  void read_into(size_t seq, size_t offset, size_t length, Out* out) const;
  int64_t sequence_pointer(size_t seq) const;
  // Runs read() (loads from the maps) so that a fault from a file truncated while mapped is an error
  // naming it rather than SIGBUS.
  template <typename F>
  void guarded(F&& read) const;

  std::string prefix_;
  MappedFile idx_;
  MappedFile bin_;
  DType dtype_ = DType::U16;
  size_t num_sequences_ = 0;
  // Lengths and pointers are read in place from the mapped index; document indices are copied because
  // they are validated in full on open anyway and callers want them as a span.
  std::vector<int64_t> doc_indices_;
};

}  // namespace megaton::data
