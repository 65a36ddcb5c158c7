// A checkpoint written by every rank at once, each its own shards, and read back into any layout
// (the idea of Megatron's dist_checkpointing and PyTorch's DCP, in safetensors files).
//
// Every saved tensor has a global, layout-free shape. A rank contributes pieces of it: the global
// tensor restricted to [start, start + length) along one dim (whole along the others), as a tensor
// split over tensor parallelism is (ShardSpec: columns of a row-parallel weight, rows of a column-
// parallel one, a share of each of SwiGLU's [gate | up]). Rank r writes DIR/shard_RRRRR.safetensors
// with its pieces and then DIR/shard_RRRRR.json, its index (the pieces, the file's size and XXH3),
// whose presence says the rank is done. Rank 0 waits for every index and merges them into
// DIR/metadata.json: each tensor's global shape, dtype, split dim and its pieces, sorted, with
// copies of the same piece from several ranks kept once (the lowest rank's) and pieces that
// overlap otherwise refused. A reader then assembles any region of any tensor from whichever files
// hold it, so a checkpoint saved at tp2 x dp2 loads at tp1 x dp4 without a conversion step.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "megaton/ckpt/manifest.h"
#include "megaton/ckpt/safetensors.h"
#include "megaton/core/tensor.h"

namespace megaton::ckpt {

inline constexpr const char* kShardMetadataName = "metadata.json";

std::string shard_file_name(int rank);   // "shard_00003.safetensors"
std::string shard_index_name(int rank);  // "shard_00003.json"

// The pieces one rank writes.
class ShardWriter {
 public:
  // Adds `data` as the piece [start, start + data.size(dim)) along `dim` of the tensor `name` of
  // global shape `global_shape`; data has the global shape elsewhere. The tensor is referenced,
  // not copied: it must hold its values until write() returns.
  void add(const std::string& name, const Shape& global_shape, int dim, int64_t start, const Tensor& data);
  // DIR/shard_file_name(rank), then DIR/shard_index_name(rank) (both atomic). Rerunnable.
  void write(const std::string& dir, int rank) const;

 private:
  struct Piece {
    std::string name;
    Shape global_shape;
    int dim;
    int64_t start;
    Tensor data;
  };
  std::vector<Piece> pieces_;
};

// Rank 0, after its own write(): waits (up to timeout_s) for the indexes of ranks 0 .. world_size-1
// in DIR, writes DIR/metadata.json from them and returns the digests they recorded of their shard
// files (so the manifest need not read them again). Errors name the index or tensor at fault.
std::vector<FileDigest> merge_shard_indexes(const std::string& dir, int world_size, double timeout_s);

// Reads regions of the tensors of a sharded checkpoint directory: each shard file it needs is opened
// once, and only the pieces a region overlaps are read from it, one at a time (a rank loading its
// shards of a large model never holds a whole file).
class ShardedReader {
 public:
  explicit ShardedReader(std::string dir);  // reads DIR/metadata.json; errors name it
  ~ShardedReader();

  const std::string& dir() const { return dir_; }
  bool has(const std::string& name) const;
  const Shape& global_shape(const std::string& name) const;  // errors name a missing tensor
  std::vector<std::string> names() const;                    // every tensor, sorted
  // dst = the global region [start, start + dst.size(dim)) along `dim` of tensor `name` (dst has its
  // global shape elsewhere and its dtype). Errors name the tensor when it is absent, of another
  // shape or dtype, or when its files do not cover the region.
  void read(const std::string& name, int dim, int64_t start, const Tensor& dst);
  // The whole tensor, in its saved dtype.
  Tensor read_whole(const std::string& name, MemCategory cat);

 private:
  struct Piece {
    std::string file, key;
    int64_t start, length;
  };
  struct Entry {
    Shape shape;
    DType dtype;
    int dim;
    std::vector<Piece> pieces;
  };
  const Entry& entry(const std::string& name) const;
  Tensor piece_data(const std::string& name, const Piece& piece);

  std::string dir_;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::unique_ptr<SafetensorsReader>> files_;  // opened shard files
};

}  // namespace megaton::ckpt
