#include "megaton/parallel/tensor_parallel_mappings.h"

#include <chrono>

namespace megaton::parallel {

namespace {
thread_local double waited = 0;

// Adds the lifetime of the scope to `waited`.
class WaitTimer {
 public:
  WaitTimer() : t0_(std::chrono::steady_clock::now()) {}
  ~WaitTimer() { waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  WaitTimer(const WaitTimer&) = delete;
  WaitTimer& operator=(const WaitTimer&) = delete;

 private:
  std::chrono::steady_clock::time_point t0_;
};

// Rows of t viewed as [rows, last dim].
int64_t rows_of(const Tensor& t) { return t.numel() / t.size(-1); }

int64_t rows_per_rank(Communicator& group, const Tensor& t, const char* op) {
  const int64_t rows = rows_of(t);
  if (rows % group.size() != 0)
    fail(op, " of '", t.name(), "': its ", rows, " rows (tokens of the micro-batch) do not split over the ", group.size(),
         " ranks of group '", group.name(), "' (sequence parallelism needs micro_batch_size x seq_length divisible by "
         "tensor_model_parallel_size)");
  return rows / group.size();
}
}  // namespace

double tensor_parallel_wait_seconds() { return waited; }

double wait_counted(Work& work) {
  const double before = waited;
  {
    WaitTimer timer;
    work.wait();
  }
  return waited - before;
}

void reduce_from_region(Communicator& group, const Tensor& t, ReduceOp op) {
  if (group.size() == 1) return;
  WaitTimer timer;
  group.all_reduce(t, op);
}

Tensor gather_rows(Communicator& group, const Tensor& t, const std::string& name) {
  const int64_t cols = t.size(-1);
  Tensor out = Tensor::empty({rows_of(t) * group.size(), cols}, t.dtype(), MemCategory::Activations, name, t.device());
  WaitTimer timer;
  group.all_gather(out, t);
  return out;
}

Tensor reduce_scatter_rows(Communicator& group, const Tensor& t, const std::string& name) {
  const int64_t rows = rows_per_rank(group, t, "reduce_scatter_rows");
  Tensor out = Tensor::empty({rows, t.size(-1)}, t.dtype(), MemCategory::Activations, name, t.device());
  WaitTimer timer;
  group.reduce_scatter(out, t, ReduceOp::Sum);
  return out;
}

Tensor scatter_rows(Communicator& group, const Tensor& t, const std::string& name) {
  const int64_t rows = rows_per_rank(group, t, "scatter_rows");
  const int64_t cols = t.size(-1);
  Tensor out = Tensor::empty({rows, cols}, t.dtype(), MemCategory::Activations, name, t.device());
  out.copy_from(t.window(group.rank() * rows * cols, {rows, cols}, name));
  return out;
}

}  // namespace megaton::parallel
