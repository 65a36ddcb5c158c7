// .npy files (the index caches): what write_npy writes reads back, and a header that is not numpy's
// (junk in the shape, dimensions whose product overflows) is an error naming the file. The cases
// below the round trip are inputs the npy fuzzer found (tests/fuzz) or ones of their kind.
#include <gtest/gtest.h>

#include <cstring>

#include "../support/temp_dir.h"
#include "megaton/data/npy_file.h"

namespace megaton::data {
namespace {

using testing::TempDir;

// A version 1.0 .npy file with the given header dict and data bytes, padded as numpy pads.
std::string npy_bytes(const std::string& dict, const std::string& data) {
  std::string header = dict;
  header.append(63 - (10 + header.size()) % 64, ' ');
  header += '\n';
  const auto len = static_cast<uint16_t>(header.size());
  std::string out("\x93NUMPY\x01\x00", 8);
  out.append(reinterpret_cast<const char*>(&len), 2);
  return out + header + data;
}

TEST(NpyFile, WrittenArraysReadBack) {
  TempDir dir;
  const std::vector<int64_t> values{3, -1, 7, 0, 5, 9};
  write_npy<int64_t>(dir.file("a.npy"), values, {2, 3});
  const NpyArray a(dir.file("a.npy"));
  EXPECT_EQ(a.shape(), (std::vector<int64_t>{2, 3}));
  const auto v = a.values<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(v.begin(), v.end()), values);
  EXPECT_ERROR_CONTAINS(a.values<int32_t>(), dir.file("a.npy"), "<i8");
  // numpy's own spelling of a 1-d shape, "(n,)", and of a scalar, "()".
  testing::write_bytes(dir.file("b.npy"), npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }",
                                                    std::string("\x01\0\0\0\x02\0\0\0", 8)));
  EXPECT_EQ(NpyArray(dir.file("b.npy")).shape(), (std::vector<int64_t>{2}));
  testing::write_bytes(dir.file("c.npy"), npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (), }",
                                                    std::string(4, '\0')));
  EXPECT_EQ(NpyArray(dir.file("c.npy")).values<int32_t>().size(), 1u);
}

TEST(NpyFile, MalformedOrOverflowingShapesAreErrorsNamingTheFile) {
  TempDir dir;
  const std::string path = dir.file("bad.npy");
  auto shape_error = [&](const std::string& shape, const std::string& data, const std::string& expected) {
    testing::write_bytes(path, npy_bytes("{'descr': '<i8', 'fortran_order': False, 'shape': " + shape + ", }", data));
    EXPECT_ERROR_CONTAINS(NpyArray{path}, path, expected);
  };
  // Found by the fuzzer: a dimension past int64 (its digits were accumulated with signed overflow).
  shape_error("(6, 1111111111111111111111111111)", "", "malformed 'shape'");
  // Junk between the numbers was skipped, so this was read as (6, 9).
  shape_error("(6,x9)", std::string(8 * 54, '\0'), "malformed 'shape'");
  shape_error("(-3,)", "", "malformed 'shape'");
  // 2^61 elements of 8 bytes: 2^64 bytes, which wrapped to 0 and matched an empty data section.
  shape_error("(2305843009213693952,)", "", "overflows");
  shape_error("(4294967296, 4294967296)", "", "overflows");
}

}  // namespace
}  // namespace megaton::data
