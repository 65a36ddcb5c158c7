// A model's weights between parallel layouts. The same config built whole in one process, split
// over a group of tp ranks, or cut into pipeline stages holds the same global tensors under the
// same names (nn/tensor_shards.h, models/stage_layout.h), so weights move between layouts by
// gathering one side's pieces and slicing the other's. What loading an HF folder or a checkpoint
// into a split model, exporting one, and the layout-free training snapshots go through.
#pragma once
#include <memory>

#include "megaton/models/transformer_model.h"

namespace megaton::models {

// The global tensor behind `local`, from's piece of a parameter p (its value, or a tensor of its
// local shape such as an optimizer moment): gathered over from's tensor-parallel group, and when
// from is cut into pipeline stages broadcast from the stage holding `position` (collective over
// the pipeline group; the other stages pass p null, local undefined). global_shape: p's.
Tensor gather_stage_tensor(const TransformerModel& from, int64_t position, const nn::Parameter* p, const Tensor& local,
                           const Shape& global_shape, const std::string& name);
// to's weights = from's, matched by name (models of the same config; either may be split over
// tensor parallelism, at most one cut into pipeline stages; collective over from's groups when
// from is split). Throws naming a parameter of to that a whole-model from does not hold.
void copy_weights(const TransformerModel& from, TransformerModel& to);
// The whole model (no tensor or pipeline parallelism) holding m's weights, in m's compute dtype:
// collective over m's groups.
std::unique_ptr<TransformerModel> gather_whole_model(const TransformerModel& m);

}  // namespace megaton::models
