// A model's weights between tensor-parallel layouts: the same config built whole in one process
// and split over a group of tp ranks hold the same global tensors (nn/tensor_shards.h), so weights
// move between them by gathering one side's shards and slicing the other's. What loading an HF
// folder or a checkpoint into a split model, and exporting one, go through.
#pragma once
#include <memory>

#include "megaton/models/transformer_model.h"

namespace megaton::models {

// to's weights = from's (models of the same config, either layout; collective over from's group
// when from is split). Throws naming a parameter the two do not share.
void copy_weights(const TransformerModel& from, TransformerModel& to);
// The whole model (no tensor parallelism) holding m's weights, in m's compute dtype: collective
// over m's group.
std::unique_ptr<TransformerModel> gather_whole_model(const TransformerModel& m);

}  // namespace megaton::models
