#include "megaton/nn/tensor_shards.h"

#include <algorithm>
#include <cstring>

namespace megaton::nn {

namespace {

// An elementary run of global indices along the partition dim with the same holders: every rank
// whose pieces contain it, lowest first, with where the run starts in that rank's local tensor.
struct Run {
  int64_t start = 0, length = 0;
  std::vector<std::pair<int, int64_t>> holders;  // (rank, local index)
  const std::pair<int, int64_t>* held_by(int rank) const {
    for (const auto& h : holders)
      if (h.first == rank) return &h;
    return nullptr;
  }
};

std::vector<Run> runs_of(const ShardSpec& s) {
  std::vector<int64_t> cuts{s.global_size};
  for (const auto& rank_pieces : s.pieces)
    for (const ShardPiece& p : rank_pieces) cuts.insert(cuts.end(), {p.start, p.start + p.length});
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<Run> out;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    Run run{cuts[i], cuts[i + 1] - cuts[i], {}};
    for (size_t r = 0; r < s.pieces.size(); ++r) {
      int64_t local = 0;
      for (const ShardPiece& p : s.pieces[r]) {
        if (run.start >= p.start && run.start < p.start + p.length) {
          run.holders.emplace_back(static_cast<int>(r), local + run.start - p.start);
          break;
        }
        local += p.length;
      }
    }
    if (!run.holders.empty()) out.push_back(std::move(run));
  }
  return out;
}

// A tensor as [outer, extent, inner] around dimension `dim`.
struct Around {
  int64_t outer = 1, extent = 1, inner = 1;
  Around(const Shape& shape, int dim) {
    for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
      if (d < dim) outer *= shape[static_cast<size_t>(d)];
      if (d == dim) extent = shape[static_cast<size_t>(d)];
      if (d > dim) inner *= shape[static_cast<size_t>(d)];
    }
  }
};

// dst[:, d0 : d0 + n, :] = src[:, s0 : s0 + n, :] along `dim` (f32), or zeros when src is null.
void copy_along(int dim, const Tensor* src, int64_t s0, const Tensor& dst, int64_t d0, int64_t n) {
  const Around a(dst.shape(), dim);
  const int64_t bytes = n * a.inner * static_cast<int64_t>(sizeof(float));
  float* d = dst.data<float>();
  for (int64_t o = 0; o < a.outer; ++o) {
    float* to = d + (o * a.extent + d0) * a.inner;
    if (!src) {
      std::memset(to, 0, static_cast<size_t>(bytes));
      continue;
    }
    const Around b(src->shape(), dim);
    std::memcpy(to, src->data<float>() + (o * b.extent + s0) * b.inner, static_cast<size_t>(bytes));
  }
}

void check_local(const Parameter& p, const Tensor& local) {
  MEGATON_CHECK(local.shape() == p.value.shape() && local.dtype() == DType::F32 && local.device().is_cpu(), "'",
                local.name(), "' (", dtype_name(local.dtype()), " ", shape_str(local.shape()), ") is not a local f32 "
                "host tensor of parameter '", p.name, "' ", shape_str(p.value.shape()));
}

}  // namespace

Shape global_shape(const Parameter& p) {
  Shape s = p.value.shape();
  if (!p.shard.replicated()) s.at(static_cast<size_t>(p.shard.partition_dim)) = p.shard.global_size;
  return s;
}

bool holds_global(const Parameter& p) {
  if (p.shard.replicated()) return true;
  const auto& mine = p.shard.mine();
  return mine.size() == 1 && mine[0].start == 0 && mine[0].length == p.shard.global_size;
}

Tensor gather_global(const Parameter& p, const Tensor& local, const ShardGroups& groups) {
  check_local(p, local);
  if (holds_global(p)) return local;
  const ShardSpec& s = p.shard;
  const int size = groups.size_of(s);
  MEGATON_CHECK(static_cast<int>(s.pieces.size()) == size, "parameter '", p.name, "' is split over ",
                s.pieces.size(), " ranks, its group has ", size);
  Tensor all = local;  // every rank's local tensor, rank after rank
  if (size > 1) {
    all = Tensor::empty({size * local.numel()}, DType::F32, MemCategory::Workspace, p.name + ".gathered");
    groups.group_of(s)->all_gather(all, local.window(0, {local.numel()}, local.name()));
  }
  Tensor global = Tensor::empty(global_shape(p), DType::F32, MemCategory::Workspace, p.name);
  for (const Run& run : runs_of(s)) {
    if (run.start >= s.global_size) continue;  // padding
    const auto [rank, at] = run.holders.front();
    const Tensor from = all.window(rank * local.numel(), local.shape(), local.name());
    copy_along(s.partition_dim, &from, at, global, run.start, run.length);
  }
  return global;
}

void slice_global(const Parameter& p, const Tensor& global, const Tensor& local) {
  check_local(p, local);
  if (global.shape() != global_shape(p))
    fail("global tensor '", global.name(), "' of parameter '", p.name, "' has shape ", shape_str(global.shape()),
         ", expected ", shape_str(global_shape(p)));
  if (holds_global(p)) {
    Tensor dst = local;  // shares the storage
    if (global.raw() != local.raw()) dst.copy_from(global);
    return;
  }
  for (const Run& run : runs_of(p.shard)) {
    const auto* mine = run.held_by(p.shard.rank);
    if (!mine) continue;
    copy_along(p.shard.partition_dim, run.start < p.shard.global_size ? &global : nullptr, run.start, local,
               mine->second, run.length);
  }
}

std::vector<std::pair<int64_t, int64_t>> counted_elements(const Parameter& p, const TensorParallel& tp) {
  const ShardSpec& s = p.shard;
  const int64_t n = p.value.numel();
  if (s.replicated()) {
    if (tp.rank() == 0) return {{0, n}};
    return {};
  }
  // Only dim-0 splits pad or replicate pieces (vocabulary rows, k / v heads): a split along another
  // dim gives every rank distinct columns.
  if (s.partition_dim != 0) return {{0, n}};
  const int64_t inner = n / std::max<int64_t>(1, p.value.size(0));
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const Run& run : runs_of(s))
    if (run.start < s.global_size && run.holders.front().first == s.rank)
      out.emplace_back(run.holders.front().second * inner, run.length * inner);
  return out;
}

bool has_shared_grads(const Parameter& p) {
  if (p.shard.replicated()) return p.shard.partial_grad;
  for (const Run& run : runs_of(p.shard))
    if (run.holders.size() > 1) return true;
  return false;
}

void sum_shared_grads(const Parameter& p, const TensorParallel& tp) {
  if (!tp.active() || !has_shared_grads(p)) return;
  if (p.shard.replicated()) {
    tp.group->all_reduce(p.grad, parallel::ReduceOp::Sum);
    return;
  }
  // Every run held by several ranks, stacked in one buffer (the same layout on every rank): each
  // rank adds its part of the runs it holds, the sum over the group lands in all of them.
  const int dim = p.shard.partition_dim;
  std::vector<Run> shared;
  int64_t extent = 0;
  for (Run& run : runs_of(p.shard))
    if (run.holders.size() > 1) {
      extent += run.length;
      shared.push_back(std::move(run));
    }
  Shape shape = p.grad.shape();
  shape.at(static_cast<size_t>(dim)) = extent;
  const Tensor staging = Tensor::zeros(shape, DType::F32, MemCategory::Workspace, p.name + ".shared_grad");
  int64_t at = 0;
  for (const Run& run : shared) {
    if (const auto* mine = run.held_by(p.shard.rank)) copy_along(dim, &p.grad, mine->second, staging, at, run.length);
    at += run.length;
  }
  tp.group->all_reduce(staging, parallel::ReduceOp::Sum);
  at = 0;
  for (const Run& run : shared) {
    if (const auto* mine = run.held_by(p.shard.rank)) copy_along(dim, &staging, at, p.grad, mine->second, run.length);
    at += run.length;
  }
}

}  // namespace megaton::nn
