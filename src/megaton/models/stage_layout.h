// Where a model's layers live under pipeline parallelism: the layers split into model chunks
// (contiguous, in layer order) and the pipeline rank holding each chunk (Megatron's stages; a
// schedule's model_chunk_of() decides the placement: in order, interleaved or V-shaped). A
// TransformerModel built with a layout constructs only the chunks its rank holds: their layers,
// the embedding with model chunk 0, the final norm and head with the last. Positions name where a
// parameter sits in layer order whatever the layout: -1 the embedding, 0 .. L-1 a layer, L the
// final norm and the head. DualPipe keeps two copies of every model chunk: chunk_copy_rank names
// the rank holding the second; chunk_rank's copy is the chunk's primary, the one whose weights
// checkpoints, exports and the grad norm read (the copies are kept equal by summing their
// gradients).
#pragma once
#include <cstdint>
#include <vector>

#include "megaton/parallel/communicator.h"

namespace megaton::models {

struct StageLayout {
  std::vector<int64_t> chunk_layers;        // layers of each model chunk, in layer order
  std::vector<int> chunk_rank;              // the pipeline rank holding each model chunk (its primary)
  std::vector<int> chunk_copy_rank;         // the rank holding its second copy; empty: one copy
  parallel::Communicator* group = nullptr;  // the pipeline group; null: this process holds every chunk

  // num_chunks chunks of equal size, every one held here; errors when they do not divide num_layers.
  static StageLayout whole(int64_t num_layers, int64_t num_chunks);

  int rank() const { return group ? group->rank() : 0; }
  // Whether some chunk lives on another rank (the model here is not whole).
  bool split() const;
  size_t num_chunks() const { return chunk_layers.size(); }
  bool holds(size_t chunk) const {
    return chunk_rank.at(chunk) == rank() || (!chunk_copy_rank.empty() && chunk_copy_rank.at(chunk) == rank());
  }
  // Whether this rank holds the primary of `chunk`.
  bool primary(size_t chunk) const { return chunk_rank.at(chunk) == rank(); }
  // The chunk holding position `position` (see above).
  size_t chunk_of(int64_t position) const;
  // The pipeline rank holding position `position` (its primary).
  int holder(int64_t position) const { return chunk_rank.at(chunk_of(position)); }
  // Throws unless the chunks hold num_layers layers in all, each at least one, every chunk (and
  // copy) is placed on a rank of the group and the group matches.
  void validate(int64_t num_layers) const;

 private:
  int64_t num_layers() const;
};

}  // namespace megaton::models
