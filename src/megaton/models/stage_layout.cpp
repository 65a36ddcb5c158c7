#include "megaton/models/stage_layout.h"

#include <algorithm>

#include "megaton/core/checked.h"
#include "megaton/core/error.h"

namespace megaton::models {

StageLayout StageLayout::whole(int64_t num_layers, int64_t num_chunks) {
  if (num_chunks < 1 || num_layers < 1 || num_layers % num_chunks != 0)
    fail("cannot split ", num_layers, " layers evenly into ", num_chunks, " model chunks");
  StageLayout l;
  l.chunk_layers.assign(static_cast<size_t>(num_chunks), num_layers / num_chunks);
  l.chunk_rank.assign(static_cast<size_t>(num_chunks), 0);
  return l;
}

bool StageLayout::split() const {
  for (size_t c = 0; c < chunk_rank.size(); ++c)
    if (!holds(c)) return true;
  return false;
}

int64_t StageLayout::num_layers() const {
  int64_t n = 0;
  for (int64_t c : chunk_layers) n = checked_add("layers of the model chunks", n, c);
  return n;
}

size_t StageLayout::chunk_of(int64_t position) const {
  const int64_t L = num_layers();
  MEGATON_CHECK(position >= -1 && position <= L, "position ", position, " in a model of ", L, " layers");
  if (position < 0) return 0;
  if (position == L) return chunk_layers.size() - 1;
  int64_t end = 0;
  for (size_t c = 0; c < chunk_layers.size(); ++c)
    if (position < (end += chunk_layers[c])) return c;
  fail("layer ", position, " in no model chunk");  // unreachable: position < L
}

void StageLayout::validate(int64_t num_layers) const {
  MEGATON_CHECK(!chunk_layers.empty() && chunk_layers.size() == chunk_rank.size(), "a stage layout of ",
                chunk_layers.size(), " model chunks placed on ", chunk_rank.size(), " ranks");
  for (size_t c = 0; c < chunk_layers.size(); ++c)
    if (chunk_layers[c] < 1) fail("model chunk ", c, " holds ", chunk_layers[c], " layers; every chunk needs at least one");
  if (this->num_layers() != num_layers)
    fail("the model chunks hold ", this->num_layers(), " layers but the model has ", num_layers);
  const int ranks = group ? group->size() : 1;
  for (size_t c = 0; c < chunk_rank.size(); ++c)
    if (chunk_rank[c] < 0 || chunk_rank[c] >= ranks)
      fail("model chunk ", c, " placed on pipeline rank ", chunk_rank[c], " of a group of ", ranks);
  if (chunk_copy_rank.empty()) return;
  MEGATON_CHECK(chunk_copy_rank.size() == chunk_rank.size(), "a stage layout of ", chunk_rank.size(),
                " model chunks with ", chunk_copy_rank.size(), " second copies");
  for (size_t c = 0; c < chunk_copy_rank.size(); ++c)
    if (chunk_copy_rank[c] < 0 || chunk_copy_rank[c] >= ranks || chunk_copy_rank[c] == chunk_rank[c])
      fail("the second copy of model chunk ", c, " placed on pipeline rank ", chunk_copy_rank[c], " of a group of ",
           ranks, " (its first is on rank ", chunk_rank[c], ")");
}

}  // namespace megaton::models
