// Sharded checkpoints: pieces written by several "ranks" (here, writers in one process) merge into
// one metadata file, and any region of any tensor reads back from whichever files hold it,
// whatever the split it was saved with: the resharding a checkpoint needs when it is loaded at
// another tp / dp. Bad shards (a rank missing, a gap, overlapping pieces, another shape) are
// refused naming the tensor or file.
#include "megaton/ckpt/sharded_checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "../support/temp_dir.h"
#include "megaton/core/allocator.h"

using namespace megaton;
using megaton::testing::TempDir;

namespace {

// A [rows, cols] f32 tensor whose element (r, c) is r * 100 + c + base: every element tells where it
// came from.
Tensor grid(int64_t rows, int64_t cols, int64_t row0 = 0, int64_t col0 = 0, float base = 0) {
  Tensor t = Tensor::empty({rows, cols}, DType::F32);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t.data<float>()[r * cols + c] = static_cast<float>((r + row0) * 100 + c + col0) + base;
  return t;
}

void expect_grid(const Tensor& t, int64_t row0, int64_t col0, const std::string& what) {
  const int64_t rows = t.size(0), cols = t.size(1);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      ASSERT_EQ(t.data<float>()[r * cols + c], static_cast<float>((r + row0) * 100 + c + col0))
          << what << " at (" << r << ", " << c << ")";
}

}  // namespace

TEST(ShardedCheckpoint, PiecesOfAnySplitReadBackIntoAnyOther) {
  TempDir dir;
  const std::string d = dir.file("ckpt");
  std::filesystem::create_directories(d);
  // "w": [6, 10] split along dim 1 as 4 + 6 over two ranks; "e": [5, 3] along dim 0 as 3 + 2; "n": a
  // replicated [4] both ranks hold (written by both: kept once).
  const Shape w{6, 10}, e{5, 3};
  ckpt::ShardWriter r0, r1;
  r0.add("w", w, 1, 0, grid(6, 4));
  r1.add("w", w, 1, 4, grid(6, 6, 0, 4));
  r0.add("e", e, 0, 0, grid(3, 3));
  r1.add("e", e, 0, 3, grid(2, 3, 3, 0));
  const Tensor n = grid(1, 4).view({4});
  r0.add("n", {4}, 0, 0, n);
  r1.add("n", {4}, 0, 0, n);
  r1.write(d, 1);
  r0.write(d, 0);
  const auto digests = ckpt::merge_shard_indexes(d, 2, 5);
  ASSERT_EQ(digests.size(), 2u);
  EXPECT_EQ(digests[1].name, ckpt::shard_file_name(1));
  EXPECT_EQ(digests[1].bytes, std::filesystem::file_size(d + "/" + ckpt::shard_file_name(1)));
  const auto meta = nlohmann::json::parse(megaton::testing::read_bytes(d + "/metadata.json"));
  ASSERT_EQ(meta["tensors"]["n"]["pieces"].size(), 1u);
  EXPECT_EQ(meta["tensors"]["n"]["pieces"][0]["file"], ckpt::shard_file_name(0));  // the lowest rank's copy

  ckpt::ShardedReader reader(d);
  EXPECT_EQ(reader.names(), (std::vector<std::string>{"e", "n", "w"}));
  EXPECT_EQ(reader.global_shape("w"), w);
  expect_grid(reader.read_whole("w", MemCategory::Other), 0, 0, "w whole");
  expect_grid(reader.read_whole("e", MemCategory::Other), 0, 0, "e whole");
  // Another split of w: rows 2..5 (dim 0) cut across both files; columns 3..8 (dim 1) straddle them.
  Tensor rows = Tensor::empty({3, 10}, DType::F32);
  reader.read("w", 0, 2, rows);
  expect_grid(rows, 2, 0, "w rows 2..5");
  Tensor cols = Tensor::empty({6, 5}, DType::F32);
  reader.read("w", 1, 3, cols);
  expect_grid(cols, 0, 3, "w columns 3..8");
  Tensor e_cols = Tensor::empty({5, 2}, DType::F32);
  reader.read("e", 1, 1, e_cols);
  expect_grid(e_cols, 0, 1, "e columns 1..3");

  // Regions that do not exist, another dtype or tensor, are errors naming the tensor.
  Tensor too_far = Tensor::empty({3, 10}, DType::F32);
  EXPECT_ERROR_CONTAINS(reader.read("w", 0, 4, too_far), "'w'", "[6, 10]");
  Tensor wide = Tensor::empty({3, 11}, DType::F32);
  EXPECT_ERROR_CONTAINS(reader.read("w", 0, 0, wide), "'w'", "another shape");
  Tensor half = Tensor::empty({3, 10}, DType::BF16);
  EXPECT_ERROR_CONTAINS(reader.read("w", 0, 0, half), "'w'", "f32", "bf16");
  EXPECT_ERROR_CONTAINS(reader.read_whole("missing", MemCategory::Other), "no tensor 'missing'");
}

TEST(ShardedCheckpoint, MissingRanksGapsOverlapsAndOtherShapesAreRefused) {
  TempDir dir;
  const auto fresh = [&](const std::string& name) {
    const std::string d = dir.file(name);
    std::filesystem::create_directories(d);
    return d;
  };
  // Rank r writes piece (shape, start, data) of tensor "w" into a fresh directory.
  struct Piece {
    Shape shape;
    int64_t start;
    Tensor data;
  };
  const auto shards = [&](const std::string& name, const std::vector<Piece>& per_rank) {
    const std::string d = fresh(name);
    for (size_t r = 0; r < per_rank.size(); ++r) {
      ckpt::ShardWriter w;
      w.add("w", per_rank[r].shape, 0, per_rank[r].start, per_rank[r].data);
      w.write(d, static_cast<int>(r));
    }
    return d;
  };
  EXPECT_ERROR_CONTAINS(ckpt::merge_shard_indexes(shards("missing_rank", {{{2, 2}, 0, grid(2, 2)}}), 2, 0.05), "rank 1",
                        ckpt::shard_index_name(1));
  EXPECT_ERROR_CONTAINS(
      ckpt::merge_shard_indexes(shards("gap", {{{4, 2}, 0, grid(1, 2)}, {{4, 2}, 2, grid(2, 2, 2, 0)}}), 2, 5), "'w'",
      "a gap at 1");
  EXPECT_ERROR_CONTAINS(ckpt::merge_shard_indexes(shards("short", {{{4, 2}, 0, grid(3, 2)}}), 1, 5), "'w'", "up to 3");
  EXPECT_ERROR_CONTAINS(
      ckpt::merge_shard_indexes(shards("overlap", {{{4, 2}, 0, grid(3, 2)}, {{4, 2}, 2, grid(2, 2, 2, 0)}}), 2, 5),
      "'w'", "overlapping pieces");
  EXPECT_ERROR_CONTAINS(
      ckpt::merge_shard_indexes(shards("shapes", {{{4, 2}, 0, grid(2, 2)}, {{4, 3}, 2, grid(2, 3)}}), 2, 5),
      ckpt::shard_index_name(1), "'w'", "[4,3]", "[4,2]");
  // A piece that is no piece of its tensor is refused when added.
  ckpt::ShardWriter w;
  EXPECT_ERROR_CONTAINS(w.add("w", {4, 2}, 0, 3, grid(2, 2)), "'w'", "no piece of");
  EXPECT_ERROR_CONTAINS(w.add("w", {4, 2}, 2, 0, grid(4, 2)), "'w'", "no piece of");
  // Metadata that names a file outside the checkpoint, or pieces that do not tile the tensor, is
  // refused before anything is read.
  const std::string d = shards("tampered", {{{4, 2}, 0, grid(4, 2)}});
  ckpt::merge_shard_indexes(d, 1, 5);
  auto meta = nlohmann::json::parse(megaton::testing::read_bytes(d + "/metadata.json"));
  const auto good = meta;
  meta["tensors"]["w"]["pieces"][0]["file"] = "../elsewhere.safetensors";
  megaton::testing::write_bytes(d + "/metadata.json", meta.dump());
  EXPECT_ERROR_CONTAINS(ckpt::ShardedReader{d}, "'w'", "not a file name inside");
  meta = good;
  meta["tensors"]["w"]["pieces"][0]["length"] = 3;
  megaton::testing::write_bytes(d + "/metadata.json", meta.dump());
  EXPECT_ERROR_CONTAINS(ckpt::ShardedReader{d}, "'w'", "cover 3 of 4");
  meta = good;
  meta["tensors"]["w"]["shape"] = {4, -2};
  megaton::testing::write_bytes(d + "/metadata.json", meta.dump());
  EXPECT_ERROR_CONTAINS(ckpt::ShardedReader{d}, "'w'", "extent below 1");
  // Floats where integers belong would convert to int with undefined behaviour (found by the manifest
  // fuzzer in its own file); each is an error naming the key.
  for (const auto& [key, where] :
       {std::pair{"dim", "split dim"}, {"start", "piece start"}, {"length", "piece length"}}) {
    meta = good;
    (std::string(key) == "dim" ? meta["tensors"]["w"][key] : meta["tensors"]["w"]["pieces"][0][key]) = 1e30;
    megaton::testing::write_bytes(d + "/metadata.json", meta.dump());
    EXPECT_ERROR_CONTAINS(ckpt::ShardedReader{d}, "'w'", where, "must be an integer");
  }
}

// A region is read from the pieces it overlaps alone: reading a small tensor from a shard that
// also holds a large one never holds the large one (planted: whole files loaded, caught).
TEST(ShardedCheckpoint, ReadingARegionLoadsOnlyThePiecesItOverlaps) {
  TempDir dir;
  const std::string d = dir.file("ckpt");
  std::filesystem::create_directories(d);
  ckpt::ShardWriter r0;
  const Tensor big = Tensor::zeros({1024, 1024}, DType::F32), small = grid(2, 3);
  r0.add("big", big.shape(), 0, 0, big);
  r0.add("small", small.shape(), 0, 0, small);
  r0.write(d, 0);
  ckpt::merge_shard_indexes(d, 1, 5);
  ckpt::ShardedReader reader(d);
  Allocator::host().reset_peaks();
  const size_t before = Allocator::host().stats().total_live;
  expect_grid(reader.read_whole("small", MemCategory::Other), 0, 0, "small");
  EXPECT_LT(Allocator::host().stats().total_peak - before, big.nbytes() / 100);
}
