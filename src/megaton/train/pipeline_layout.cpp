#include "megaton/train/pipeline_layout.h"

#include "megaton/pipeline/generators.h"

namespace megaton::train {

models::StageLayout pipeline_layout(const TrainConfig& cfg, parallel::Communicator& pipeline) {
  if (cfg.pipeline_model_parallel_size == 1) return pipeline_layout(cfg);
  if (pipeline.size() != cfg.pipeline_model_parallel_size)
    fail("pipeline group '", pipeline.name(), "' has ", pipeline.size(),
         " ranks but the config sets pipeline_model_parallel_size ", cfg.pipeline_model_parallel_size);
  models::StageLayout layout = pipeline_layout(cfg);
  layout.group = &pipeline;
  return layout;
}

models::StageLayout pipeline_layout(const TrainConfig& cfg) {
  if (cfg.pipeline_model_parallel_size == 1) return pipeline_layout(cfg, pipeline::no_pipelining(1));
  // The placement does not depend on the micro-batches: the fewest every kind takes (2p: interleaved
  // wants a multiple of p, the DualPipes at least 2p) keep the op lists short.
  const int stages = static_cast<int>(cfg.pipeline_model_parallel_size);
  return pipeline_layout(cfg, pipeline::generate(cfg.pipeline_schedule, stages,
                                                 static_cast<int>(pipeline_chunks_per_rank(cfg)), 2 * stages));
}

models::StageLayout pipeline_layout(const TrainConfig& cfg, const pipeline::Schedule& s) {
  const std::vector<int64_t> stage_layers = pipeline_stage_layers(cfg);
  if (cfg.pipeline_model_parallel_size == 1) return models::StageLayout::whole(cfg.model.num_layers, 1);
  // The schedule's placement of model chunks (its op lists are the step's business).
  const int per_rank = static_cast<int>(pipeline_chunks_per_rank(cfg));
  models::StageLayout layout;
  layout.chunk_layers.assign(static_cast<size_t>(s.model_chunks()), 0);
  layout.chunk_rank.assign(static_cast<size_t>(s.model_chunks()), -1);
  if (s.copies > 1) layout.chunk_copy_rank.assign(static_cast<size_t>(s.model_chunks()), -1);
  // A rank's stage layers split over the chunks of one copy it holds (DualPipe: one per copy).
  const int per_copy = per_rank / s.copies;
  for (int r = 0; r < s.stages; ++r)
    for (int c = 0; c < s.chunks_per_stage; ++c) {
      const auto mc = static_cast<size_t>(s.model_chunk_of(r, c));
      if (s.copy_of(r, c) > 0) {
        layout.chunk_copy_rank.at(mc) = r;
        continue;
      }
      layout.chunk_rank.at(mc) = r;
      layout.chunk_layers.at(mc) = stage_layers.at(static_cast<size_t>(r)) / per_copy;
    }
  return layout;
}

}  // namespace megaton::train
