#include "megaton/nn/tensor_parallel.h"

#include "megaton/core/error.h"

namespace megaton::nn {

std::vector<std::vector<ShardPiece>> even_pieces(const std::vector<int64_t>& blocks, int ranks, const std::string& what) {
  MEGATON_CHECK(ranks >= 1, "split of ", what, " over ", ranks, " ranks");
  std::vector<std::vector<ShardPiece>> out(static_cast<size_t>(ranks));
  int64_t start = 0;
  for (const int64_t block : blocks) {
    if (block % ranks != 0) fail(what, ": ", block, " is not divisible by tensor_model_parallel_size ", ranks);
    const int64_t part = block / ranks;
    for (int r = 0; r < ranks; ++r) out[static_cast<size_t>(r)].push_back({start + r * part, part});
    start += block;
  }
  return out;
}

ShardSpec split_spec(int dim, int64_t global_size, const TensorParallel& tp, std::vector<std::vector<ShardPiece>> pieces) {
  MEGATON_CHECK(static_cast<int>(pieces.size()) == tp.size(), "shard pieces for ", pieces.size(), " ranks, group of ",
                tp.size());
  return ShardSpec::tensor_parallel(dim, global_size, tp.rank(), std::move(pieces));
}

int64_t local_extent(const std::vector<ShardPiece>& pieces) {
  int64_t n = 0;
  for (const ShardPiece& p : pieces) n += p.length;
  return n;
}

}  // namespace megaton::nn
