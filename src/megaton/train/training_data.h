// The trainer's data: the training and validation sample sources the config asks for, checked
// against the model (files exist, token ids fit the vocabulary) before anything is written.
#pragma once
#include <memory>

#include "megaton/data/sample_source.h"
#include "megaton/models/transformer_config.h"
#include "megaton/train/train_config.h"

namespace megaton::train {

struct TrainingData {
  std::shared_ptr<const data::SampleSource> train;
  std::shared_ptr<const data::SampleSource> valid;  // null: no validation
  // The largest token id read while checking the datasets against the model (the first 2^22 tokens
  // of each), for checks against the tokenizer.
  int32_t max_token = 0;
};

// data.shuffle = true: Megatron's GPTDataset / BlendedDataset over data.data_path with data.split,
// sized for train_iters global batches plus one per allowed rewind (each skips a batch);
// data.shuffle = false: the one dataset's token stream in order. Validation: data.valid_data_path
// in stream order when set, else the split's validation part. Errors name the config key.
TrainingData build_training_data(const TrainConfig& cfg);

}  // namespace megaton::train
