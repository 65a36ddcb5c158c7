#include "megaton/data/indexed_dataset.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <optional>
#include <utility>

#include "megaton/core/error.h"
#include "megaton/data/sigbus_guard.h"
#include "megaton/data/token_cast.h"

namespace megaton::data {

// The format is little-endian and is read in place.
static_assert(std::endian::native == std::endian::little, "indexed dataset I/O assumes a little-endian host");

namespace {

constexpr std::array<std::pair<uint8_t, DType>, 8> kCodes{{{1, DType::U8},
                                                           {2, DType::I8},
                                                           {3, DType::I16},
                                                           {4, DType::I32},
                                                           {5, DType::I64},
                                                           {6, DType::F64},
                                                           {7, DType::F32},
                                                           {8, DType::U16}}};
constexpr const char* kCodeList = "1=uint8 2=int8 3=int16 4=int32 5=int64 6=float64 7=float32 8=uint16";

std::optional<DType> lookup_code(uint8_t code) {
  for (const auto& [c, t] : kCodes)
    if (c == code) return t;
  return std::nullopt;
}

// The index's arrays start at byte 34, so they are not naturally aligned: load through memcpy.
template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

uint8_t megatron_dtype_code(DType t) {
  for (const auto& [c, dt] : kCodes)
    if (dt == t) return c;
  fail("dtype ", dtype_name(t),
       " has no Megatron indexed dataset code (supported: u8, i8, i16, i32, i64, f64, f32, u16)");
}

DType dtype_from_megatron_code(uint8_t code) {
  if (auto t = lookup_code(code)) return *t;
  fail("unknown Megatron indexed dataset dtype code ", int{code}, " (expected ", kCodeList, ")");
}

DType smallest_token_dtype(int64_t vocab_size) {
  if (vocab_size <= 0) fail("vocabulary size must be positive, got ", vocab_size);
  // 65500 rather than 65536 matches Megatron's DType.optimal_dtype, so both tools write identical files.
  return vocab_size < 65500 ? DType::U16 : DType::I32;
}

IndexedDataset IndexedDataset::open(const std::string& prefix) {
  IndexedDataset ds;
  ds.prefix_ = prefix;
  ds.idx_ = MappedFile(prefix + ".idx", "index file");
  ds.bin_ = MappedFile(prefix + ".bin", "data file");
  const std::string& idx = ds.idx_.path();
  const uint8_t* p = ds.idx_.data();
  uint64_t size = ds.idx_.size();

  if (size < kIndexHeaderBytes)
    fail(idx, ": truncated index file: ", size, " bytes, but the header alone takes ", kIndexHeaderBytes);
  if (std::memcmp(p, kIndexMagic.data(), kIndexMagic.size()) != 0)
    fail(idx, ": bad magic: expected \"MMIDIDX\\0\\0\" (not a Megatron indexed dataset index)");
  if (auto version = load<uint64_t>(p + 9); version != kIndexVersion)
    fail(idx, ": unsupported index version ", version, " (expected ", kIndexVersion, ")");
  uint8_t code = p[17];
  auto dtype = lookup_code(code);
  if (!dtype) fail(idx, ": unknown dtype code ", int{code}, " (expected ", kCodeList, ")");
  ds.dtype_ = *dtype;
  uint64_t seqs = load<uint64_t>(p + 18);
  uint64_t docs = load<uint64_t>(p + 26);

  // 128-bit so that absurd counts in a corrupt header cannot wrap around and pass.
  unsigned __int128 expected =
      kIndexHeaderBytes + static_cast<unsigned __int128>(seqs) * 12 + static_cast<unsigned __int128>(docs) * 8;
  if (expected > size)
    fail(idx, ": truncated index file: the header says ", seqs, " sequences and ", docs,
         " document indices, which need ", static_cast<uint64_t>(expected), " bytes, but the file has ", size);
  // Megatron's multimodal datasets append one int8 mode per sequence, which we ignore.
  if (size != expected && size != expected + seqs)
    fail(idx, ": ", size - static_cast<uint64_t>(expected), " unexpected bytes after the document indices (expected ",
         static_cast<uint64_t>(expected), " bytes)");
  if (docs == 0) fail(idx, ": no document indices (expected at least the leading 0)");
  ds.num_sequences_ = seqs;

  const uint8_t* doc_base = p + kIndexHeaderBytes + 12 * seqs;
  ds.doc_indices_.resize(docs);
  for (uint64_t i = 0; i < docs; ++i) {
    int64_t d = load<int64_t>(doc_base + 8 * i);
    if (d < (i ? ds.doc_indices_[i - 1] : 0) || static_cast<uint64_t>(d) > seqs)
      fail(idx, ": document index ", i, " is ", d, "; expected a non-decreasing sequence number in [0, ", seqs, "]");
    ds.doc_indices_[i] = d;
  }
  if (ds.doc_indices_.front() != 0 || static_cast<uint64_t>(ds.doc_indices_.back()) != seqs)
    fail(idx, ": document indices run from ", ds.doc_indices_.front(), " to ", ds.doc_indices_.back(),
         "; expected 0 to the sequence count ", seqs);

  uint64_t bin_size = ds.bin_.size();
  uint64_t esize = dtype_size(ds.dtype_);
  for (uint64_t i = 0; i < seqs; ++i) {
    int64_t len = load<int32_t>(p + kIndexHeaderBytes + 4 * i);
    int64_t ptr = ds.sequence_pointer(i);
    if (len < 0) fail(idx, ": sequence ", i, " has negative length ", len);
    if (ptr < 0 || static_cast<uint64_t>(ptr) % esize != 0)
      fail(idx, ": sequence ", i, " has pointer ", ptr, "; expected a non-negative multiple of ", esize);
    if (static_cast<uint64_t>(ptr) > bin_size || static_cast<uint64_t>(len) * esize > bin_size - ptr)
      fail(idx, ": sequence ", i, " spans bytes [", ptr, ", ",
           static_cast<uint64_t>(ptr) + static_cast<uint64_t>(len) * esize, ") but ", ds.bin_.path(), " has only ",
           bin_size, " bytes");
  }
  return ds;
}

int64_t IndexedDataset::sequence_pointer(size_t seq) const {
  return load<int64_t>(idx_.data() + kIndexHeaderBytes + 4 * num_sequences_ + 8 * seq);
}

template <typename F>
void IndexedDataset::guarded(F&& read) const {
  if (const void* fault = catch_sigbus(read)) (bin_.contains(fault) ? bin_ : idx_).fail_changed();
}

size_t IndexedDataset::sequence_length(size_t seq) const {
  if (seq >= num_sequences_) fail(prefix_, ": sequence ", seq, " out of range (", num_sequences_, " sequences)");
  int32_t len = 0;
  guarded([&] { len = load<int32_t>(idx_.data() + kIndexHeaderBytes + 4 * seq); });
  return static_cast<size_t>(len);
}

template <typename Out>
void IndexedDataset::read_into(size_t seq, size_t offset, size_t length, Out* out) const {
  size_t len = sequence_length(seq);
  if (offset > len) fail(prefix_, ": offset ", offset, " is past the end of sequence ", seq, " (", len, " tokens)");
  if (length > len - offset)
    fail(prefix_, ": tokens [", offset, ", ", offset + length, ") run past the end of sequence ", seq, " (", len,
         " tokens)");
  if (length == 0) return;
  visit_token_type(dtype_, [&](auto tag) {
    using In = typename decltype(tag)::type;
    size_t bad = length;
    In bad_token{};
    guarded([&] {
      // Pointers were checked to be multiples of the element size, and the map is page aligned.
      const In* src = reinterpret_cast<const In*>(bin_.data() + sequence_pointer(seq) + offset * dtype_size(dtype_));
      bad = convert_tokens(src, length, out);
      if (bad != length) bad_token = src[bad];
    });
    if (bad != length)
      fail(bin_.path(), ": token ", +bad_token, " at position ", offset + bad, " of sequence ", seq,
           " is not representable as ", dtype_name(dtype_of<Out>()),
           std::is_same_v<Out, int32_t> ? " (read it with get_int64)" : "");
  });
}

template <typename Out>
std::vector<Out> IndexedDataset::read(size_t seq, size_t offset, size_t length) const {
  const size_t len = sequence_length(seq);
  if (length == kAll) length = len - std::min(offset, len);
  std::vector<Out> out(length);
  read_into(seq, offset, length, out.data());
  return out;
}

std::vector<int32_t> IndexedDataset::get(size_t seq, size_t offset, size_t length) const {
  return read<int32_t>(seq, offset, length);
}

std::vector<int64_t> IndexedDataset::get_int64(size_t seq, size_t offset, size_t length) const {
  return read<int64_t>(seq, offset, length);
}

void IndexedDataset::get(size_t seq, size_t offset, size_t length, int32_t* out) const {
  read_into(seq, offset, length, out);
}

}  // namespace megaton::data
