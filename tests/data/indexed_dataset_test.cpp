#include "megaton/data/indexed_dataset.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <limits>

#include "../support/temp_dir.h"

using namespace megaton;
using namespace megaton::data;
using megaton::testing::read_bytes;
using megaton::testing::TempDir;
using megaton::testing::write_bytes;

namespace {

// Every dtype Megatron can name, with its code from megatron/core/datasets/indexed_dataset.py.
const std::vector<std::pair<DType, uint8_t>> kMegatronCodes = {{DType::U8, 1},  {DType::I8, 2},  {DType::I16, 3},
                                                               {DType::I32, 4}, {DType::I64, 5}, {DType::F64, 6},
                                                               {DType::F32, 7}, {DType::U16, 8}};

// Tokens that exercise the range of a dtype: small ids plus its extremes (or, for floats, the largest
// integers they hold exactly).
std::vector<int64_t> extreme_tokens(DType t) {
  switch (t) {
    case DType::U8:
      return {0, 255};
    case DType::I8:
      return {-128, 127};
    case DType::I16:
      return {-32768, 32767};
    case DType::U16:
      return {0, 65535};
    case DType::I32:
      return {INT32_MIN, INT32_MAX};
    case DType::I64:
      return {INT64_MIN, INT64_MAX};
    case DType::F32:
      return {-(int64_t{1} << 24), int64_t{1} << 24};
    case DType::F64:
      return {-(int64_t{1} << 53), int64_t{1} << 53};
    default:
      return {};
  }
}

// Documents: {seq, seq}, {}, {seq with the extremes, empty seq}, {seq}.
std::vector<std::vector<std::vector<int64_t>>> sample_documents(DType t) {
  return {{{1, 2, 3}, {4}}, {}, {extreme_tokens(t), {}}, {{7, 8, 9, 10, 11}}};
}

std::string write_sample(const TempDir& dir, DType t) {
  std::string prefix = dir.file("ds_" + std::string(dtype_name(t)));
  IndexedDatasetWriter w(prefix, t);
  for (const auto& doc : sample_documents(t)) {
    for (const auto& seq : doc) w.add_sequence(seq);
    w.end_document();
  }
  w.finalize();
  return prefix;
}

void patch(const std::string& path, size_t offset, const void* bytes, size_t n) {
  std::string s = read_bytes(path);
  std::memcpy(s.data() + offset, bytes, n);
  write_bytes(path, s);
}

}  // namespace

TEST(IndexedDataset, MegatronDtypeCodes) {
  for (auto [t, code] : kMegatronCodes) {
    EXPECT_EQ(megatron_dtype_code(t), code) << dtype_name(t);
    EXPECT_EQ(dtype_from_megatron_code(code), t);
  }
  EXPECT_ERROR_CONTAINS(dtype_from_megatron_code(9), "9", "8=uint16");
  EXPECT_ERROR_CONTAINS(megatron_dtype_code(DType::BF16), "bf16");
}

TEST(IndexedDataset, SmallestTokenDtypeFollowsMegatron) {
  EXPECT_EQ(smallest_token_dtype(257), DType::U16);
  EXPECT_EQ(smallest_token_dtype(50257), DType::U16);
  EXPECT_EQ(smallest_token_dtype(65499), DType::U16);
  EXPECT_EQ(smallest_token_dtype(65500), DType::I32);
  EXPECT_EQ(smallest_token_dtype(128256), DType::I32);
  EXPECT_ERROR_CONTAINS(smallest_token_dtype(0), "vocabulary");
}

TEST(IndexedDataset, WriteThenReadEveryDtypeCode) {
  TempDir dir;
  for (auto [t, code] : kMegatronCodes) {
    SCOPED_TRACE(dtype_name(t));
    std::string prefix = write_sample(dir, t);
    EXPECT_EQ(static_cast<uint8_t>(read_bytes(prefix + ".idx")[17]), code);

    auto ds = IndexedDataset::open(prefix);
    auto docs = sample_documents(t);
    EXPECT_EQ(ds.dtype(), t);
    ASSERT_EQ(ds.num_documents(), docs.size());
    ASSERT_EQ(ds.num_sequences(), 5u);
    std::vector<int64_t> expected_index{0, 2, 2, 4, 5};
    EXPECT_EQ(std::vector<int64_t>(ds.document_indices().begin(), ds.document_indices().end()), expected_index);
    size_t seq = 0;
    for (const auto& doc : docs)
      for (const auto& tokens : doc) {
        EXPECT_EQ(ds.sequence_length(seq), tokens.size());
        EXPECT_EQ(ds.get_int64(seq), tokens);
        ++seq;
      }
    // int32 view of sequences whose tokens fit, and a window inside one.
    EXPECT_EQ(ds.get(0), (std::vector<int32_t>{1, 2, 3}));
    EXPECT_EQ(ds.get(4, 1, 3), (std::vector<int32_t>{8, 9, 10}));
    EXPECT_EQ(ds.get(4, 5), std::vector<int32_t>{});
    EXPECT_EQ(ds.get_int64(4, 2), (std::vector<int64_t>{9, 10, 11}));
  }
}

TEST(IndexedDataset, WrittenBytesMatchMegatronLayout) {
  TempDir dir;
  std::string prefix = dir.file("layout");
  IndexedDatasetWriter w(prefix, DType::U16);
  w.add_document(std::vector<int32_t>{5, 6, 7});
  w.add_document(std::vector<int32_t>{300});
  w.finalize();

  std::string idx = read_bytes(prefix + ".idx");
  ASSERT_EQ(idx.size(), kIndexHeaderBytes + 2 * 4 + 2 * 8 + 3 * 8);
  EXPECT_EQ(idx.substr(0, 9), std::string("MMIDIDX\0\0", 9));
  auto at = [&](size_t off, auto v) {
    std::memcpy(&v, idx.data() + off, sizeof v);
    return v;
  };
  EXPECT_EQ(at(9, uint64_t{}), 1u);
  EXPECT_EQ(at(17, uint8_t{}), 8);
  EXPECT_EQ(at(18, uint64_t{}), 2u);  // sequences
  EXPECT_EQ(at(26, uint64_t{}), 3u);  // document indices, including the leading 0
  EXPECT_EQ(at(34, int32_t{}), 3);
  EXPECT_EQ(at(38, int32_t{}), 1);
  EXPECT_EQ(at(42, int64_t{}), 0);
  EXPECT_EQ(at(50, int64_t{}), 6);  // byte pointer: 3 uint16 tokens
  EXPECT_EQ(at(58, int64_t{}), 0);
  EXPECT_EQ(at(66, int64_t{}), 1);
  EXPECT_EQ(at(74, int64_t{}), 2);
  EXPECT_EQ(read_bytes(prefix + ".bin"), std::string("\x05\0\x06\0\x07\0\x2c\x01", 8));
}

TEST(IndexedDataset, EmptyDatasetRoundTrips) {
  TempDir dir;
  std::string prefix = dir.file("empty");
  IndexedDatasetWriter(prefix, DType::I32).finalize();
  auto ds = IndexedDataset::open(prefix);
  EXPECT_EQ(ds.num_sequences(), 0u);
  EXPECT_EQ(ds.num_documents(), 0u);
  EXPECT_ERROR_CONTAINS(ds.get(0), "sequence 0 out of range");
}

TEST(IndexedDataset, ReadErrorsNameTheProblem) {
  TempDir dir;
  std::string prefix = write_sample(dir, DType::I64);
  auto ds = IndexedDataset::open(prefix);
  EXPECT_ERROR_CONTAINS(ds.get(2), ".bin", "sequence 2", "i32", "get_int64");  // INT64_MIN does not fit
  EXPECT_ERROR_CONTAINS(ds.get(5), "sequence 5 out of range");
  EXPECT_ERROR_CONTAINS(ds.get(0, 4), "offset 4");
  EXPECT_ERROR_CONTAINS(ds.get(0, 1, 3), "run past the end of sequence 0");
}

TEST(IndexedDataset, WriterRejectsUnrepresentableTokensAndCleansUp) {
  TempDir dir;
  std::string prefix = dir.file("bad");
  {
    IndexedDatasetWriter w(prefix, DType::U8);
    w.add_document(std::vector<int32_t>{1, 2});
    EXPECT_ERROR_CONTAINS(w.add_sequence(std::vector<int32_t>{3, 256}), "token 256", "u8");
    EXPECT_ERROR_CONTAINS(w.add_sequence(std::vector<int64_t>{-1}), "token -1");
  }
  {
    IndexedDatasetWriter w(prefix, DType::F32);
    EXPECT_ERROR_CONTAINS(w.add_sequence(std::vector<int32_t>{(1 << 24) + 1}), "16777217", "f32");
    w.add_sequence(std::vector<int32_t>{1});
    EXPECT_ERROR_CONTAINS(w.finalize(), "end_document");
  }
  EXPECT_ERROR_CONTAINS(IndexedDatasetWriter(prefix, DType::BF16), "bf16");
  EXPECT_TRUE(dir.entries().empty());  // abandoned writers leave neither data nor temporaries
}

TEST(IndexedDataset, MissingFilesAreNamed) {
  TempDir dir;
  std::string prefix = dir.file("nothing");
  EXPECT_ERROR_CONTAINS(IndexedDataset::open(prefix), prefix + ".idx", "index file");
  std::string real = write_sample(dir, DType::U16);
  std::filesystem::remove(real + ".bin");
  EXPECT_ERROR_CONTAINS(IndexedDataset::open(real), real + ".bin", "data file");
}

TEST(IndexedDataset, TruncatedIndexIsAClearError) {
  TempDir dir;
  std::string prefix = write_sample(dir, DType::U16);
  std::string idx_path = prefix + ".idx";
  std::string idx = read_bytes(idx_path);

  write_bytes(idx_path, idx.substr(0, idx.size() - 5));
  EXPECT_ERROR_CONTAINS(IndexedDataset::open(prefix), idx_path, "truncated", "5 sequences", "5 document indices",
                        std::to_string(idx.size()));
  write_bytes(idx_path, idx.substr(0, 20));
  EXPECT_ERROR_CONTAINS(IndexedDataset::open(prefix), idx_path, "truncated", "header");
  write_bytes(idx_path, idx + "xyz");
  EXPECT_ERROR_CONTAINS(IndexedDataset::open(prefix), idx_path, "3 unexpected bytes");
}

TEST(IndexedDataset, CorruptHeadersAreRejected) {
  TempDir dir;
  std::string prefix = write_sample(dir, DType::U16);
  std::string idx_path = prefix + ".idx";
  std::string good = read_bytes(idx_path);

  patch(idx_path, 0, "MMIDIDY", 7);
  EXPECT_ERROR_CONTAINS(IndexedDataset::open(prefix), idx_path, "bad magic");
  write_bytes(idx_path, good);
  uint64_t version = 2;
  patch(idx_path, 9, &version, 8);
  EXPECT_ERROR_CONTAINS(IndexedDataset::open(prefix), idx_path, "version 2");
  write_bytes(idx_path, good);
  uint8_t code = 9;
  patch(idx_path, 17, &code, 1);
  EXPECT_ERROR_CONTAINS(IndexedDataset::open(prefix), idx_path, "dtype code 9");
  write_bytes(idx_path, good);
  uint64_t huge = uint64_t{1} << 62;  // must not wrap around the size computation
  patch(idx_path, 18, &huge, 8);
  EXPECT_ERROR_CONTAINS(IndexedDataset::open(prefix), idx_path, "truncated");
  write_bytes(idx_path, good);
  int64_t last_doc = 4;  // the final document index must equal the sequence count (5)
  patch(idx_path, good.size() - 8, &last_doc, 8);
  EXPECT_ERROR_CONTAINS(IndexedDataset::open(prefix), idx_path, "document indices");
}

TEST(IndexedDataset, PointersBeyondDataFileAreRejected) {
  TempDir dir;
  std::string prefix = write_sample(dir, DType::I32);
  std::string bin = read_bytes(prefix + ".bin");
  write_bytes(prefix + ".bin", bin.substr(0, bin.size() - 4));
  EXPECT_ERROR_CONTAINS(IndexedDataset::open(prefix), prefix + ".idx", prefix + ".bin", "sequence 4",
                        "has only " + std::to_string(bin.size() - 4) + " bytes");
  // A pointer near the int64 limit: the message's end of the span must not overflow (found by the
  // indexed-dataset fuzzer under UBSan).
  write_bytes(prefix + ".bin", bin);
  const std::string idx = read_bytes(prefix + ".idx");
  int32_t len0 = 0;
  std::memcpy(&len0, idx.data() + kIndexHeaderBytes, 4);        // the int32 lengths, then the pointers
  const int64_t far = std::numeric_limits<int64_t>::max() - 3;  // a multiple of the 4-byte tokens
  patch(prefix + ".idx", kIndexHeaderBytes + 4 * 5, &far, 8);
  EXPECT_ERROR_CONTAINS(IndexedDataset::open(prefix), "sequence 0 spans bytes [" + std::to_string(far) + ", " +
                                                          std::to_string(uint64_t(far) + uint64_t(len0) * 4) + ")");
}
