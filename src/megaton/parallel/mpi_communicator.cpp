#include "megaton/parallel/mpi_communicator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "megaton/parallel/local_communicator.h"

namespace megaton::parallel {

namespace {

std::atomic<int64_t> g_max_count{INT_MAX};

// ---------------------------------------------------------------------------------------------
// The progress engine: one thread that makes every MPI call of the process.

// Completion of one queued operation, shared by the queue entry and its WorkHandle.
struct OpState {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;

  void complete(std::exception_ptr e) {
    {
      std::lock_guard lk(m);
      error = std::move(e);
      done = true;
    }
    cv.notify_all();
  }
};

class MpiWork final : public Work {
 public:
  explicit MpiWork(std::shared_ptr<OpState> s) : s_(std::move(s)) {}
  void wait() override {
    std::unique_lock lk(s_->m);
    s_->cv.wait(lk, [&] { return s_->done; });
    if (s_->error) std::rethrow_exception(s_->error);
  }

 private:
  std::shared_ptr<OpState> s_;
};

// One queued operation. `start` runs on the progress thread: a collective makes its blocking MPI
// call there; a send / recv posts requests into `requests`, which the thread then polls; `finish`
// (optional) runs once they all completed, with their statuses. The lambdas hold the tensors, so
// buffers live until the operation is over even if the caller drops them.
struct Op {
  std::string what;  // "all_reduce of 'g' on group 'dp' (rank 1 of 4)"
  std::function<void(Op&)> start;
  std::function<void(Op&)> finish;
  std::vector<MPI_Request> requests;
  std::vector<MPI_Status> statuses;
  std::exception_ptr error;
  std::shared_ptr<OpState> state = std::make_shared<OpState>();
};

std::string mpi_error_text(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error code " + std::to_string(rc);
  return std::string(text, static_cast<size_t>(len));
}

// Throws naming the operation and MPI's description of `rc` (progress thread only).
void check_mpi(int rc, const std::string& what) {
  if (rc != MPI_SUCCESS) fail("MPI error in ", what, ": ", mpi_error_text(rc));
}

// bf16 reductions: MPI has no bf16 type, so bf16 travels as 16-bit words and user-defined
// operations combine pairs in f32 (rounded back to bf16 after each pairwise step). Max and Min
// propagate NaN (a NaN norm must not be hidden by a larger finite value).
template <typename Combine>
void bf16_combine(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = float_to_bf16(Combine{}(bf16_to_float(a[i]), bf16_to_float(b[i])));
}
struct SumF {
  float operator()(float a, float b) const { return a + b; }
};
struct MaxF {
  float operator()(float a, float b) const { return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b); }
};
struct MinF {
  float operator()(float a, float b) const { return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b); }
};

std::string thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "level " + std::to_string(level);
}

class ProgressEngine {
 public:
  // Starts the thread and initialises MPI on the first call; throws if MPI cannot run (every
  // later call throws the same error).
  static ProgressEngine& start() {
    static std::mutex start_mutex;
    std::lock_guard lk(start_mutex);
    if (instance_) return *instance_;
    static std::string failure;
    if (!failure.empty()) fail(failure);
    auto* engine = new ProgressEngine();  // lives until the process exits
    std::promise<void> ready;
    auto started = ready.get_future();
    engine->thread_ = std::thread([engine, &ready] { engine->run(ready); });
    try {
      started.get();
    } catch (const std::exception& e) {
      engine->thread_.join();
      delete engine;
      failure = e.what();
      throw;
    }
    instance_ = engine;
    running_.store(true);
    std::atexit([] { shutdown_at_exit(); });
    return *engine;
  }
  // The running engine (MPI initialised and not yet finalised), else null.
  static ProgressEngine* running() { return running_.load() ? instance_ : nullptr; }

  WorkHandle submit(std::unique_ptr<Op> op) {
    auto state = op->state;
    {
      std::lock_guard lk(m_);
      if (stopping_) fail(op->what, ": MPI has been finalised (the process is exiting)");
      queue_.push_back(std::move(op));
    }
    cv_.notify_one();
    return std::make_shared<MpiWork>(std::move(state));
  }
  // Queue an operation and wait for it.
  void run_blocking(std::string what, std::function<void(Op&)> start) {
    auto op = std::make_unique<Op>();
    op->what = std::move(what);
    op->start = std::move(start);
    submit(std::move(op))->wait();
  }

  int tag_ub() const { return tag_ub_; }
  MPI_Op bf16_op(ReduceOp op) const { return bf16_ops_[static_cast<int>(op)]; }

 private:
  ProgressEngine() = default;

  // Drains the queue and the posted requests, finalises MPI and joins the thread. Registered with
  // atexit: normal exits finalise MPI; MPI_Abort ends the process without coming here.
  static void shutdown_at_exit() {
    ProgressEngine* e = instance_;
    if (!e || !running_.load()) return;
    {
      std::lock_guard lk(e->m_);
      e->stopping_ = true;
    }
    e->cv_.notify_one();
    if (e->thread_.joinable()) e->thread_.join();
    running_.store(false);
  }

  void run(std::promise<void>& ready) {
    try {
      // The progress thread waits inside blocking collectives while the compute thread works; Open
      // MPI's default busy-polling there takes a core from the computation it should overlap with
      // (gpt2-124m dp2 on 2 cores, 10M-element buckets: 24.2 s steps polling, 17.4 s yielding).
      // Yield instead, unless the user chose otherwise.
      setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
      int provided = MPI_THREAD_SINGLE;
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
      if (provided < MPI_THREAD_SERIALIZED) {
        MPI_Finalize();
        fail("MPI provides only ", thread_level_name(provided),
             "; Megaton needs MPI_THREAD_SERIALIZED (its progress thread makes the MPI calls while other "
             "threads compute)");
      }
      check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
      void* ub = nullptr;
      int has_ub = 0;
      check_mpi(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &has_ub), "MPI_Comm_get_attr(MPI_TAG_UB)");
      tag_ub_ = has_ub ? *static_cast<int*>(ub) : 32767;
      check_mpi(MPI_Op_create(&bf16_combine<SumF>, 1, &bf16_ops_[static_cast<int>(ReduceOp::Sum)]), "MPI_Op_create");
      check_mpi(MPI_Op_create(&bf16_combine<MaxF>, 1, &bf16_ops_[static_cast<int>(ReduceOp::Max)]), "MPI_Op_create");
      check_mpi(MPI_Op_create(&bf16_combine<MinF>, 1, &bf16_ops_[static_cast<int>(ReduceOp::Min)]), "MPI_Op_create");
    } catch (...) {
      ready.set_exception(std::current_exception());
      return;
    }
    ready.set_value();
    loop();
    for (MPI_Op& op : bf16_ops_) MPI_Op_free(&op);
    MPI_Finalize();
  }

  void loop() {
    auto backoff = std::chrono::microseconds(10);
    std::unique_lock lk(m_);
    for (;;) {
      if (!queue_.empty()) {
        std::unique_ptr<Op> op = std::move(queue_.front());
        queue_.pop_front();
        lk.unlock();
        execute(std::move(op));
        poll();
        lk.lock();
        backoff = std::chrono::microseconds(10);
        continue;
      }
      if (!in_flight_.empty()) {
        lk.unlock();
        const bool progressed = poll();
        lk.lock();
        if (progressed) {
          backoff = std::chrono::microseconds(10);
        } else if (queue_.empty()) {
          // Nothing to start: poll the posted requests again soon, or start a newly queued op.
          cv_.wait_for(lk, backoff);
          backoff = std::min(backoff * 2, std::chrono::microseconds(250));
        }
        continue;
      }
      if (stopping_) return;
      cv_.wait(lk);
    }
  }

  void execute(std::unique_ptr<Op> op) {
    try {
      op->start(*op);
    } catch (...) {
      op->error = std::current_exception();
    }
    if (op->requests.empty()) {
      op->state->complete(op->error);
    } else {
      op->statuses.resize(op->requests.size());
      in_flight_.push_back(std::move(op));
    }
  }

  // Tests every posted request; completes the operations whose requests are all done. Returns
  // whether any request completed.
  bool poll() {
    bool progressed = false;
    for (auto it = in_flight_.begin(); it != in_flight_.end();) {
      Op& op = **it;
      bool all_done = true;
      for (size_t i = 0; i < op.requests.size(); ++i) {
        if (op.requests[i] == MPI_REQUEST_NULL) continue;
        int flag = 0;
        const int rc = MPI_Test(&op.requests[i], &flag, &op.statuses[i]);
        if (rc != MPI_SUCCESS) {
          op.requests[i] = MPI_REQUEST_NULL;  // completed with an error
          progressed = true;
          if (!op.error) {
            try {
              check_mpi(rc, op.what);
            } catch (...) {
              op.error = std::current_exception();
            }
          }
          continue;
        }
        if (flag) {
          progressed = true;
        } else {
          all_done = false;
        }
      }
      if (!all_done) {
        ++it;
        continue;
      }
      if (!op.error && op.finish) {
        try {
          op.finish(op);
        } catch (...) {
          op.error = std::current_exception();
        }
      }
      op.state->complete(op.error);
      it = in_flight_.erase(it);
    }
    return progressed;
  }

  static inline ProgressEngine* instance_ = nullptr;
  static inline std::atomic<bool> running_{false};

  std::thread thread_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Op>> queue_;
  bool stopping_ = false;
  std::vector<std::unique_ptr<Op>> in_flight_;  // progress thread only
  int tag_ub_ = 32767;
  MPI_Op bf16_ops_[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
};

ProgressEngine& engine() {
  ProgressEngine* e = ProgressEngine::running();
  if (!e) fail("MPI is not running: parallel::world() starts it when the process is launched by mpirun / srun");
  return *e;
}

// ---------------------------------------------------------------------------------------------
// Argument checks (calling thread) and MPI types.

// `role`: "output " / "input " where an operation takes two tensors, else "".
void expect_host(const std::string& where, const char* role, const Tensor& t) {
  if (!t.defined()) fail(where, ": the ", role, "tensor is undefined");
  if (!t.device().is_cpu())
    fail(where, ": ", role, "tensor '", t.name(), "' is on ", t.device().str(),
         "; MpiCommunicator moves host tensors only (CUDA tensors need the NCCL communicator)");
}

void expect_same_dtype(const std::string& where, const Tensor& out, const Tensor& in) {
  if (out.dtype() != in.dtype())
    fail(where, ": output '", out.name(), "' is ", dtype_name(out.dtype()), " but input '", in.name(), "' is ",
         dtype_name(in.dtype()));
}

// The MPI type and operation of a reduction over `t`'s dtype.
std::pair<MPI_Datatype, MPI_Op> reduction_of(const std::string& where, const Tensor& t, ReduceOp op) {
  MPI_Op mpi_op = op == ReduceOp::Sum ? MPI_SUM : op == ReduceOp::Max ? MPI_MAX : MPI_MIN;
  switch (t.dtype()) {
    case DType::F32: return {MPI_FLOAT, mpi_op};
    case DType::F64: return {MPI_DOUBLE, mpi_op};
    case DType::I32: return {MPI_INT32_T, mpi_op};
    case DType::I64: return {MPI_INT64_T, mpi_op};
    case DType::BF16: return {MPI_UINT16_T, engine().bf16_op(op)};
    default:
      fail(where, ": tensor '", t.name(), "' is ", dtype_name(t.dtype()),
           "; reductions take f32, f64, i32, i64 and bf16");
  }
}

// Non-reducing operations move elements as opaque words of the element's size.
MPI_Datatype word_type(DType d) {
  switch (dtype_size(d)) {
    case 1: return MPI_UINT8_T;
    case 2: return MPI_UINT16_T;
    case 4: return MPI_UINT32_T;
    case 8: return MPI_UINT64_T;
  }
  fail("no MPI word type for ", dtype_name(d), " (", dtype_size(d), " bytes)");
}

// A count for one MPI call, or an error naming the operation and the limit.
int single_count(const std::string& where, const char* what, int64_t n) {
  if (n < 0) fail(where, ": negative ", what, " ", n);
  if (n > g_max_count.load())
    fail(where, ": ", what, " of ", n, " elements exceeds the ", g_max_count.load(),
         " elements one MPI call can move (MPI counts are int); split the tensor");
  return static_cast<int>(n);
}

bool overlap(const Tensor& a, const Tensor& b) {
  const char* pa = static_cast<const char*>(a.raw());
  const char* pb = static_cast<const char*>(b.raw());
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

// Calls f(offset, count) over [0, n) in pieces of at most the MPI count limit.
template <typename F>
void in_chunks(int64_t n, F&& f) {
  const int64_t step = g_max_count.load();
  if (n == 0) f(int64_t{0}, 0);
  for (int64_t off = 0; off < n; off += step) f(off, static_cast<int>(std::min(step, n - off)));
}

}  // namespace

void set_mpi_max_count_for_tests(int64_t max_count) {
  g_max_count.store(max_count < 1 ? 1 : std::min<int64_t>(max_count, INT_MAX));
}
int64_t mpi_max_count() { return g_max_count.load(); }

// ---------------------------------------------------------------------------------------------
// MpiCommunicator

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name, bool owned)
    : comm_(comm), name_(std::move(name)), owned_(owned) {
  engine().run_blocking("MPI_Comm_rank / MPI_Comm_size of group '" + name_ + "'", [this](Op& op) {
    check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), op.what);
    check_mpi(MPI_Comm_rank(comm_, &rank_), op.what);
    check_mpi(MPI_Comm_size(comm_, &size_), op.what);
  });
}

MpiCommunicator::~MpiCommunicator() {
  if (!owned_) return;
  ProgressEngine* e = ProgressEngine::running();
  if (!e) return;  // MPI already finalised: it freed the communicator
  auto op = std::make_unique<Op>();
  op->what = "MPI_Comm_free of group '" + name_ + "'";
  MPI_Comm comm = comm_;
  op->start = [comm](Op&) mutable { MPI_Comm_free(&comm); };
  try {
    e->submit(std::move(op));  // queued behind this group's last operations; nobody waits
  } catch (...) {
  }
}

std::string MpiCommunicator::where(const char* op) const {
  return detail::concat(op, " on group '", name_, "' (rank ", rank_, " of ", size_, ")");
}

WorkHandle MpiCommunicator::all_reduce_async(const Tensor& t, ReduceOp op) {
  const std::string w = where("all_reduce");
  expect_host(w, "", t);
  auto [type, mpi_op] = reduction_of(w, t, op);
  auto q = std::make_unique<Op>();
  q->what = detail::concat(w, " of '", t.name(), "'");
  // type and mpi_op are copied by init-capture: clang 14 (the fuzzing build) cannot capture structured bindings.
  q->start = [t, type = type, mpi_op = mpi_op, comm = comm_](Op& self) {
    char* p = static_cast<char*>(t.raw());
    const size_t es = dtype_size(t.dtype());
    in_chunks(t.numel(), [&](int64_t off, int n) {
      check_mpi(MPI_Allreduce(MPI_IN_PLACE, p + off * es, n, type, mpi_op, comm), self.what);
    });
  };
  return engine().submit(std::move(q));
}

WorkHandle MpiCommunicator::reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op) {
  const std::string w = where("reduce_scatter");
  expect_host(w, "output ", out);
  expect_host(w, "input ", in);
  expect_same_dtype(w, out, in);
  if (in.numel() != out.numel() * size_)
    fail(w, ": input '", in.name(), "' has ", in.numel(), " elements, output '", out.name(), "' ", out.numel(),
         "; the input must hold ", size_, " blocks of the output's size (", out.numel() * size_, ")");
  auto [type, mpi_op] = reduction_of(w, in, op);
  const int count = single_count(w, "block", out.numel());
  auto q = std::make_unique<Op>();
  q->what = detail::concat(w, " of '", in.name(), "' into '", out.name(), "'");
  q->start = [out, in, count, type = type, mpi_op = mpi_op, comm = comm_, staged = overlap(out, in)](Op& self) {
    // MPI forbids aliased buffers: an output inside the input (a shard of a flat buffer) is reduced
    // into a temporary and copied.
    Tensor dst = staged ? Tensor::empty({out.numel()}, out.dtype(), MemCategory::Workspace, "reduce_scatter.staging")
                        : out;
    check_mpi(MPI_Reduce_scatter_block(in.raw(), dst.raw(), count, type, mpi_op, comm), self.what);
    if (staged) std::memcpy(out.raw(), dst.raw(), out.nbytes());
  };
  return engine().submit(std::move(q));
}

WorkHandle MpiCommunicator::all_gather_async(const Tensor& out, const Tensor& in) {
  const std::string w = where("all_gather");
  expect_host(w, "output ", out);
  expect_host(w, "input ", in);
  expect_same_dtype(w, out, in);
  if (out.numel() != in.numel() * size_)
    fail(w, ": output '", out.name(), "' has ", out.numel(), " elements, input '", in.name(), "' ", in.numel(),
         "; the output must hold ", size_, " blocks of the input's size (", in.numel() * size_, ")");
  const int count = single_count(w, "block", in.numel());
  const MPI_Datatype type = word_type(in.dtype());
  // `in` exactly at block `rank` of `out`: MPI's in-place form. Any other overlap: staged.
  const bool in_place = in.nbytes() > 0 && static_cast<const char*>(in.raw()) ==
                                               static_cast<const char*>(out.raw()) + rank_ * in.nbytes();
  const bool staged = !in_place && overlap(out, in);
  auto q = std::make_unique<Op>();
  q->what = detail::concat(w, " of '", in.name(), "' into '", out.name(), "'");
  q->start = [out, in, count, type, in_place, staged, comm = comm_](Op& self) {
    Tensor src = staged ? in.clone(MemCategory::Workspace) : in;
    check_mpi(MPI_Allgather(in_place ? MPI_IN_PLACE : src.raw(), count, type, out.raw(), count, type, comm),
              self.what);
  };
  return engine().submit(std::move(q));
}

WorkHandle MpiCommunicator::all_to_all_async(const Tensor& out, std::span<const int64_t> out_counts,
                                             const Tensor& in, std::span<const int64_t> in_counts) {
  const std::string w = where("all_to_all");
  expect_host(w, "output ", out);
  expect_host(w, "input ", in);
  expect_same_dtype(w, out, in);
  // Counts and displacements as MPI's ints, each total checked against the limit (so every
  // displacement fits too).
  auto to_ints = [&](std::span<const int64_t> counts, const Tensor& t, const char* which, std::vector<int>& c,
                     std::vector<int>& d) {
    if (static_cast<int64_t>(counts.size()) != size_)
      fail(w, ": ", counts.size(), " ", which, " counts for a group of ", size_);
    int64_t total = 0;
    for (size_t p = 0; p < counts.size(); ++p) {
      if (counts[p] < 0) fail(w, ": ", which, " count for rank ", p, " is negative (", counts[p], ")");
      if (counts[p] > g_max_count.load())
        fail(w, ": ", which, " count for rank ", p, " of ", counts[p], " elements exceeds the ", g_max_count.load(),
             " elements one MPI call can move (MPI counts are int)");
      total += counts[p];
    }
    if (total != t.numel())
      fail(w, ": ", which, " counts sum to ", total, " but tensor '", t.name(), "' has ", t.numel(), " elements");
    if (total > g_max_count.load())
      fail(w, ": ", which, " total of ", total, " elements exceeds the ", g_max_count.load(),
           " elements MPI's int displacements address; split the exchange");
    int64_t off = 0;
    for (int64_t n : counts) {
      c.push_back(static_cast<int>(n));
      d.push_back(static_cast<int>(off));
      off += n;
    }
  };
  std::vector<int> scounts, sdispls, rcounts, rdispls;
  to_ints(in_counts, in, "input", scounts, sdispls);
  to_ints(out_counts, out, "output", rcounts, rdispls);
  const MPI_Datatype type = word_type(in.dtype());
  auto q = std::make_unique<Op>();
  q->what = detail::concat(w, " of '", in.name(), "' into '", out.name(), "'");
  q->start = [out, in, type, scounts = std::move(scounts), sdispls = std::move(sdispls),
              rcounts = std::move(rcounts), rdispls = std::move(rdispls), staged = overlap(out, in),
              comm = comm_](Op& self) {
    Tensor src = staged ? in.clone(MemCategory::Workspace) : in;
    check_mpi(MPI_Alltoallv(src.raw(), scounts.data(), sdispls.data(), type, out.raw(), rcounts.data(),
                            rdispls.data(), type, comm),
              self.what);
  };
  return engine().submit(std::move(q));
}

WorkHandle MpiCommunicator::broadcast_async(const Tensor& t, int root) {
  const std::string w = where("broadcast");
  expect_host(w, "", t);
  if (root < 0 || root >= size_) fail(w, ": root ", root, " is not a rank of the group");
  const MPI_Datatype type = word_type(t.dtype());
  auto q = std::make_unique<Op>();
  q->what = detail::concat(w, " of '", t.name(), "' from rank ", root);
  q->start = [t, type, root, comm = comm_](Op& self) {
    char* p = static_cast<char*>(t.raw());
    const size_t es = dtype_size(t.dtype());
    in_chunks(t.numel(), [&](int64_t off, int n) {
      check_mpi(MPI_Bcast(p + off * es, n, type, root, comm), self.what);
    });
  };
  return engine().submit(std::move(q));
}

namespace {
void check_peer(const std::string& w, int peer, int tag, int rank, int size, int tag_ub) {
  if (peer < 0 || peer >= size) fail(w, ": peer ", peer, " is not a rank of the group");
  if (peer == rank) fail(w, ": peer ", peer, " is this rank (no self send / recv)");
  if (tag < 0 || tag > tag_ub) fail(w, ": tag ", tag, " outside MPI's [0, ", tag_ub, "]");
}
}  // namespace

WorkHandle MpiCommunicator::send_async(const Tensor& t, int peer, int tag) {
  const std::string w = where("send");
  expect_host(w, "", t);
  check_peer(w, peer, tag, rank_, size_, engine().tag_ub());
  const MPI_Datatype type = word_type(t.dtype());
  auto q = std::make_unique<Op>();
  q->what = detail::concat(w, " of '", t.name(), "' to rank ", peer, " (tag ", tag, ")");
  q->start = [t, type, peer, tag, comm = comm_](Op& self) {
    char* p = static_cast<char*>(t.raw());
    const size_t es = dtype_size(t.dtype());
    in_chunks(t.numel(), [&](int64_t off, int n) {
      self.requests.push_back(MPI_REQUEST_NULL);
      check_mpi(MPI_Isend(p + off * es, n, type, peer, tag, comm, &self.requests.back()), self.what);
    });
  };
  return engine().submit(std::move(q));
}

WorkHandle MpiCommunicator::recv_async(const Tensor& t, int peer, int tag) {
  const std::string w = where("recv");
  expect_host(w, "", t);
  check_peer(w, peer, tag, rank_, size_, engine().tag_ub());
  const MPI_Datatype type = word_type(t.dtype());
  auto q = std::make_unique<Op>();
  q->what = detail::concat(w, " of '", t.name(), "' from rank ", peer, " (tag ", tag, ")");
  auto expected = std::make_shared<std::vector<int>>();
  q->start = [t, type, peer, tag, expected, comm = comm_](Op& self) {
    char* p = static_cast<char*>(t.raw());
    const size_t es = dtype_size(t.dtype());
    in_chunks(t.numel(), [&](int64_t off, int n) {
      expected->push_back(n);
      self.requests.push_back(MPI_REQUEST_NULL);
      check_mpi(MPI_Irecv(p + off * es, n, type, peer, tag, comm, &self.requests.back()), self.what);
    });
  };
  // A shorter message than the tensor is an error, not a partly filled tensor.
  q->finish = [type, expected, numel = t.numel()](Op& self) {
    for (size_t i = 0; i < self.statuses.size(); ++i) {
      int got = 0;
      check_mpi(MPI_Get_count(&self.statuses[i], type, &got), self.what);
      if (got != (*expected)[i])
        fail(self.what, ": received ", got, " elements where the tensor expects ", (*expected)[i],
             self.statuses.size() > 1 ? " (in one of its pieces)" : "", "; the sender's tensor has another size");
    }
  };
  return engine().submit(std::move(q));
}

void MpiCommunicator::barrier() {
  engine().run_blocking(where("barrier"), [comm = comm_](Op& self) { check_mpi(MPI_Barrier(comm), self.what); });
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key, const std::string& name) {
  const std::string w = where("split");
  if (color < 0) fail(w, " into '", name, "': color ", color, " is negative");
  MPI_Comm out = MPI_COMM_NULL;
  engine().run_blocking(detail::concat(w, " into '", name, "' (color ", color, ", key ", key, ")"),
                        [&out, color, key, comm = comm_](Op& self) {
                          check_mpi(MPI_Comm_split(comm, color, key, &out), self.what);
                        });
  return std::make_unique<MpiCommunicator>(out, name, /*owned=*/true);
}

// ---------------------------------------------------------------------------------------------
// The process's world.

namespace {
// An environment variable as a positive int, or -1.
int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < 0 || n > INT_MAX) return -1;
  return static_cast<int>(n);
}

bool has_env(const char* name) { return std::getenv(name) != nullptr; }

// The job's size from the launcher's environment (OpenMPI's mpirun, MPICH / Intel hydra, srun with
// PMI-2 or PMIx), or -1 when not launched by one.
int launched_size() {
  if (int n = env_int("OMPI_COMM_WORLD_SIZE"); n >= 0) return n;
  if (int n = env_int("PMI_SIZE"); n >= 0) return n;
  // srun sets SLURM_NTASKS for every job step; it counts only with a PMI interface to MPI.
  if (has_env("PMIX_RANK") || has_env("PMI_RANK") || has_env("PMI_FD")) {
    if (int n = env_int("SLURM_NTASKS"); n >= 0) return n;
    if (int n = env_int("PMIX_SIZE"); n >= 0) return n;
  }
  return -1;
}
}  // namespace

bool launched_distributed() { return launched_size() > 1; }

int launched_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (int r = env_int(name); r >= 0 && launched_distributed()) return r;
  return 0;
}

Communicator& world() {
  static Communicator* const w = []() -> Communicator* {
    if (!launched_distributed()) return new LocalCommunicator("world");
    ProgressEngine::start();
    return new MpiCommunicator(MPI_COMM_WORLD, "world", /*owned=*/false);
  }();
  return *w;
}

void abort_job(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (ProgressEngine::running()) {
    // Not through the queue: the progress thread may be blocked in a collective that the failed
    // rank will never join. MPI_Abort ends every rank of the job.
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }
  // MPI never started here (the error came first): exiting non-zero makes mpirun end the others.
  std::exit(code);
}

}  // namespace megaton::parallel
