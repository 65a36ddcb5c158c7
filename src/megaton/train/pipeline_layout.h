// The stage layout a training run builds its model with: the layers of each pipeline rank
// (train_config.h pipeline_stage_layers: even, or Megatron's uneven first / last stages) split
// evenly into the rank's model chunks, placed where cfg.pipeline_schedule runs them (in order,
// interleaved or V-shaped). Without pipeline parallelism: one chunk holding every layer.
#pragma once
#include "megaton/models/stage_layout.h"
#include "megaton/parallel/communicator.h"
#include "megaton/pipeline/schedule.h"
#include "megaton/train/train_config.h"

namespace megaton::train {

// pipeline: this rank's pipeline group (size cfg.pipeline_model_parallel_size).
models::StageLayout pipeline_layout(const TrainConfig& cfg, parallel::Communicator& pipeline);
// The same placement without a group (what the planner needs): pipeline_model_parallel_size ranks.
models::StageLayout pipeline_layout(const TrainConfig& cfg);
// The placement of `schedule`, cfg's schedule already generated (the planner's, generated once).
models::StageLayout pipeline_layout(const TrainConfig& cfg, const pipeline::Schedule& schedule);

}  // namespace megaton::train
