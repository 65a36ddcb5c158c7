#include "megaton/kernels/moe.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <mutex>
#include <omp.h>

#include "megaton/kernels/linear.h"
#ifdef MEGATON_WITH_CUDA
#include "megaton/kernels/cuda/moe.h"
#endif

namespace megaton::kernels {

namespace {

// Rows of t viewed as [rows, cols]; throws naming the op and tensor when its last dim is not cols.
int64_t rows_of_matrix(std::string_view op, const Tensor& t, int64_t cols) {
  if (t.dim() < 1 || t.size(-1) != cols || cols < 1)
    fail("kernel ", op, ": tensor '", t.name(), "' has shape ", shape_str(t.shape()), ", expected [rows, ", cols, "]");
  return t.numel() / cols;
}

void expect_cpu(const ExecContext& ctx, std::string_view op, std::initializer_list<const Tensor*> tensors) {
  expect_on_device(ctx, op, tensors);
  if (ctx.device.is_cuda()) fail_no_backend(ctx, op);
}

// [N, K] i32 tensor (indices, pos) of a router with K slots.
void expect_slots(std::string_view op, const Tensor& t, int64_t N, int64_t K) {
  expect_dtype(DType::I32, op, {&t});
  expect_matrix(op, t, N, K);
}

int64_t slots_of(std::string_view op, const Tensor& t) {
  if (t.dim() != 2) fail("kernel ", op, ": tensor '", t.name(), "' has shape ", shape_str(t.shape()), ", expected [N, K]");
  return t.size(1);
}

// pos must name rows inside [0, rows) (or -1): a wrong plan would write outside the permuted tensor.
// A CUDA plan is checked on a host copy (N x K ids: small next to the rows it moves).
void expect_positions(std::string_view op, const Tensor& pos, int64_t rows) {
  const Tensor host = pos.device().is_cpu() ? pos : pos.to(Device::cpu(), MemCategory::Workspace);
  const int32_t* p = host.data<int32_t>();
  for (int64_t i = 0; i < pos.numel(); ++i)
    if (p[i] < -1 || p[i] >= rows)
      fail("kernel ", op, ": '", pos.name(), "' names row ", p[i], " of a permuted tensor with ", rows, " rows");
}

void expect_blocks(std::string_view op, const Tensor& x, const std::vector<int64_t>& rows_per_expert) {
  int64_t total = 0;
  for (int64_t r : rows_per_expert) {
    if (r < 0) fail("kernel ", op, ": negative row count ", r, " for an expert");
    total = checked_add(op, total, r);
  }
  if (total != x.size(0))
    fail("kernel ", op, ": the experts' blocks hold ", total, " rows, tensor '", x.name(), "' has ", x.size(0));
}

// Calls f(first row, end row, w block) for every expert with rows; `w` is [E*out, in] and `out`
// rows per expert. grouped: when at least as many experts have rows as there are threads, one
// parallel region runs the experts' GEMMs side by side, each on one thread (OpenBLAS and oneDNN run
// a call single-threaded inside an active region), largest first and handed out as threads free
// up: no fork / join per expert, and each expert's weight stays in one core's cache. Otherwise
// (or not grouped: Megatron's SequentialMLP) the experts run in turn, each GEMM on every thread.
template <typename F>
void for_each_block(std::string_view op, const Tensor& rows, const Tensor& w, int64_t out_per_expert,
                    const std::vector<int64_t>& rows_per_expert, bool grouped, F&& f) {
  expect_blocks(op, rows, rows_per_expert);
  const auto E = static_cast<int64_t>(rows_per_expert.size());
  if (w.dim() != 2 || w.size(0) != checked_mul(op, E, out_per_expert))
    fail("kernel ", op, ": weight '", w.name(), "' has shape ", shape_str(w.shape()), ", expected [", E, " x ",
         out_per_expert, ", in]");
  struct Block {
    int64_t begin, end, expert;
  };
  std::vector<Block> blocks;
  int64_t begin = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = rows_per_expert[static_cast<size_t>(e)];
    if (n > 0) blocks.push_back({begin, begin + n, e});
    begin += n;
  }
  const auto run = [&](const Block& b) {
    f(b.begin, b.end, w.slice_rows(b.expert * out_per_expert, (b.expert + 1) * out_per_expert));
  };
  const int threads = omp_get_max_threads();
  // On a GPU the expert GEMMs queue on one stream in turn (host threads would only contend for it).
  if (!grouped || rows.device().is_cuda() || threads == 1 || static_cast<int>(blocks.size()) < threads ||
      omp_in_parallel()) {
    for (const Block& b : blocks) run(b);
    return;
  }
  std::stable_sort(blocks.begin(), blocks.end(),
                   [](const Block& a, const Block& b) { return a.end - a.begin > b.end - b.begin; });
  // An exception cannot leave a parallel region: the first is kept and rethrown after it.
  std::exception_ptr error;
  std::mutex error_mu;
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < blocks.size(); ++i) {
    try {
      run(blocks[i]);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(error_mu);
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace

void check_router_options(const RouterOptions& o) {
  if (o.experts < 1 || o.experts > (int64_t{1} << 20)) fail("moe router: num_moe_experts must be in [1, 2^20], got ", o.experts);
  if (o.topk < 1 || o.topk > o.experts)
    fail("moe router: moe_router_topk must be in [1, num_moe_experts = ", o.experts, "], got ", o.topk);
  if (o.groups < 1 || o.experts % o.groups != 0)
    fail("moe router: moe_router_num_groups ", o.groups, " must divide num_moe_experts ", o.experts);
  if (o.topk_groups < 1 || o.topk_groups > o.groups)
    fail("moe router: moe_router_group_topk must be in [1, moe_router_num_groups = ", o.groups, "], got ",
         o.topk_groups);
  if (o.topk > o.topk_groups * (o.experts / o.groups))
    fail("moe router: moe_router_topk ", o.topk, " exceeds the ", o.topk_groups * (o.experts / o.groups),
         " experts of the moe_router_group_topk eligible groups");
  if (!std::isfinite(o.scaling) || o.scaling <= 0)
    fail("moe router: moe_router_topk_scaling_factor must be finite and positive, got ", o.scaling);
}

void moe_route(const ExecContext& ctx, const Tensor& indices, const Tensor& probs, const Tensor& logits,
               const Tensor& bias, const RouterOptions& o) {
  constexpr std::string_view op = "moe_route";
  expect_cpu(ctx, op, {&indices, &probs, &logits});
  check_router_options(o);
  const int64_t N = rows_of_matrix(op, logits, o.experts);
  expect_slots(op, indices, N, o.topk);
  expect_dtype(logits.dtype(), op, {&probs});
  expect_matrix(op, probs, N, o.topk);
  if (bias.defined()) {
    expect_dtype(logits.dtype(), op, {&bias});
    expect_matrix(op, bias, 1, o.experts);
  }
  dispatch_cpu_float(logits.dtype(), op, [&]<typename T>(T) {
    cpu::moe_route(indices.data<int32_t>(), probs.data<T>(), logits.data<T>(), data_or_null<T>(bias), N, o);
  });
}

void moe_route_backward(const ExecContext& ctx, const Tensor& dlogits, const Tensor& dprobs, const Tensor& logits,
                        const Tensor& indices, const RouterOptions& o) {
  constexpr std::string_view op = "moe_route_backward";
  expect_cpu(ctx, op, {&dlogits, &dprobs, &logits, &indices});
  check_router_options(o);
  const int64_t N = rows_of_matrix(op, logits, o.experts);
  expect_matrix(op, dlogits, N, o.experts);
  expect_matrix(op, dprobs, N, o.topk);
  expect_slots(op, indices, N, o.topk);
  expect_dtype(logits.dtype(), op, {&dlogits, &dprobs});
  dispatch_cpu_float(logits.dtype(), op, [&]<typename T>(T) {
    cpu::moe_route_backward(dlogits.data<T>(), dprobs.data<T>(), logits.data<T>(), indices.data<int32_t>(), N, o);
  });
}

void moe_balance_scores(const ExecContext& ctx, const Tensor& scores, const Tensor& logits, bool sigmoid) {
  constexpr std::string_view op = "moe_balance_scores";
  expect_cpu(ctx, op, {&scores, &logits});
  expect_dtype(logits.dtype(), op, {&scores});
  expect_matrix(op, scores, rows_of_matrix(op, logits, logits.size(-1)), logits.size(-1));
  dispatch_cpu_float(logits.dtype(), op, [&]<typename T>(T) {
    cpu::moe_balance_scores(scores.data<T>(), logits.data<T>(), logits.numel() / logits.size(-1), logits.size(-1),
                            sigmoid);
  });
}

void moe_balance_scores_backward(const ExecContext& ctx, const Tensor& dlogits, const Tensor& dscores,
                                 const Tensor& logits, bool sigmoid) {
  constexpr std::string_view op = "moe_balance_scores_backward";
  expect_cpu(ctx, op, {&dlogits, &dscores, &logits});
  expect_dtype(logits.dtype(), op, {&dlogits, &dscores});
  const int64_t E = logits.size(-1), N = rows_of_matrix(op, logits, E);
  expect_matrix(op, dlogits, N, E);
  expect_matrix(op, dscores, N, E);
  dispatch_cpu_float(logits.dtype(), op, [&]<typename T>(T) {
    cpu::moe_balance_scores_backward(dlogits.data<T>(), dscores.data<T>(), logits.data<T>(), N, E, sigmoid);
  });
}

double moe_balance_loss(const ExecContext& ctx, const Tensor& dscores, const Tensor& scores, const Tensor& indices,
                        int64_t group_rows, double coeff, double grad_scale) {
  constexpr std::string_view op = "moe_balance_loss";
  expect_cpu(ctx, op, {&dscores, &scores, &indices});
  const int64_t E = scores.size(-1), N = rows_of_matrix(op, scores, E), K = slots_of(op, indices);
  expect_slots(op, indices, N, K);
  expect_dtype(scores.dtype(), op, {&dscores});
  expect_matrix(op, dscores, N, E);
  if (group_rows < 1 || N % group_rows != 0)
    fail("kernel ", op, ": ", N, " tokens do not split into groups of ", group_rows);
  const int32_t* idx = indices.data<int32_t>();
  for (int64_t i = 0; i < indices.numel(); ++i)
    if (idx[i] < 0 || idx[i] >= E) fail("kernel ", op, ": expert index ", idx[i], " outside [0, ", E, ")");
  double loss = 0.0;
  dispatch_cpu_float(scores.dtype(), op, [&]<typename T>(T) {
    loss = cpu::moe_balance_loss(dscores.data<T>(), scores.data<T>(), idx, N, E, K, group_rows, coeff, grad_scale);
  });
  return loss;
}

double moe_z_loss(const ExecContext& ctx, const Tensor& dlogits, const Tensor& logits, double coeff,
                  double grad_scale) {
  constexpr std::string_view op = "moe_z_loss";
  expect_cpu(ctx, op, {&logits});
  const int64_t E = logits.size(-1), N = rows_of_matrix(op, logits, E);
  if (dlogits.defined()) {
    expect_cpu(ctx, op, {&dlogits});
    expect_dtype(logits.dtype(), op, {&dlogits});
    expect_matrix(op, dlogits, N, E);
  }
  double loss = 0.0;
  dispatch_cpu_float(logits.dtype(), op, [&]<typename T>(T) {
    loss = cpu::moe_z_loss(data_or_null<T>(dlogits), logits.data<T>(), N, E, coeff, grad_scale);
  });
  return loss;
}

DispatchPlan moe_dispatch_plan(const ExecContext& ctx, const Tensor& pos, const Tensor& indices, const Tensor& probs,
                               int64_t experts, int64_t capacity, bool drop_by_position) {
  constexpr std::string_view op = "moe_dispatch_plan";
  expect_cpu(ctx, op, {&pos, &indices, &probs});
  const int64_t N = indices.size(0), K = slots_of(op, indices);
  expect_slots(op, indices, N, K);
  expect_slots(op, pos, N, K);
  expect_dtype(DType::F32, op, {&probs});
  expect_matrix(op, probs, N, K);
  const int32_t* idx = indices.data<int32_t>();
  const float* p = probs.data<float>();
  int32_t* out = pos.data<int32_t>();
  DispatchPlan plan;
  plan.selected_per_expert.assign(static_cast<size_t>(experts), 0);
  // Slots of each expert in token order.
  std::vector<std::vector<int64_t>> slots(static_cast<size_t>(experts));
  for (int64_t s = 0; s < N * K; ++s) {
    if (idx[s] < 0 || idx[s] >= experts) fail("kernel ", op, ": expert index ", idx[s], " outside [0, ", experts, ")");
    slots[static_cast<size_t>(idx[s])].push_back(s);
  }
  plan.rows_per_expert.assign(static_cast<size_t>(experts), 0);
  int64_t row = 0;
  for (int64_t e = 0; e < experts; ++e) {
    auto& mine = slots[static_cast<size_t>(e)];
    plan.selected_per_expert[static_cast<size_t>(e)] = static_cast<int64_t>(mine.size());
    if (capacity >= 0 && static_cast<int64_t>(mine.size()) > capacity) {
      // Keep the `capacity` slots with the largest probs (ties: earlier token), or the earliest ones,
      // then restore token order among the kept.
      if (!drop_by_position)
        std::stable_sort(mine.begin(), mine.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
      for (size_t i = static_cast<size_t>(capacity); i < mine.size(); ++i) out[mine[i]] = -1;
      plan.dropped += static_cast<int64_t>(mine.size()) - capacity;
      mine.resize(static_cast<size_t>(capacity));
      std::sort(mine.begin(), mine.end());
    }
    for (int64_t s : mine) out[s] = static_cast<int32_t>(row++);
    plan.rows_per_expert[static_cast<size_t>(e)] = static_cast<int64_t>(mine.size());
  }
  plan.rows = row;
  return plan;
}

void moe_kept_experts(const ExecContext& ctx, const Tensor& sel, const Tensor& indices, const Tensor& pos) {
  constexpr std::string_view op = "moe_kept_experts";
  expect_cpu(ctx, op, {&sel, &indices, &pos});
  const int64_t N = indices.size(0), K = slots_of(op, indices);
  for (const Tensor* t : {&sel, &indices, &pos}) expect_slots(op, *t, N, K);
  int32_t* out = sel.data<int32_t>();
  const int32_t* idx = indices.data<int32_t>();
  const int32_t* p = pos.data<int32_t>();
  for (int64_t s = 0; s < N * K; ++s) out[s] = p[s] >= 0 ? idx[s] : -1;
}

DispatchPlan moe_local_plan(const ExecContext& ctx, const Tensor& pos, const Tensor& sel, int64_t first_expert,
                            int64_t local_experts) {
  constexpr std::string_view op = "moe_local_plan";
  expect_cpu(ctx, op, {&pos, &sel});
  const int64_t N = sel.size(0), K = slots_of(op, sel);
  expect_slots(op, sel, N, K);
  expect_slots(op, pos, N, K);
  if (first_expert < 0 || local_experts < 1)
    fail("kernel ", op, ": local experts [", first_expert, ", ", first_expert, " + ", local_experts, ") is empty");
  const int32_t* e = sel.data<int32_t>();
  int32_t* out = pos.data<int32_t>();
  DispatchPlan plan;
  plan.rows_per_expert.assign(static_cast<size_t>(local_experts), 0);
  for (int64_t s = 0; s < N * K; ++s) {
    if (e[s] < -1) fail("kernel ", op, ": expert index ", e[s], " in '", sel.name(), "'");
    const int64_t j = e[s] - first_expert;
    if (e[s] >= 0 && j >= 0 && j < local_experts) ++plan.rows_per_expert[static_cast<size_t>(j)];
  }
  // Each local expert's first row, then its slots in order.
  std::vector<int64_t> next(static_cast<size_t>(local_experts), 0);
  for (int64_t j = 1; j < local_experts; ++j)
    next[static_cast<size_t>(j)] = next[static_cast<size_t>(j - 1)] + plan.rows_per_expert[static_cast<size_t>(j - 1)];
  for (int64_t s = 0; s < N * K; ++s) {
    const int64_t j = e[s] - first_expert;
    out[s] = e[s] >= 0 && j >= 0 && j < local_experts ? static_cast<int32_t>(next[static_cast<size_t>(j)]++) : -1;
  }
  plan.selected_per_expert = plan.rows_per_expert;
  for (int64_t r : plan.rows_per_expert) plan.rows += r;
  return plan;
}

void moe_sort_by_expert(const ExecContext& ctx, const Tensor& pos, const std::vector<int64_t>& counts,
                        int64_t sources, int64_t experts) {
  constexpr std::string_view op = "moe_sort_by_expert";
  expect_cpu(ctx, op, {&pos});
  if (sources < 1 || experts < 1 || static_cast<int64_t>(counts.size()) != sources * experts)
    fail("kernel ", op, ": ", counts.size(), " counts for ", sources, " sources x ", experts, " experts");
  int64_t total = 0;
  for (int64_t c : counts) {
    if (c < 0) fail("kernel ", op, ": negative row count ", c);
    total = checked_add(op, total, c);
  }
  expect_slots(op, pos, total, 1);
  // Where each (expert, source) block starts in expert-major order.
  std::vector<int64_t> start(counts.size());
  int64_t at = 0;
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t s = 0; s < sources; ++s) {
      start[static_cast<size_t>(s * experts + e)] = at;
      at += counts[static_cast<size_t>(s * experts + e)];
    }
  int32_t* out = pos.data<int32_t>();
  int64_t r = 0;
  for (size_t b = 0; b < counts.size(); ++b)
    for (int64_t i = 0; i < counts[b]; ++i) out[r++] = static_cast<int32_t>(start[b] + i);
}

void moe_permute(const ExecContext& ctx, const Tensor& out, const Tensor& x, const Tensor& pos) {
  constexpr std::string_view op = "moe_permute";
  expect_on_device(ctx, op, {&out, &x, &pos});
  const int64_t C = x.size(-1), N = rows_of_matrix(op, x, C), K = slots_of(op, pos);
  expect_slots(op, pos, N, K);
  expect_dtype(x.dtype(), op, {&out});
  expect_positions(op, pos, rows_of_matrix(op, out, C));
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::moe_permute(ctx, out, x, pos, N, K, C);
#endif
    fail_no_backend(ctx, op);
  }
  dispatch_cpu_io(x.dtype(), op, [&]<typename T>(T) {
    cpu::moe_permute(out.data<T>(), x.data<T>(), pos.data<int32_t>(), N, K, C);
  });
}

void moe_permute_backward(const ExecContext& ctx, const Tensor& dx, const Tensor& dout, const Tensor& pos) {
  constexpr std::string_view op = "moe_permute_backward";
  expect_on_device(ctx, op, {&dx, &dout, &pos});
  const int64_t C = dx.size(-1), N = rows_of_matrix(op, dx, C), K = slots_of(op, pos);
  expect_slots(op, pos, N, K);
  expect_dtype(dx.dtype(), op, {&dout});
  expect_positions(op, pos, rows_of_matrix(op, dout, C));
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::moe_permute_backward(ctx, dx, dout, pos, N, K, C);
#endif
    fail_no_backend(ctx, op);
  }
  dispatch_cpu_io(dx.dtype(), op, [&]<typename T>(T) {
    cpu::moe_permute_backward(dx.data<T>(), dout.data<T>(), pos.data<int32_t>(), N, K, C);
  });
}

void moe_unpermute(const ExecContext& ctx, const Tensor& y, const Tensor& rows, const Tensor& pos, const Tensor& probs) {
  constexpr std::string_view op = "moe_unpermute";
  expect_on_device(ctx, op, {&y, &rows, &pos, &probs});
  const int64_t C = y.size(-1), N = rows_of_matrix(op, y, C), K = slots_of(op, pos);
  expect_slots(op, pos, N, K);
  expect_dtype(y.dtype(), op, {&rows, &probs});
  expect_matrix(op, probs, N, K);
  expect_positions(op, pos, rows_of_matrix(op, rows, C));
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::moe_unpermute(ctx, y, rows, pos, probs, N, K, C);
#endif
    fail_no_backend(ctx, op);
  }
  dispatch_cpu_io(y.dtype(), op, [&]<typename T>(T) {
    cpu::moe_unpermute(y.data<T>(), rows.data<T>(), pos.data<int32_t>(), probs.data<T>(), N, K, C);
  });
}

void moe_unpermute_backward(const ExecContext& ctx, const Tensor& drows, const Tensor& dprobs, const Tensor& dy,
                            const Tensor& rows, const Tensor& pos, const Tensor& probs) {
  constexpr std::string_view op = "moe_unpermute_backward";
  expect_on_device(ctx, op, {&drows, &dprobs, &dy, &rows, &pos, &probs});
  const int64_t C = dy.size(-1), N = rows_of_matrix(op, dy, C), K = slots_of(op, pos);
  expect_slots(op, pos, N, K);
  expect_dtype(dy.dtype(), op, {&drows, &dprobs, &rows, &probs});
  expect_matrix(op, probs, N, K);
  expect_matrix(op, dprobs, N, K);
  const int64_t M = rows_of_matrix(op, rows, C);
  expect_matrix(op, drows, M, C);
  expect_positions(op, pos, M);
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    return cuda::moe_unpermute_backward(ctx, drows, dprobs, dy, rows, pos, probs, N, K, C);
#endif
    fail_no_backend(ctx, op);
  }
  dispatch_cpu_io(dy.dtype(), op, [&]<typename T>(T) {
    cpu::moe_unpermute_backward(drows.data<T>(), dprobs.data<T>(), dy.data<T>(), rows.data<T>(),
                                pos.data<int32_t>(), probs.data<T>(), N, K, C);
  });
}

void grouped_linear_forward(const ExecContext& ctx, const Tensor& out, const Tensor& x, const Tensor& w,
                            const std::vector<int64_t>& rows_per_expert, bool grouped) {
  constexpr std::string_view op = "grouped_linear_forward";
  expect_on_device(ctx, op, {&out, &x, &w});
  for_each_block(op, x, w, out.size(-1), rows_per_expert, grouped, [&](int64_t b, int64_t e, const Tensor& we) {
    linear_forward(ctx, out.slice_rows(b, e), x.slice_rows(b, e), we, Tensor{});
  });
}

void grouped_linear_backward_input(const ExecContext& ctx, const Tensor& dx, const Tensor& dout, const Tensor& w,
                                   const std::vector<int64_t>& rows_per_expert, bool grouped) {
  constexpr std::string_view op = "grouped_linear_backward_input";
  expect_on_device(ctx, op, {&dx, &dout, &w});
  for_each_block(op, dx, w, dout.size(-1), rows_per_expert, grouped, [&](int64_t b, int64_t e, const Tensor& we) {
    linear_backward_input(ctx, dx.slice_rows(b, e), dout.slice_rows(b, e), we);
  });
}

void grouped_linear_backward_weight(const ExecContext& ctx, const Tensor& dw, const Tensor& dout, const Tensor& x,
                                    const std::vector<int64_t>& rows_per_expert, bool grouped) {
  constexpr std::string_view op = "grouped_linear_backward_weight";
  expect_on_device(ctx, op, {&dw, &dout, &x});
  for_each_block(op, x, dw, dout.size(-1), rows_per_expert, grouped, [&](int64_t b, int64_t e, const Tensor& dwe) {
    linear_backward_weight(ctx, dwe, Tensor{}, dout.slice_rows(b, e), x.slice_rows(b, e));
  });
}

}  // namespace megaton::kernels
