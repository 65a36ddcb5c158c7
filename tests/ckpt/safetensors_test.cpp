#include "megaton/ckpt/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "../support/temp_dir.h"

using namespace megaton;
using namespace megaton::ckpt;
using megaton::testing::read_bytes;
using megaton::testing::TempDir;
using megaton::testing::write_bytes;

namespace {

const std::vector<DType> kAllDTypes{DType::F32, DType::F64, DType::BF16, DType::F16, DType::I32, DType::I64,
                                    DType::U8,  DType::I8,  DType::U16,  DType::I16, DType::U32, DType::U64,
                                    DType::F8E4M3, DType::F8E5M2};

// Random bytes rather than values: every bit pattern (NaN payloads, subnormals) must survive unchanged.
Tensor random_tensor(Shape shape, DType dtype, const std::string& name, std::mt19937& rng) {
  Tensor t = Tensor::empty(std::move(shape), dtype, MemCategory::Params, name);
  auto* p = static_cast<uint8_t*>(t.raw());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(rng());
  return t;
}

// A safetensors file from a raw header text, padded like the writer does, followed by `data`.
void write_raw(const std::string& path, std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  uint64_t n = header.size();
  write_bytes(path, std::string(reinterpret_cast<const char*>(&n), 8) + header + data);
}

nlohmann::json header_of(const std::string& path) {
  std::string bytes = read_bytes(path);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  return nlohmann::json::parse(bytes.substr(8, n));
}

}  // namespace

TEST(Safetensors, RoundTripIsBitExactForEveryDtype) {
  TempDir dir;
  std::mt19937 rng(3);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (DType t : kAllDTypes)
    tensors.emplace_back(std::string("w.") + std::string(dtype_name(t)), random_tensor({3, 5}, t, "x", rng));
  tensors.emplace_back("scalar", random_tensor({}, DType::F32, "s", rng));
  tensors.emplace_back("empty", random_tensor({0, 4}, DType::BF16, "e", rng));
  std::string path = dir.file("model.safetensors");
  save_safetensors(path, tensors);
  // FP8 under the names the safetensors format (and HF's FP8 checkpoints) use.
  EXPECT_EQ(header_of(path)["w.f8e4m3"]["dtype"], "F8_E4M3");
  EXPECT_EQ(header_of(path)["w.f8e5m2"]["dtype"], "F8_E5M2");

  auto loaded = load_safetensors(path);
  ASSERT_EQ(loaded.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(loaded.count(name));
    const Tensor& l = loaded.at(name);
    EXPECT_EQ(l.dtype(), t.dtype());
    EXPECT_EQ(l.shape(), t.shape());
    EXPECT_EQ(l.name(), name);
    EXPECT_EQ(l.category(), MemCategory::Other);
    ASSERT_EQ(l.nbytes(), t.nbytes());
    if (t.nbytes()) {
      EXPECT_EQ(std::memcmp(l.raw(), t.raw(), t.nbytes()), 0);
    }
  }
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"model.safetensors"});  // the .tmp is gone
}

TEST(Safetensors, HeaderFollowsTheStandardLayout) {
  TempDir dir;
  std::mt19937 rng(4);
  std::string path = dir.file("m.safetensors");
  save_safetensors(path, {{"b", random_tensor({2}, DType::BF16, "b", rng)},
                          {"a", random_tensor({2, 2}, DType::F32, "a", rng)},
                          {"c", random_tensor({1}, DType::I64, "c", rng)}});
  auto h = header_of(path);
  // Data in the order given, not sorted by name.
  EXPECT_EQ(h["b"]["data_offsets"], nlohmann::json({0, 4}));
  EXPECT_EQ(h["a"]["data_offsets"], nlohmann::json({4, 20}));
  EXPECT_EQ(h["c"]["data_offsets"], nlohmann::json({20, 28}));
  EXPECT_EQ(h["b"]["dtype"], "BF16");
  EXPECT_EQ(h["a"]["dtype"], "F32");
  EXPECT_EQ(h["c"]["dtype"], "I64");
  EXPECT_EQ(h["a"]["shape"], nlohmann::json({2, 2}));
  EXPECT_FALSE(h.contains("__metadata__"));
}

TEST(Safetensors, MetadataRoundTrips) {
  TempDir dir;
  std::string path = dir.file("m.safetensors");
  std::map<std::string, std::string> meta{{"format", "pt"}, {"step", "1200"}, {"note", "ünïcode \"quoted\""}};
  save_safetensors(path, {{"x", Tensor::zeros({2}, DType::F16)}}, meta);
  EXPECT_EQ(header_of(path)["__metadata__"]["step"], "1200");
  std::map<std::string, std::string> got{{"stale", "entry"}};
  load_safetensors(path, &got);
  EXPECT_EQ(got, meta);

  save_safetensors(path, {{"x", Tensor::zeros({2}, DType::F16)}});
  load_safetensors(path, &got);
  EXPECT_TRUE(got.empty());
}

TEST(Safetensors, SaveErrorsLeaveNothingBehind) {
  TempDir dir;
  std::string path = dir.file("m.safetensors");
  Tensor x = Tensor::zeros({2}, DType::F32);
  EXPECT_ERROR_CONTAINS(save_safetensors(path, {{"x", x}, {"x", x}}), "duplicate tensor name 'x'", path);
  EXPECT_ERROR_CONTAINS(save_safetensors(path, {{"x", x}, {"y", Tensor()}}), "'y'", "undefined", path);
  EXPECT_ERROR_CONTAINS(save_safetensors(path, {{"__metadata__", x}}), "reserved");
  EXPECT_TRUE(dir.entries().empty());
  std::string nowhere = dir.file("no/such/dir/m.safetensors");
  EXPECT_ERROR_CONTAINS(save_safetensors(nowhere, {{"x", x}}), nowhere);
}

TEST(Safetensors, TruncatedAndCorruptFilesNameTheFile) {
  TempDir dir;
  std::string path = dir.file("m.safetensors");
  EXPECT_ERROR_CONTAINS(load_safetensors(path), "cannot open", path);

  std::mt19937 rng(5);
  save_safetensors(path,
                   {{"a", random_tensor({4}, DType::F32, "a", rng)}, {"b", random_tensor({4}, DType::I32, "b", rng)}});
  std::string good = read_bytes(path);

  write_bytes(path, good.substr(0, 5));
  EXPECT_ERROR_CONTAINS(load_safetensors(path), path, "truncated");
  write_bytes(path, good.substr(0, 40));
  EXPECT_ERROR_CONTAINS(load_safetensors(path), path, "header length", "past the end");
  write_bytes(path, good.substr(0, good.size() - 3));
  EXPECT_ERROR_CONTAINS(load_safetensors(path), path, "tensor 'b'", "out of range");
  std::string corrupt = good;
  corrupt[9] = '[';  // the JSON header's first key loses its opening quote
  write_bytes(path, corrupt);
  EXPECT_ERROR_CONTAINS(load_safetensors(path), path, "invalid JSON");
  write_bytes(path, good + "junk");
  EXPECT_ERROR_CONTAINS(load_safetensors(path), path, "trailing bytes");
}

TEST(Safetensors, InconsistentHeadersAreRejected) {
  TempDir dir;
  std::string path = dir.file("m.safetensors");
  std::string data(32, '\0');
  write_raw(path,
            R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
            R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
            data.substr(0, 24));
  EXPECT_ERROR_CONTAINS(load_safetensors(path), path, "tensor 'b'", "overlap tensor 'a'");
  write_raw(path, R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", data.substr(0, 16));
  EXPECT_ERROR_CONTAINS(load_safetensors(path), path, "tensor 'a'", "needs 12");
  write_raw(path, R"({"a":{"dtype":"C64","shape":[4],"data_offsets":[0,4]}})", data.substr(0, 4));
  EXPECT_ERROR_CONTAINS(load_safetensors(path), path, "tensor 'a'", "unsupported dtype 'C64'");
  write_raw(path, R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})", data.substr(0, 8));
  EXPECT_ERROR_CONTAINS(load_safetensors(path), path, "tensor 'a'", "gap");
  write_raw(path, R"({"a":{"dtype":"U8","shape":[-4],"data_offsets":[0,4]}})", data.substr(0, 4));
  EXPECT_ERROR_CONTAINS(load_safetensors(path), path, "tensor 'a'", "shape");
  write_raw(path, R"({"__metadata__":{"step":12}})", "");
  EXPECT_ERROR_CONTAINS(load_safetensors(path), path, "'step'", "not a string");
  write_raw(path, R"([1, 2])", "");
  EXPECT_ERROR_CONTAINS(load_safetensors(path), path, "not a JSON object");
}
