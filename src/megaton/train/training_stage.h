// The trainer's pipeline::StageRunner for one step: the forward of micro-batch m trains on the
// m-th batch the source hands out this step, one activation context per micro-batch stays alive
// from its first F to its last W, and the losses are summed in forward order. Ops name a model
// chunk: a chunk's forward takes the previous chunk's output, its B the next chunk's input
// gradient, and the last chunk's forward ends with the loss. The schedule decides the order of F,
// B and W; this class only does the work of each op.
#pragma once
#include <functional>
#include <map>

#include "megaton/data/data_loader.h"
#include "megaton/models/transformer_model.h"
#include "megaton/pipeline/executor.h"

namespace megaton::train {

class TrainingStage : public pipeline::StageRunner {
 public:
  // next_batch fills the next batch of micro_batch_size x seq_length tokens (and throws, naming
  // the sample, where the data runs out). Each micro-batch's loss is scaled by
  // 1 / (microbatches x data_parallel_size), so the gradients accumulate to the mean over the global
  // batch (Megatron's convention) once the data-parallel ranks' gradients are summed.
  // defer_head_weight_grad: the schedule runs W apart from B, so the output head keeps its
  // dlogits for W instead of adding its weight gradient during the loss (N x vocab memory).
  TrainingStage(models::TransformerModel& model, std::function<void(data::Batch&)> next_batch, int64_t microbatches,
                bool defer_head_weight_grad = false, int64_t data_parallel_size = 1);

  void forward(int64_t microbatch, int chunk) override;
  void backward_input(int64_t microbatch, int chunk) override;
  void backward_weight(int64_t microbatch, int chunk) override;
  void backward(int64_t microbatch, int chunk) override;

  // Mean over this rank's micro-batches of each micro-batch's mean loss; throws unless every micro-batch ran
  // its forward and its W (a schedule that left work undone).
  double mean_loss() const;

 private:
  // One micro-batch from its first F to its last W.
  struct InFlight {
    models::ModelCtx ctx;
    Tensor targets;
    int64_t B = 0, T = 0;
    Tensor output;  // the next chunk's input: the token ids, then each forwarded chunk's output
    Tensor dinput;  // the last B's input gradient: the previous chunk's output gradient
    int forwarded = 0, backwarded = 0, weight_grads = 0;  // chunks through F, B, W
  };
  InFlight& in_flight(int64_t microbatch, const char* op);
  Tensor chunk_backward_input(InFlight& mb, int chunk, bool with_weight_grads);
  void chunk_weight_grads_done(int64_t microbatch, InFlight& mb);
  int chunks() const { return static_cast<int>(model_.chunks().size()); }

  models::TransformerModel& model_;
  std::function<void(data::Batch&)> next_batch_;
  int64_t microbatches_;
  float grad_scale_;  // 1 / (microbatches x data-parallel size)
  bool defer_head_weight_grad_;
  int64_t forwards_ = 0, weight_grads_ = 0;
  double loss_sum_ = 0;
  std::map<int64_t, InFlight> in_flight_;
};

}  // namespace megaton::train
