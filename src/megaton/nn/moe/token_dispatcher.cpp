#include "megaton/nn/moe/token_dispatcher.h"

#include "megaton/kernels/moe.h"
#include "megaton/nn/linear.h"
#include "megaton/parallel/tensor_parallel_mappings.h"

namespace megaton::nn {

namespace {

int64_t sum(const std::vector<int64_t>& v, size_t begin, size_t end) {
  int64_t s = 0;
  for (size_t i = begin; i < end; ++i) s += v[i];
  return s;
}

std::vector<int64_t> times(std::vector<int64_t> rows, int64_t cols) {
  for (int64_t& r : rows) r = checked_mul("moe all-to-all elements", r, cols);
  return rows;
}

// The slots permuted by expert on the token's rank travel to their expert's rank and back.
class AllToAllDispatcher final : public TokenDispatcher {
 public:
  AllToAllDispatcher(const ExpertParallel& ep, int64_t experts) : ep_(ep), local_(experts / ep.size()) {}

  Tensor dispatch(const Tensor& x, const MoeRouting& r, const std::function<void()>& overlap) override {
    const auto on = kernels::ExecContext::on(x);
    pos_ = r.pos;
    probs_ = r.probs;
    const int64_t C = x.size(-1);
    Tensor xp = new_activation({sum(r.rows_per_expert, 0, r.rows_per_expert.size()), C}, "moe.permuted", x.dtype());
    kernels::moe_permute(on, xp, x, pos_);
    if (!ep_.active()) {
      rows_per_expert_ = r.rows_per_expert;
      overlap();
      return xp;
    }
    exchange_counts(r.rows_per_expert);
    const int64_t R = sum(rows_per_expert_, 0, rows_per_expert_.size());
    Tensor received = new_activation({R, C}, "moe.received", x.dtype());
    auto work = ep_.group->all_to_all_async(received, times(recv_rows_, C), xp, times(send_rows_, C));
    overlap();
    comm_seconds_ += parallel::wait_counted(*work);
    xp = {};
    sort_pos_ = new_activation({R, 1}, "moe.sort_pos", DType::I32);
    kernels::moe_sort_by_expert(on, sort_pos_, counts_, ep_.size(), local_);
    Tensor sorted = new_activation({R, C}, "moe.expert_input", x.dtype());
    kernels::moe_permute(on, sorted, received, sort_pos_);
    return sorted;
  }

  Tensor combine(const Tensor& expert_out) override {
    const auto on = kernels::ExecContext::on(expert_out);
    out_ = travel_back(expert_out, "moe.expert_output");
    Tensor y = new_activation({pos_.size(0), expert_out.size(-1)}, "moe.routed_out", expert_out.dtype());
    kernels::moe_unpermute(on, y, out_, pos_, as_dtype(probs_, y.dtype()));
    return y;
  }

  Tensor combine_backward(const Tensor& dy, Tensor& dprobs, const std::function<void()>& overlap) override {
    const auto on = kernels::ExecContext::on(dy);
    const int64_t C = dy.size(-1);
    Tensor dout = new_activation(out_.shape(), "moe.expert_output.grad", dy.dtype());
    Tensor dp = new_activation(pos_.shape(), "moe.dprobs", dy.dtype());
    kernels::moe_unpermute_backward(on, dout, dp, dy, out_, pos_, as_dtype(probs_, dy.dtype()));
    dprobs = dp;
    out_ = {};
    if (!ep_.active()) {
      overlap();
      return dout;
    }
    const int64_t R = sort_pos_.size(0);
    Tensor received = new_activation({R, C}, "moe.received.grad", dy.dtype());
    auto work = ep_.group->all_to_all_async(received, times(recv_rows_, C), dout, times(send_rows_, C));
    overlap();
    comm_seconds_ += parallel::wait_counted(*work);
    Tensor sorted = new_activation({R, C}, "moe.expert_output.grad_sorted", dy.dtype());
    kernels::moe_permute(on, sorted, received, sort_pos_);
    return sorted;
  }

  Tensor dispatch_backward(const Tensor& dexpert_in) override {
    const Tensor dxp = travel_back(dexpert_in, "moe.permuted.grad");
    Tensor dx = new_activation({pos_.size(0), dexpert_in.size(-1)}, "moe.routed_dx", dexpert_in.dtype());
    kernels::moe_permute_backward(kernels::ExecContext::on(dx), dx, dxp, pos_);
    return dx;
  }

 private:
  // Every rank learns how many rows each source sends to each of its local experts.
  void exchange_counts(const std::vector<int64_t>& rows_per_expert) {
    const int P = ep_.size();
    Tensor send = Tensor::empty({local_ * P}, DType::I64, MemCategory::Workspace, "moe.counts");
    Tensor recv = Tensor::empty({local_ * P}, DType::I64, MemCategory::Workspace, "moe.counts_received");
    for (int64_t e = 0; e < local_ * P; ++e) send.data<int64_t>()[e] = rows_per_expert[static_cast<size_t>(e)];
    const std::vector<int64_t> each(static_cast<size_t>(P), local_);
    ep_.group->all_to_all(recv, each, send, each);
    counts_.assign(recv.data<int64_t>(), recv.data<int64_t>() + local_ * P);
    send_rows_.assign(static_cast<size_t>(P), 0);
    recv_rows_.assign(static_cast<size_t>(P), 0);
    rows_per_expert_.assign(static_cast<size_t>(local_), 0);
    for (int p = 0; p < P; ++p) {
      const auto b = static_cast<size_t>(p * local_), e = static_cast<size_t>((p + 1) * local_);
      send_rows_[static_cast<size_t>(p)] = sum(rows_per_expert, b, e);
      recv_rows_[static_cast<size_t>(p)] = sum(counts_, b, e);
      for (int64_t j = 0; j < local_; ++j) rows_per_expert_[static_cast<size_t>(j)] += counts_[b + static_cast<size_t>(j)];
    }
  }

  // Expert-major rows [R, C] back to the token ranks' permuted order [M, C] (the transpose of the
  // dispatch's travel and sort).
  Tensor travel_back(const Tensor& rows, const std::string& name) {
    if (!ep_.active()) return rows;
    const int64_t C = rows.size(-1);
    Tensor unsorted = new_activation(rows.shape(), name + ".unsorted", rows.dtype());
    kernels::moe_permute_backward(kernels::ExecContext::on(rows), unsorted, rows, sort_pos_);
    Tensor back = new_activation({sum(send_rows_, 0, send_rows_.size()), C}, name, rows.dtype());
    auto work = ep_.group->all_to_all_async(back, times(send_rows_, C), unsorted, times(recv_rows_, C));
    comm_seconds_ += parallel::wait_counted(*work);
    return back;
  }

  ExpertParallel ep_;
  int64_t local_;
  Tensor pos_, probs_, sort_pos_;
  Tensor out_;  // the experts' outputs in this rank's permuted order, for unpermute's backward
  std::vector<int64_t> counts_;  // [source][local expert]: rows received
  std::vector<int64_t> send_rows_, recv_rows_;  // per peer
};

// Every rank sees the group's tokens and runs its own experts on them; partial outputs are summed.
class AllGatherDispatcher final : public TokenDispatcher {
 public:
  AllGatherDispatcher(const ExpertParallel& ep, int64_t experts) : ep_(ep), local_(experts / ep.size()) {}

  Tensor dispatch(const Tensor& x, const MoeRouting& r, const std::function<void()>& overlap) override {
    const auto on = kernels::ExecContext::on(x);
    parallel::Communicator& g = *ep_.group;
    Tensor kept = new_activation(r.indices.shape(), "moe.kept_experts", DType::I32);
    kernels::moe_kept_experts(on, kept, r.indices, r.pos);
    const Tensor kept_all = parallel::gather_rows(g, kept, "moe.kept_experts_all");
    probs_all_ = parallel::gather_rows(g, r.probs, "moe.probs_all");
    Tensor x_all = new_activation({x.size(0) * g.size(), x.size(-1)}, "moe.tokens_all", x.dtype());
    auto work = g.all_gather_async(x_all, x);
    overlap();
    comm_seconds_ += parallel::wait_counted(*work);
    pos_all_ = new_activation(kept_all.shape(), "moe.local_pos", DType::I32);
    rows_per_expert_ = kernels::moe_local_plan(on, pos_all_, kept_all, g.rank() * local_, local_).rows_per_expert;
    Tensor xs = new_activation({sum(rows_per_expert_, 0, rows_per_expert_.size()), x.size(-1)}, "moe.expert_input",
                               x.dtype());
    kernels::moe_permute(on, xs, x_all, pos_all_);
    return xs;
  }

  Tensor combine(const Tensor& expert_out) override {
    out_ = expert_out;
    Tensor y_all = new_activation({pos_all_.size(0), expert_out.size(-1)}, "moe.partial_out", expert_out.dtype());
    kernels::moe_unpermute(kernels::ExecContext::on(y_all), y_all, expert_out, pos_all_,
                           as_dtype(probs_all_, y_all.dtype()));
    return sum_back(y_all, "moe.routed_out");
  }

  Tensor combine_backward(const Tensor& dy, Tensor& dprobs, const std::function<void()>& overlap) override {
    parallel::Communicator& g = *ep_.group;
    Tensor dy_all = new_activation({dy.size(0) * g.size(), dy.size(-1)}, "moe.routed_out.grad_all", dy.dtype());
    auto work = g.all_gather_async(dy_all, dy);
    overlap();
    comm_seconds_ += parallel::wait_counted(*work);
    Tensor dout = new_activation(out_.shape(), "moe.expert_output.grad", dy.dtype());
    Tensor dp_all = new_activation(pos_all_.shape(), "moe.dprobs_all", dy.dtype());
    kernels::moe_unpermute_backward(kernels::ExecContext::on(dy), dout, dp_all, dy_all, out_, pos_all_,
                                    as_dtype(probs_all_, dy.dtype()));
    out_ = {};
    // Each slot's prob gradient is nonzero on the rank of its expert alone.
    dprobs = sum_back(dp_all, "moe.dprobs");
    return dout;
  }

  Tensor dispatch_backward(const Tensor& dexpert_in) override {
    Tensor dx_all = new_activation({pos_all_.size(0), dexpert_in.size(-1)}, "moe.tokens_all.grad", dexpert_in.dtype());
    kernels::moe_permute_backward(kernels::ExecContext::on(dx_all), dx_all, dexpert_in, pos_all_);
    return sum_back(dx_all, "moe.routed_dx");
  }

 private:
  // [ep N, C] partial sums on every rank -> this rank's [N, C] rows of their sum, reduced in f32
  // (the communicator reduces no fp16, and bf16 partial sums would round once more than at ep 1).
  Tensor sum_back(const Tensor& partial, const std::string& name) {
    const auto t0 = parallel::tensor_parallel_wait_seconds();
    Tensor sum = parallel::reduce_scatter_rows(*ep_.group, as_dtype(partial, DType::F32), name);
    comm_seconds_ += parallel::tensor_parallel_wait_seconds() - t0;
    return as_dtype(sum, partial.dtype());
  }

  ExpertParallel ep_;
  int64_t local_;
  Tensor probs_all_, pos_all_;
  Tensor out_;  // the experts' outputs, for unpermute's backward
};

}  // namespace

const std::vector<std::string>& token_dispatcher_types() {
  static const std::vector<std::string> types{"alltoall", "allgather"};
  return types;
}

std::unique_ptr<TokenDispatcher> make_token_dispatcher(const std::string& type, const ExpertParallel& ep,
                                                       int64_t experts) {
  if (experts % ep.size() != 0)
    fail("num_moe_experts ", experts, " is not divisible by expert_model_parallel_size ", ep.size());
  if (type == "allgather" && ep.active()) return std::make_unique<AllGatherDispatcher>(ep, experts);
  if (type == "alltoall" || type == "allgather") return std::make_unique<AllToAllDispatcher>(ep, experts);
  fail("moe_token_dispatcher_type '", type, "' is not one of alltoall, allgather");
}

}  // namespace megaton::nn
