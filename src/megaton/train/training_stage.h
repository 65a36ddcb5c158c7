// The trainer's pipeline::StageRunner for one step: the forward of micro-batch m trains on the
// m-th batch the source hands out this step, one activation context per micro-batch stays alive
// from its first F to its last W on this stage, and the losses are summed in forward order. Ops
// name a chunk of this stage, which holds a model chunk (schedule.h: model_chunk_of): a model
// chunk's forward takes the previous model chunk's output, its B the next one's input gradient,
// and the last model chunk's forward ends with the loss. The schedule decides the order of F, B
// and W; this class only does the work of each op. With DualPipe's two parameter copies a
// micro-batch runs through its copy's model chunks only (schedule.h: copy_of_microbatch), whose
// stages mirror the other copy's.
//
// Under pipeline parallelism (a PipelinePlace with a group of more than one stage) a neighbouring model
// chunk may live on another rank of the pipeline group: the output of a forward (the input
// gradient of a B) then leaves by an asynchronous send as soon as it exists, and the input a F or
// B needs from another rank is received asynchronously. The executor announces each compute op
// before the one ahead of it runs (prepare), so a receive is posted one op early and waited on only
// when its op starts. Sends are waited on at finish(). Every rank reads every micro-batch's batch
// (all of them advance the loader the same way, so resume positions agree; only the ranks holding
// the first model chunk use the tokens and the last one the targets): a batch of token ids is tiny
// next to one chunk's forward.
#pragma once
#include <functional>
#include <map>
#include <tuple>
#include <vector>

#include "megaton/data/data_loader.h"
#include "megaton/models/transformer_model.h"
#include "megaton/parallel/communicator.h"
#include "megaton/pipeline/executor.h"

namespace megaton::train {

// A rank's place in the pipeline: the schedule and the pipeline group (one rank per stage; this
// rank's stage is its rank there). Default: a single stage holding every model chunk in order.
struct PipelinePlace {
  const pipeline::Schedule* schedule = nullptr;
  parallel::Communicator* group = nullptr;
};
// loss_scale (FP16's loss scaling) multiplies every gradient the stage's backward produces.

class TrainingStage : public pipeline::StageRunner {
 public:
  // next_batch fills the next batch of micro_batch_size x seq_length tokens (and throws, naming
  // the sample, where the data runs out). Each micro-batch's loss is scaled by
  // 1 / (microbatches x data_parallel_size), so the gradients accumulate to the mean over the global
  // batch (Megatron's convention) once the data-parallel ranks' gradients are summed.
  // defer_head_weight_grad: the schedule runs W apart from B, so the output head keeps its
  // dlogits for W instead of adding its weight gradient during the loss (N x vocab memory).
  // The model has every model chunk of the schedule (schedule.model_chunks() of them), holding
  // either all of them or, cut into stages, those the schedule places on this rank.
  TrainingStage(models::TransformerModel& model, std::function<void(data::Batch&)> next_batch, int64_t microbatches,
                bool defer_head_weight_grad = false, int64_t data_parallel_size = 1, PipelinePlace place = {},
                float loss_scale = 1.0f);

  void forward(int64_t microbatch, int chunk) override;
  void backward_input(int64_t microbatch, int chunk) override;
  void backward_weight(int64_t microbatch, int chunk) override;
  void backward(int64_t microbatch, int chunk) override;
  void prepare(const pipeline::Op& next) override;
  double input_wait_seconds() const override { return input_wait_s_; }
  // A SendBackward marks that the B before it already sent its gradient (it always does, the
  // moment it ends): checked. The other point-to-point ops are implicit in F and B.
  void communicate(const pipeline::Op& op) override;

  // Waits for the sends in flight and checks that every received tensor was used.
  void finish();
  // This stage's share of the step's loss: the mean over the micro-batches of each one's mean loss
  // on the stage holding the last model chunk, 0 on the others. Throws unless every micro-batch ran
  // F, B and W of every chunk of this stage (a schedule that left work undone).
  double mean_loss() const;

 private:
  // One micro-batch from its first F to its last W on this stage.
  struct InFlight {
    models::ModelCtx ctx;
    Tensor targets;
    int64_t B = 0, T = 0;
    std::map<int, Tensor> inputs;        // model chunk -> its input (token ids for chunk 0)
    std::map<int, Tensor> output_grads;  // model chunk -> the gradient at its output
    int weight_grads = 0;                // chunks of this stage through W
  };
  // A receive posted before its op: (forward?, micro-batch, model chunk) -> buffer and handle.
  using RecvKey = std::tuple<bool, int64_t, int>;
  struct Pending {
    Tensor buffer;
    parallel::WorkHandle work;
  };

  InFlight& in_flight(int64_t microbatch, const char* op);
  const data::Batch& batch(int64_t microbatch);  // reads batches up to it
  int model_chunk(int chunk, const char* op) const;
  int model_chunks() const;  // of one copy: a micro-batch's path
  int copy_of(int64_t microbatch) const;  // the parameter copy a micro-batch runs through (DualPipe)
  // The stage running model chunk `model_chunk` for `microbatch` (its copy's holder).
  int stage_of(int64_t microbatch, int model_chunk) const;
  bool remote(int64_t microbatch, int model_chunk) const { return stage_of(microbatch, model_chunk) != stage_; }
  Shape boundary_shape(int64_t microbatch);  // of the activations (gradients) between chunks
  // Posts the receive of the input of model chunk mc's F (forward) or of its output gradient (B).
  void post_recv(bool forward, int64_t microbatch, int mc);
  Tensor take_recv(bool forward, int64_t microbatch, int mc);
  void send(const Tensor& t, bool forward, int64_t microbatch, int mc);  // mc's output / input gradient
  int tag(bool forward, int64_t microbatch, int mc) const;
  // The gradient at model chunk mc's output (undefined for the last, which takes the loss op's).
  Tensor output_grad(InFlight& mb, int64_t microbatch, int mc);
  // Hands the input gradient of model chunk mc to model chunk mc - 1, here or on its stage.
  void pass_input_grad(InFlight& mb, int64_t microbatch, int mc, Tensor d);
  void chunk_weight_grads_done(int64_t microbatch, InFlight& mb);

  models::TransformerModel& model_;
  std::function<void(data::Batch&)> next_batch_;
  int64_t microbatches_;
  float grad_scale_;  // 1 / (microbatches x data-parallel size)
  bool defer_head_weight_grad_;
  parallel::Communicator* group_;  // null: one stage
  const pipeline::Schedule* schedule_ = nullptr;  // null: one stage running every chunk in order
  int stage_ = 0;
  std::vector<int> local_;                // chunk of this stage -> model chunk
  std::vector<std::vector<int>> holder_;  // copy -> model chunk -> stage
  std::vector<int64_t> first_forwards_;   // per copy: the next micro-batch to enter model chunk 0
  int64_t finished_ = 0;
  double loss_sum_ = 0;
  std::map<int64_t, data::Batch> batches_;  // read, not yet used by the micro-batch's first F
  int64_t batches_read_ = 0;
  std::map<int64_t, InFlight> in_flight_;
  std::map<RecvKey, Pending> recvs_;
  double input_wait_s_ = 0;  // blocked in take_recv
  std::vector<Pending> sends_;
};

}  // namespace megaton::train
