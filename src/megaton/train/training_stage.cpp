#include "megaton/train/training_stage.h"

#include <algorithm>
#include <chrono>

#include "megaton/core/checked.h"

namespace megaton::train {

TrainingStage::TrainingStage(models::TransformerModel& model, std::function<void(data::Batch&)> next_batch,
                             int64_t microbatches, bool defer_head_weight_grad, int64_t data_parallel_size,
                             PipelinePlace place, float loss_scale)
    : model_(model),
      next_batch_(std::move(next_batch)),
      microbatches_(microbatches),
      grad_scale_(loss_scale / static_cast<float>(microbatches * data_parallel_size)),
      defer_head_weight_grad_(defer_head_weight_grad),
      group_(place.group) {
  MEGATON_CHECK(microbatches > 0, "a training step needs at least one micro-batch, got ", microbatches);
  MEGATON_CHECK(data_parallel_size > 0, "data-parallel size ", data_parallel_size);
  model_.set_moe_aux_loss_grad_scale(grad_scale_);
  const int chunks = static_cast<int>(model_.num_chunks());
  if (!place.schedule) {
    MEGATON_CHECK(!group_ || group_->size() == 1, "a pipeline group of ", group_->size(), " stages needs a schedule");
    for (int c = 0; c < chunks; ++c) local_.push_back(c);
    holder_.assign(1, std::vector<int>(static_cast<size_t>(chunks), 0));
    first_forwards_.assign(1, 0);
    return;
  }
  const pipeline::Schedule& s = *place.schedule;
  schedule_ = &s;
  stage_ = group_ ? group_->rank() : 0;
  if ((group_ ? group_->size() : 1) != s.stages)
    fail("pipeline schedule '", s.name, "' has ", s.stages, " stages but the pipeline group has ",
         group_ ? group_->size() : 1, " ranks");
  if (s.model_chunks() != chunks)
    fail("pipeline schedule '", s.name, "' runs ", s.model_chunks(), " model chunks but the model is split into ",
         chunks);
  holder_.assign(static_cast<size_t>(s.copies), std::vector<int>(static_cast<size_t>(chunks), -1));
  for (int r = 0; r < s.stages; ++r)
    for (int c = 0; c < s.chunks_per_stage; ++c)
      holder_.at(static_cast<size_t>(s.copy_of(r, c))).at(static_cast<size_t>(s.model_chunk_of(r, c))) = r;
  for (int c = 0; c < s.chunks_per_stage; ++c) local_.push_back(s.model_chunk_of(stage_, c));
  // Each copy's micro-batches enter its first model chunk in order, from its first one.
  for (int copy = 0; copy < s.copies; ++copy) first_forwards_.push_back(copy * (microbatches / s.copies));
  const models::StageLayout& layout = model_.stage_layout();
  for (int copy = 0; copy < s.copies && layout.split(); ++copy) {
    const std::vector<int>& placed = copy == 0 ? layout.chunk_rank : layout.chunk_copy_rank;
    for (int mc = 0; mc < chunks; ++mc) {
      const int want = holder_[static_cast<size_t>(copy)][static_cast<size_t>(mc)];
      const int got = placed.empty() ? -1 : placed.at(static_cast<size_t>(mc));
      if (got != want)
        fail("pipeline schedule '", s.name, "' runs copy ", copy, " of model chunk ", mc, " on stage ", want,
             " but the model placed it on pipeline rank ", got);
    }
  }
}

int TrainingStage::copy_of(int64_t microbatch) const { return schedule_ ? schedule_->copy_of_microbatch(microbatch) : 0; }

int TrainingStage::stage_of(int64_t microbatch, int model_chunk) const {
  return holder_.at(static_cast<size_t>(copy_of(microbatch))).at(static_cast<size_t>(model_chunk));
}

int TrainingStage::model_chunks() const { return static_cast<int>(holder_.front().size()); }

int TrainingStage::model_chunk(int chunk, const char* op) const {
  if (chunk < 0 || chunk >= static_cast<int>(local_.size()))
    fail("schedule runs ", op, " of chunk ", chunk, " of a model with ", local_.size(), " chunks on this stage");
  return local_[static_cast<size_t>(chunk)];
}

TrainingStage::InFlight& TrainingStage::in_flight(int64_t microbatch, const char* op) {
  auto it = in_flight_.find(microbatch);
  if (it == in_flight_.end()) fail("schedule runs ", op, " of micro-batch ", microbatch, " before its forward");
  return it->second;
}

const data::Batch& TrainingStage::batch(int64_t microbatch) {
  MEGATON_CHECK(microbatch >= 0 && microbatch < microbatches_, "schedule names micro-batch ", microbatch, " of ",
                microbatches_);
  // The source hands batches out in order: read up to this one, keeping the others for their F.
  while (batches_read_ <= microbatch) next_batch_(batches_[batches_read_++]);
  auto it = batches_.find(microbatch);
  MEGATON_CHECK(it != batches_.end(), "the batch of micro-batch ", microbatch, " was already used");
  return it->second;
}

int TrainingStage::tag(bool forward, int64_t microbatch, int mc) const {
  // Distinct per (direction, micro-batch, model chunk) within a window of micro-batches that fits
  // MPI's smallest guaranteed tag bound (32767). Micro-batches a window apart share a tag; MPI
  // matches messages of one tag in the order they were posted, and each direction of a chunk
  // boundary carries its micro-batches in order, so sharing is safe.
  const int64_t per_microbatch = 2 * static_cast<int64_t>(model_chunks());
  const int64_t window = std::max<int64_t>(1, 32768 / per_microbatch);
  return static_cast<int>(((microbatch % window) * per_microbatch + 2 * mc + (forward ? 0 : 1)) % 32768);
}

Shape TrainingStage::boundary_shape(int64_t microbatch) {
  // Activations and their gradients: [B*T rows (this rank's share under sequence parallelism),
  // hidden] in the compute dtype, the shape every chunk boundary carries.
  auto it = in_flight_.find(microbatch);
  const data::Batch* b = it == in_flight_.end() ? &batch(microbatch) : nullptr;
  const int64_t tokens = b ? checked_mul("pipeline activation rows", b->micro_batch_size, b->seq_length)
                           : it->second.B * it->second.T;
  const nn::TensorParallel& tp = model_.tensor_parallel();
  return {tp.splits_sequence() ? tokens / tp.size() : tokens, model_.config().hidden_size};
}

void TrainingStage::post_recv(bool forward, int64_t microbatch, int mc) {
  const RecvKey key{forward, microbatch, mc};
  if (recvs_.count(key)) return;
  Pending p;
  p.buffer = Tensor::empty(boundary_shape(microbatch), model_.compute_dtype(), MemCategory::Activations,
                           forward ? "pipeline.recv_activation" : "pipeline.recv_grad");
  const int peer = stage_of(microbatch, forward ? mc - 1 : mc + 1);
  p.work = group_->recv_async(p.buffer, peer, tag(forward, microbatch, mc));
  recvs_.emplace(key, std::move(p));
}

Tensor TrainingStage::take_recv(bool forward, int64_t microbatch, int mc) {
  post_recv(forward, microbatch, mc);  // not announced ahead: posted now
  auto it = recvs_.find({forward, microbatch, mc});
  const auto t0 = std::chrono::steady_clock::now();
  it->second.work->wait();
  input_wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Tensor t = std::move(it->second.buffer);
  recvs_.erase(it);
  return t;
}

void TrainingStage::send(const Tensor& t, bool forward, int64_t microbatch, int mc) {
  // Forward: mc's output to mc + 1's F; backward: mc's input gradient to mc - 1's B. The receiver
  // posted its buffer from the shape every boundary has: a tensor of another shape is a bug here.
  const int to = forward ? mc + 1 : mc - 1;
  const Shape want = boundary_shape(microbatch);
  MEGATON_CHECK(t.shape() == want && t.dtype() == model_.compute_dtype(), "pipeline send of model chunk ", mc,
                (forward ? "'s output" : "'s input gradient"), ": expected ", shape_str(want), " ",
                dtype_name(model_.compute_dtype()), ", got ", shape_str(t.shape()), " ", dtype_name(t.dtype()));
  // Keyed like the receiver's buffer: by the model chunk whose F (B) takes it.
  sends_.push_back({t, group_->send_async(t, stage_of(microbatch, to), tag(forward, microbatch, to))});
}

void TrainingStage::forward(int64_t microbatch, int chunk) {
  const int mc = model_chunk(chunk, "the forward");
  if (mc == 0) {
    // Micro-batches enter the model in order (every schedule runs them so; each copy its own).
    int64_t& next = first_forwards_.at(static_cast<size_t>(copy_of(microbatch)));
    MEGATON_CHECK(microbatch == next, "schedule runs the forward of micro-batch ", microbatch, " but micro-batch ",
                  next, " is next");
    ++next;
  }
  if (!in_flight_.count(microbatch)) {
    const data::Batch& b = batch(microbatch);
    InFlight& mb = in_flight_[microbatch];
    mb.B = b.micro_batch_size;
    mb.T = b.seq_length;
    mb.targets = Tensor::empty({mb.B, mb.T}, DType::I32, MemCategory::Activations, "targets");
    std::copy(b.targets.begin(), b.targets.end(), mb.targets.data<int32_t>());
    if (stage_of(microbatch, 0) == stage_) {
      Tensor tokens = Tensor::empty({mb.B, mb.T}, DType::I32, MemCategory::Activations, "inputs");
      std::copy(b.inputs.begin(), b.inputs.end(), tokens.data<int32_t>());
      mb.inputs[0] = tokens;
    }
    mb.ctx.chunks.resize(model_.num_chunks());
    batches_.erase(microbatch);
  }
  InFlight& mb = in_flight_.at(microbatch);
  Tensor input;
  if (mc > 0 && remote(microbatch, mc - 1)) {
    input = take_recv(true, microbatch, mc);
  } else {
    auto in = mb.inputs.find(mc);
    if (in == mb.inputs.end())
      fail("schedule runs the forward of model chunk ", mc, " of micro-batch ", microbatch, " before its forward of ",
           "model chunk ", mc - 1, " (its input), or twice");
    input = std::move(in->second);
    mb.inputs.erase(in);
  }
  const auto c = static_cast<size_t>(mc);
  Tensor out = model_.chunk(c).forward(mb.ctx.chunks[c], input, mb.B, mb.T);
  if (mc + 1 < model_chunks()) {
    if (remote(microbatch, mc + 1)) send(out, true, microbatch, mc);
    else mb.inputs[mc + 1] = out;
    return;
  }
  loss_sum_ += model_.loss(mb.ctx, out, mb.targets, true, grad_scale_, defer_head_weight_grad_).loss /
               static_cast<double>(microbatches_);
}

Tensor TrainingStage::output_grad(InFlight& mb, int64_t microbatch, int mc) {
  if (mc + 1 == model_chunks()) return {};
  if (remote(microbatch, mc + 1)) return take_recv(false, microbatch, mc);
  auto it = mb.output_grads.find(mc);
  if (it == mb.output_grads.end())
    fail("schedule runs the backward of model chunk ", mc, " of micro-batch ", microbatch,
         " before the forward of every chunk and the backward of every later chunk");
  Tensor d = std::move(it->second);
  mb.output_grads.erase(it);
  return d;
}

void TrainingStage::pass_input_grad(InFlight& mb, int64_t microbatch, int mc, Tensor d) {
  if (mc == 0) return;  // the token ids have no gradient
  if (remote(microbatch, mc - 1)) send(d, false, microbatch, mc);
  else mb.output_grads[mc - 1] = std::move(d);
}

void TrainingStage::chunk_weight_grads_done(int64_t microbatch, InFlight& mb) {
  // A micro-batch passes the chunks of its own copy on this stage.
  const int copies = schedule_ ? schedule_->copies : 1;
  if (++mb.weight_grads < static_cast<int>(local_.size()) / copies) return;
  in_flight_.erase(microbatch);
  ++finished_;
}

void TrainingStage::backward_input(int64_t microbatch, int chunk) {
  const int mc = model_chunk(chunk, "B");
  InFlight& mb = in_flight(microbatch, "B");
  const auto c = static_cast<size_t>(mc);
  Tensor d = model_.chunk(c).backward_input(mb.ctx.chunks[c], output_grad(mb, microbatch, mc));
  pass_input_grad(mb, microbatch, mc, std::move(d));
}

void TrainingStage::backward_weight(int64_t microbatch, int chunk) {
  const int mc = model_chunk(chunk, "W");
  InFlight& mb = in_flight(microbatch, "W");
  model_.chunk(static_cast<size_t>(mc)).backward_weight(mb.ctx.chunks[static_cast<size_t>(mc)]);
  chunk_weight_grads_done(microbatch, mb);
}

void TrainingStage::backward(int64_t microbatch, int chunk) {
  const int mc = model_chunk(chunk, "B");
  InFlight& mb = in_flight(microbatch, "B");
  const auto c = static_cast<size_t>(mc);
  Tensor d = model_.chunk(c).backward(mb.ctx.chunks[c], output_grad(mb, microbatch, mc));
  pass_input_grad(mb, microbatch, mc, std::move(d));
  chunk_weight_grads_done(microbatch, mb);
}

void TrainingStage::prepare(const pipeline::Op& next) {
  if (!group_ || group_->size() == 1) return;
  for (const pipeline::Op& part : pipeline::compute_parts(next)) {
    const int mc = model_chunk(part.chunk, "an op");
    if (part.kind == pipeline::OpKind::Forward && mc > 0 && remote(part.microbatch, mc - 1))
      post_recv(true, part.microbatch, mc);
    if (part.kind == pipeline::OpKind::BackwardInput && mc + 1 < model_chunks() && remote(part.microbatch, mc + 1))
      post_recv(false, part.microbatch, mc);
  }
}

void TrainingStage::communicate(const pipeline::Op& op) {
  if (op.kind != pipeline::OpKind::SendBackward)
    fail("schedule op ", pipeline::op_name(op), ": the trainer's stages move activations and gradients inside F and "
         "B, not as separate ops");
  const int mc = model_chunk(op.chunk, "sendB");
  if (mc == 0 || !remote(op.microbatch, mc - 1))
    fail("schedule op ", pipeline::op_name(op), " but the input gradient of model chunk ", mc, " does not leave stage ",
         stage_);
}

void TrainingStage::finish() {
  for (Pending& s : sends_) s.work->wait();
  sends_.clear();
  if (!recvs_.empty()) {
    const auto& [forward, microbatch, mc] = recvs_.begin()->first;
    fail("pipeline stage ", stage_, " posted a receive of the ", forward ? "input" : "output gradient",
         " of model chunk ", mc, " for micro-batch ", microbatch, " that no op used");
  }
}

double TrainingStage::mean_loss() const {
  MEGATON_CHECK(finished_ == microbatches_ && in_flight_.empty(), "the schedule finished ", finished_, " of ",
                microbatches_, " micro-batches on this stage (F, B and W of each of its ", local_.size(), " chunks)");
  return loss_sum_;
}

}  // namespace megaton::train
