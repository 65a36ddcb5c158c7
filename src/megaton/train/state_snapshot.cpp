#include "megaton/train/state_snapshot.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "megaton/ckpt/sharded_checkpoint.h"
#include "megaton/core/atomic_file.h"
#include "megaton/core/regular_file.h"
#include "megaton/models/hf_format.h"
#include "megaton/nn/tensor_shards.h"

namespace megaton::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kStateFile = "state.json";
constexpr const char* kModelPrefix = "model/";
constexpr const char* kOptimizerPrefix = "optim/";
constexpr const char* kFp8Prefix = "fp8/";

// memcpy in 1 MiB chunks across threads: one thread does not saturate memory bandwidth, and
// this copy is what a save stalls the step for.
void copy_bytes(const Tensor& src, const Tensor& dst) {
  MEGATON_CHECK(src.nbytes() == dst.nbytes(), "snapshot of '", src.name(), "': size changed");
  constexpr int64_t kChunk = int64_t{1} << 20;
  const auto n = static_cast<int64_t>(src.nbytes());
  const auto* s = static_cast<const char*>(src.raw());
  auto* d = static_cast<char*>(dst.raw());
#pragma omp parallel for schedule(static) if (n > 4 * kChunk)
  for (int64_t c = 0; c < (n + kChunk - 1) / kChunk; ++c)
    std::memcpy(d + c * kChunk, s + c * kChunk, static_cast<size_t>(std::min(kChunk, n - c * kChunk)));
}

// The parameter whose moment `state_name` ("<param>.exp_avg" / ".exp_avg_sq") is.
const nn::Parameter& moment_param(const models::TransformerModel& model, const std::string& state_name) {
  for (const nn::Parameter* p : model.parameters())
    if (state_name.starts_with(p->name + ".")) return *p;
  fail("optimizer state '", state_name, "' belongs to no parameter of the model");
}

// One piece of a global tensor that a local tensor of p's layout holds: the global indices
// [start, start + view.size(dim)) along dim are `view`, a window of the local tensor.
struct LocalPiece {
  int dim;
  int64_t start;
  Tensor view;
  bool first_holder;  // no lower tensor-parallel rank holds the same piece
};

// The pieces of `local` (p's value, gradient or moment), padding left out. A split along dim 0
// gives windows of rows; along another dim a rank holds one whole piece (a row-parallel weight).
std::vector<LocalPiece> local_pieces(const nn::Parameter& p, const Tensor& local, int tp_rank) {
  if (nn::holds_global(p) || p.shard.replicated()) return {{0, 0, local, tp_rank == 0}};
  const int dim = p.shard.partition_dim;
  const auto& mine = p.shard.mine();
  MEGATON_CHECK(dim == 0 || (mine.size() == 1 && mine[0].start + mine[0].length <= p.shard.global_size),
                "'", p.name, "': a split along dim ", dim, " must be one unpadded piece per rank");
  const int64_t row = local.numel() / local.size(0);
  std::vector<LocalPiece> out;
  int64_t offset = 0;
  for (const nn::ShardPiece& piece : mine) {
    const int64_t real = std::min(piece.length, p.shard.global_size - piece.start);  // past it: padding
    bool first = true;
    for (int r = 0; r < p.shard.rank; ++r) {
      const auto& theirs = p.shard.pieces[static_cast<size_t>(r)];
      first = first && std::find(theirs.begin(), theirs.end(), piece) == theirs.end();
    }
    if (real > 0) {
      Shape shape = local.shape();
      shape[0] = real;
      out.push_back({dim, piece.start, dim == 0 ? local.window(offset * row, shape, local.name()) : local, first});
    }
    offset += piece.length;
  }
  return out;
}

// local = its pieces of the checkpoint tensor `name` (padding zero).
void read_local(ckpt::ShardedReader& reader, const std::string& name, const nn::Parameter& p, Tensor local,
                int tp_rank) {
  if (!nn::holds_global(p)) local.zero_();
  for (const LocalPiece& piece : local_pieces(p, local, tp_rank)) reader.read(name, piece.dim, piece.start, piece.view);
}

}  // namespace

StateSnapshot::StateSnapshot(const models::TransformerModel& model, const optim::Optimizer& optimizer)
    : model_(model), fp8_(model) {
  for (const nn::Parameter* p : model.parameters())
    values_.push_back(Tensor::empty(p->value.shape(), p->value.dtype(), MemCategory::Other, p->name));
  for (const optim::StateTensorSpec& spec : optimizer.state_specs()) {
    moments_.emplace_back(spec.name, Tensor::zeros(spec.shape, DType::F32, MemCategory::Optimizer, spec.name));
    moment_params_.push_back(&moment_param(model, spec.name));
  }
}

void StateSnapshot::capture(const models::TransformerModel& model, const optim::Optimizer& optimizer,
                            const TrainProgress& progress, const TrainConfig& cfg) {
  optimizer.wait_for_weights();
  const auto& params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) copy_bytes(params[i]->value, values_[i]);
  optimizer.save_state(moments_);
  optimizer_steps_ = optimizer.steps();
  fp8_.capture(model);
  progress_ = progress;
  state_ = state_to_json(progress, cfg, optimizer_steps_);
}

void StateSnapshot::restore(models::TransformerModel& model, optim::Optimizer& optimizer) const {
  optimizer.wait_for_weights();  // no gather in flight may overwrite what is restored
  const auto& params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) copy_bytes(values_[i], params[i]->value);
  optimizer.load_state({moments_.begin(), moments_.end()}, optimizer_steps_);
  fp8_.restore(model);
}

void StateSnapshot::write(const std::string& dir, int world_rank, WriterRole role) const {
  ckpt::ShardWriter shard;
  const int tp_rank = model_.tensor_parallel().rank();
  const auto& params = model_.parameters();
  // DualPipe's second copies are written by the primaries' ranks.
  std::set<const nn::Parameter*> copies;
  const models::StageLayout& layout = model_.stage_layout();
  for (size_t i = 0; i < params.size(); ++i)
    if (!layout.primary(layout.chunk_of(model_.position(i)))) copies.insert(params[i]);
  const auto add = [&](const std::string& name, const nn::Parameter& p, const Tensor& local) {
    if (!(p.shard.group == nn::ParallelGroup::Expert ? role.experts : role.dense) || copies.count(&p)) return;
    for (const LocalPiece& piece : local_pieces(p, local, tp_rank))
      if (piece.first_holder) shard.add(name, nn::global_shape(p), piece.dim, piece.start, piece.view);
  };
  for (size_t i = 0; i < params.size(); ++i) add(kModelPrefix + params[i]->name, *params[i], values_[i]);
  for (size_t j = 0; j < moments_.size(); ++j) add(kOptimizerPrefix + moments_[j].first, *moment_params_[j], moments_[j].second);
  if (role.dense && tp_rank == 0)
    for (const auto& [name, t] : fp8_.states()) shard.add(kFp8Prefix + name, t.shape(), 0, 0, t);
  shard.write(dir, world_rank);
  if (world_rank != 0) return;
  models::save_hf_config(model_.config(), dir);
  write_file_atomically((fs::path(dir) / kStateFile).string(), state_.dump(2) + "\n");
}

TrainProgress load_checkpoint(const std::string& dir, models::TransformerModel& model, optim::Optimizer& optimizer,
                              const TrainConfig& cfg) {
  if (!fs::exists(fs::path(dir) / ckpt::kShardMetadataName) && fs::exists(fs::path(dir) / "model.safetensors"))
    fail(dir, ": a checkpoint in the whole-model format of older builds (model.safetensors, no ", ckpt::kShardMetadataName,
         "); this build resumes sharded checkpoints only. To continue from its weights without its optimizer state, "
         "start a new run with model.load=",
         dir);
  const std::string state_file = (fs::path(dir) / kStateFile).string();
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(read_regular_file(state_file, "training state"));
  } catch (const nlohmann::json::exception& e) {
    fail(state_file, ": ", e.what());
  }
  int64_t optimizer_steps = 0;
  TrainProgress progress = state_from_json(state, cfg, state_file, &optimizer_steps);
  ckpt::ShardedReader reader(dir);
  const int tp_rank = model.tensor_parallel().rank();
  optimizer.wait_for_weights();  // no gather in flight may overwrite what is loaded
  for (const nn::Parameter* p : model.parameters()) read_local(reader, kModelPrefix + p->name, *p, p->value, tp_rank);
  std::map<std::string, Tensor> moments;
  for (const optim::StateTensorSpec& spec : optimizer.state_specs()) {
    const Tensor t = Tensor::empty(spec.shape, DType::F32, MemCategory::Workspace, spec.name);
    read_local(reader, kOptimizerPrefix + spec.name, moment_param(model, spec.name), t, tp_rank);
    moments.emplace(spec.name, t);
  }
  try {
    optimizer.load_state(moments, optimizer_steps);
  } catch (const Error& e) {
    fail(dir, ": optimizer state: ", e.what());
  }
  load_fp8_state(reader, kFp8Prefix, model);
  return progress;
}

std::unique_ptr<models::TransformerModel> load_checkpoint_model(const std::string& dir) {
  auto model = std::make_unique<models::TransformerModel>(models::load_hf_config(dir));
  ckpt::ShardedReader reader(dir);
  for (nn::Parameter* p : model->parameters()) reader.read(kModelPrefix + p->name, 0, 0, p->value);
  return model;
}

}  // namespace megaton::train
