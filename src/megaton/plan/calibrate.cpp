#include "megaton/plan/calibrate.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <map>

#include "megaton/core/cpu_info.h"
#include "megaton/core/threads.h"
#include "megaton/kernels/activation.h"
#include "megaton/kernels/attention.h"
#include "megaton/kernels/cpu/gemm.h"
#include "megaton/kernels/cross_entropy.h"
#include "megaton/kernels/embedding.h"
#include "megaton/kernels/linear.h"
#include "megaton/kernels/norm.h"
#include "megaton/kernels/rope.h"
#include "megaton/nn/param_and_grad_buffer.h"
#include "megaton/optim/adamw.h"
#include "megaton/plan/op_counts.h"

namespace megaton::plan {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Timed samples per figure, after one warm-up sample (first touch of the outputs, oneDNN's
// primitive for the shape, caches).
constexpr int kMinRepeats = 3;

// Which sample of repeated calls a figure takes.
enum class Pick {
  // The median: the planner predicts the steps a run takes, and a training step's kernels run at
  // their typical speed, not at the luckiest sample's (the best samples' GEMM rates were ~10% above
  // what the same shapes reached inside training steps, measured with `megaton bench --gemm-shapes`).
  Median,
  // The fastest: for a floor (the fixed cost of a call), where a slower sample measures a timer tick
  // or a thread woken late, not the call.
  Fastest,
};

// Seconds per call of f over samples of `calls` calls each: at least kMinRepeats samples, more while
// less than target_s has passed (the first call warms up and is not counted).
template <typename F>
double sample_seconds(F&& f, double target_s, int calls = 1, Pick pick = Pick::Median) {
  std::vector<double> samples;
  const Clock::time_point start = Clock::now();
  for (int r = 0; r <= kMinRepeats || seconds_since(start) < target_s; ++r) {
    const Clock::time_point t0 = Clock::now();
    for (int c = 0; c < calls; ++c) f();
    if (r > 0) samples.push_back(seconds_since(t0) / calls);
  }
  if (pick == Pick::Fastest) return *std::min_element(samples.begin(), samples.end());
  std::nth_element(samples.begin(), samples.begin() + static_cast<std::ptrdiff_t>(samples.size() / 2), samples.end());
  return samples[samples.size() / 2];
}

// The part of the budget_s calibrate_device spends (calibrate_network the rest).
constexpr double kDeviceShare = 0.9;
// Shares of what the fixed-size measurements leave to the ones that take as many points as time
// allows: the GEMMs decide most of a step, so their grid gets the most.
constexpr double kPeakShare = 0.2, kGridShare = 0.55, kAttentionShare = 0.25;

// Deadlines of consecutive sections of a time budget; time a section leaves unused carries over.
class Budget {
 public:
  explicit Budget(double seconds) : start_(Clock::now()), seconds_(seconds) {}
  Clock::time_point next_section(double share) {
    used_ += share;
    return start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds_ * used_));
  }

 private:
  Clock::time_point start_;
  double seconds_;
  double used_ = 0;
};

// Runs measure(item) (which returns the FLOP/s it reached) over items ordered cheapest first, while
// the next one, at the last one's rate, would finish its kMinRepeats + 1 calls before the deadline.
// The first item always runs, so every table gets a point.
template <typename Item, typename Flops, typename Measure>
void measure_until(const std::vector<Item>& items, Clock::time_point deadline, Flops flops, Measure measure) {
  double rate = 0;
  for (const Item& item : items) {
    const double predicted_s = rate > 0 ? (kMinRepeats + 1) * flops(item) / rate : 0;
    if (rate > 0 && Clock::now() + std::chrono::duration<double>(predicted_s) > deadline) break;
    rate = measure(item);
  }
}

// What `quick` shrinks: the shapes and sizes, and how long each figure is sampled.
struct Sizes {
  double target_s;               // per figure
  double cold_bytes;             // the operand copies of a GEMM or attention point span (cold_operand_copies)
  std::vector<int64_t> squares;  // n of the n x n x n GEMMs that look for the peak
  std::vector<int64_t> grid_m, grid_nk;
  std::vector<int64_t> attention_seq, attention_head_dim;
  int64_t memory_elements;  // the largest tensor of each memory-bound op: past the caches when full
  int64_t vocab;            // embedding and cross-entropy
};

Sizes sizes_for(bool quick) {
  if (quick) return {2e-3, 4.0 * (1 << 20), {256, 512}, {128, 512}, {64, 256}, {128, 256}, {64}, int64_t{1} << 16, 512};
  return {2e-2,
          kColdOperandBytes,
          {512, 1024, 2048, 4096, 8192},
          {128, 512, 2048, 8192, 16384},
          {8, 24, 64, 256, 1024, 4096, 8192},  // from a router's n (experts) and MLA's small ranks up
          {128, 256, 512, 1024, 2048, 4096},   // small models train at short sequences and small heads:
          {16, 32, 64, 128},                   // their attention is far from the large shapes' efficiency
          int64_t{1} << 25,
          32768};
}

// The hidden size of the memory-bound ops' rows (their rate hardly depends on it).
constexpr int64_t kHidden = 2048;

constexpr double kF32 = sizeof(float);

// Fills an f32 tensor with values in [-1, 1) from a hash of (seed, index): never constants or zeros
// (those can run faster than real data), and cheap enough for operands of a gigabyte.
void fill_random(const Tensor& t, uint64_t seed) {
  float* p = t.data<float>();
  const int64_t n = t.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    // splitmix64's output function; its top 24 bits scaled to [-1, 1).
    uint64_t z = (seed << 40) + static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    p[i] = static_cast<float>(static_cast<double>((z ^ (z >> 31)) >> 40) / double(1 << 23) - 1.0);
  }
}

Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed, const char* name) {
  Tensor t = Tensor::empty(shape, DType::F32, MemCategory::Workspace, name);
  fill_random(t, seed);
  if (dtype == DType::F32) return t;
  Tensor converted = t.to(dtype, MemCategory::Workspace);
  converted.set_name(name);
  return converted;
}

// Token ids (or targets) < `vocab`, spread over the table.
Tensor spread_ids(int64_t count, int64_t vocab, const char* name) {
  Tensor t = Tensor::empty({count}, DType::I32, MemCategory::Workspace, name);
  for (int64_t i = 0; i < count; ++i) t.data<int32_t>()[i] = static_cast<int32_t>((i * 7919) % vocab);
  return t;
}

Tensor workspace(const Shape& shape, const char* name) {
  return Tensor::zeros(shape, DType::F32, MemCategory::Workspace, name);
}

// The planner's dtype names, checked: the CPU GEMMs take f32, bf16 and fp16; attention's table is
// f32's, so f32 must be among them.
DType gemm_dtype(const std::string& name) {
  if (name == "f32") return DType::F32;
  if (name == "bf16") return DType::BF16;
  if (name == "fp16") return DType::F16;
  fail("calibrate: GEMM dtype '", name, "' is not one of f32, bf16, fp16");
}

void check_dtypes(const std::vector<std::string>& dtypes) {
  for (const std::string& d : dtypes) gemm_dtype(d);
  if (std::find(dtypes.begin(), dtypes.end(), "f32") == dtypes.end())
    fail("calibrate: the dtypes must include f32 (attention runs in f32, against the f32 peak)");
}

// ---- GEMMs

struct GemmShape {
  int64_t m, n, k;
  double flops() const { return gemm_flops(double(m), double(n), double(k)); }
};

// Copies of a kernel's operands spanning z.cold_bytes (cold_operand_copies), each made by
// make(seed) with seeds apart by 2 between copies, taken in turn: each call finds the ones it reads
// out of the caches.
template <typename T>
class OperandCycle {
 public:
  template <typename Make>
  OperandCycle(double bytes_per_copy, const Sizes& z, Make make) {
    for (int64_t c = 0, n = cold_operand_copies(bytes_per_copy, z.cold_bytes); c < n; ++c)
      copies_.push_back(make(2 * static_cast<uint64_t>(c)));
  }
  const T& next() { return copies_[next_++ % copies_.size()]; }
  const std::vector<T>& all() const { return copies_; }

 private:
  std::vector<T> copies_;
  size_t next_ = 0;
};

// FLOP/s of out[m, n] = x[m, k] w[n, k]^T through kernels::linear_forward, the dispatch training
// runs, on cold operands.
double gemm_rate(DType dtype, const GemmShape& s, const Sizes& z) {
  struct Operands {
    Tensor x, w, y;
  };
  const double bytes = double(s.m * s.k + s.n * s.k + s.m * s.n) * double(dtype_size(dtype));
  OperandCycle<Operands> operands(bytes, z, [&](uint64_t seed) {
    return Operands{random_tensor({s.m, s.k}, dtype, seed + 1, "calibrate.x"),
                    random_tensor({s.n, s.k}, dtype, seed + 2, "calibrate.w"),
                    Tensor::empty({s.m, s.n}, dtype, MemCategory::Workspace, "calibrate.y")};
  });
  return s.flops() / sample_seconds(
                         [&] {
                           const Operands& o = operands.next();
                           kernels::linear_forward({}, o.y, o.x, o.w, Tensor{});
                         },
                         z.target_s);
}

std::vector<GemmShape> square_shapes(const Sizes& z) {
  std::vector<GemmShape> shapes;
  for (int64_t n : z.squares) shapes.push_back({n, n, n});
  return shapes;
}

std::vector<GemmShape> grid_shapes(const Sizes& z) {
  std::vector<GemmShape> shapes;
  for (int64_t m : z.grid_m)
    for (int64_t n : z.grid_nk)
      for (int64_t k : z.grid_nk) shapes.push_back({m, n, k});
  std::stable_sort(shapes.begin(), shapes.end(),
                   [](const GemmShape& a, const GemmShape& b) { return a.flops() < b.flops(); });
  return shapes;
}

struct GemmRate {
  std::string dtype;
  GemmShape shape;
  double flops_per_s;
};

// The squares (the peak's candidates) then the grid, each within its deadline.
void time_gemms(const std::string& dtype, const Sizes& z, Budget& budget, double share, std::vector<GemmRate>& rates) {
  const auto flops = [](const GemmShape& s) { return s.flops(); };
  const auto measure = [&](const GemmShape& s) {
    rates.push_back({dtype, s, gemm_rate(gemm_dtype(dtype), s, z)});
    return rates.back().flops_per_s;
  };
  measure_until(square_shapes(z), budget.next_section(kPeakShare * share), flops, measure);
  measure_until(grid_shapes(z), budget.next_section(kGridShare * share), flops, measure);
}

// ---- attention

struct AttentionShape {
  int64_t seq, head_dim;
  double flops(bool backward) const {
    return attention_flops(double(seq), double(head_dim), double(head_dim), backward);
  }
};

// FLOP/s of the forward and the backward kernels at one shape, all heads together.
struct AttentionRate {
  AttentionShape shape;
  double forward, backward;
};

// Forward and backward of `heads` heads of one sequence, q, k and v in place in a fused QKV tensor
// as nn/attention.cpp lays them out (Megatron's [q | k | v] block per head here: Hq = Hkv), on cold
// operands.
AttentionRate attention_rate(const AttentionShape& a, int64_t heads, const Sizes& z) {
  const int64_t T = a.seq, D = a.head_dim, qkv_size = 3 * heads * D;
  struct Operands {
    Tensor qkv, dout, out, lse, dqkv;
  };
  const double bytes = kF32 * double(T) * double(3 * qkv_size + 2 * heads * D + heads);
  OperandCycle<Operands> operands(bytes, z, [&](uint64_t seed) {
    return Operands{random_tensor({T, qkv_size}, DType::F32, seed + 3, "calibrate.qkv"),
                    random_tensor({T, heads * D}, DType::F32, seed + 4, "calibrate.dout"),
                    workspace({T, heads * D}, "calibrate.out"), workspace({1, heads, T}, "calibrate.lse"),
                    workspace({T, qkv_size}, "calibrate.dqkv")};
  });
  const kernels::HeadStrides at{qkv_size, 3 * D};
  const double scale = 1.0 / std::sqrt(double(D));
  const kernels::ExecContext ctx;
  const auto forward = [&](const Operands& o) {
    kernels::attention_forward(ctx, o.out, o.lse, o.qkv, {o.qkv, D}, {o.qkv, 2 * D}, 1, T, heads, heads, D, at, at,
                               scale);
  };
  const double forward_s = sample_seconds([&] { forward(operands.next()); }, z.target_s);
  for (const Operands& o : operands.all()) forward(o);  // every copy's out and lse, as the backward reads them
  const double backward_s = sample_seconds(
      [&] {
        const Operands& o = operands.next();
        kernels::attention_backward(ctx, o.dqkv, {o.dqkv, D}, {o.dqkv, 2 * D}, o.dout, o.out, o.lse, o.qkv, {o.qkv, D},
                                    {o.qkv, 2 * D}, 1, T, heads, heads, D, at, at, scale);
      },
      z.target_s);
  return {a, double(heads) * a.flops(false) / forward_s, double(heads) * a.flops(true) / backward_s};
}

// One head per thread: the kernel runs a (sequence, head) pair per thread, as a training step with
// at least that many pairs does.
std::vector<AttentionRate> time_attention(const Sizes& z, Clock::time_point deadline) {
  std::vector<AttentionShape> shapes;
  for (int64_t seq : z.attention_seq)
    for (int64_t d : z.attention_head_dim) shapes.push_back({seq, d});
  const int64_t heads = num_threads();
  const auto flops = [&](const AttentionShape& a) { return double(heads) * (a.flops(false) + a.flops(true)); };
  std::stable_sort(shapes.begin(), shapes.end(),
                   [&](const AttentionShape& a, const AttentionShape& b) { return flops(a) < flops(b); });
  std::vector<AttentionRate> rates;
  measure_until(shapes, deadline, flops, [&](const AttentionShape& a) {
    rates.push_back(attention_rate(a, heads, z));
    const AttentionRate& r = rates.back();
    const double seconds = double(heads) * (a.flops(false) / r.forward + a.flops(true) / r.backward);
    return flops(a) / seconds;
  });
  return rates;
}

// ---- peaks

// The peak of each dtype is the best FLOP rate measured in it, so it bounds every point: a ceiling
// some kernel beat would not be one. f32's counts the attention kernels too: hand-vectorised for the
// build's target, they can beat a BLAS without kernels for the CPU (on a Zen 5, OpenBLAS's sgemm
// reached 110 GFLOP/s a core and flash attention 122).
void add_compute_tables(SystemSpec& s, const std::vector<GemmRate>& gemms,
                        const std::vector<AttentionRate>& attention) {
  for (const GemmRate& r : gemms) s.peak_flops[r.dtype] = std::max(s.peak_flops[r.dtype], r.flops_per_s);
  for (const AttentionRate& a : attention) s.peak_flops["f32"] = std::max({s.peak_flops["f32"], a.forward, a.backward});
  for (const GemmRate& r : gemms) {
    s.gemm.push_back({r.dtype, r.shape.m, r.shape.n, r.shape.k, r.flops_per_s / s.peak(r.dtype)});
    // Every GEMM call pays the fixed cost and does some work besides: a cost sampled above half the
    // fastest GEMM's time came from a neighbour's load during the tiny calls, not from the engine.
    s.op_overhead_s = std::min(s.op_overhead_s, 0.5 * r.shape.flops() / r.flops_per_s);
  }
  for (const AttentionRate& a : attention)
    s.attention.push_back(
        {"f32", a.shape.seq, a.shape.head_dim, a.forward / s.peak("f32"), a.backward / s.peak("f32")});
}

// ---- memory

// STREAM's copy (a = b) and triad (a = b + s c), and an in-place update (a += s b), with the
// current threads, in bytes per second as STREAM and op_counts.h count them (each array read or
// written once). The update moves no more than it counts, whereas copy and triad also read each
// written line first (write-allocate), so it shows what in-place ops (RoPE, AdamW) get. Static
// schedules: every thread touches the same pages when filling and when timed.
struct StreamRates {
  double copy, triad, update;
  double best() const { return std::max({copy, triad, update}); }
  StreamRates max(const StreamRates& o) const {
    return {std::max(copy, o.copy), std::max(triad, o.triad), std::max(update, o.update)};
  }
};

StreamRates stream_rates(int64_t n, double target_s) {
  const Tensor ta = workspace({n}, "calibrate.a"), tb = workspace({n}, "calibrate.b"),
               tc = workspace({n}, "calibrate.c");
  float *a = ta.data<float>(), *b = tb.data<float>(), *c = tc.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] = c[i] = 1.0f;
  const auto rate = [&](double arrays, auto&& loop) {
    return arrays * double(n) * sizeof(float) / sample_seconds(loop, target_s);
  };
  return {rate(2,
               [&] {
#pragma omp parallel for schedule(static)
                 for (int64_t i = 0; i < n; ++i) a[i] = b[i];
               }),
          rate(3,
               [&] {
#pragma omp parallel for schedule(static)
                 for (int64_t i = 0; i < n; ++i) a[i] = b[i] + 0.5f * c[i];
               }),
          rate(3, [&] {
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < n; ++i) a[i] += 0.5f * b[i];
          })};
}

// One kind of memory-bound op: op_counts.h's bytes and the measured seconds, summed over the
// kernels that make it up.
struct Traffic {
  double bytes = 0, seconds = 0;
  template <typename F>
  void time(double counted_bytes, F&& f, double target_s) {
    bytes += counted_bytes;
    seconds += sample_seconds(f, target_s);
  }
  double rate() const { return bytes / seconds; }
};

constexpr double kEps = 1e-5;

// LayerNorm and RMSNorm; backward is the input and the weight gradient, which training runs together.
Traffic norm_traffic(const Sizes& z) {
  const int64_t rows = z.memory_elements / kHidden;
  const Tensor x = random_tensor({rows, kHidden}, DType::F32, 5, "calibrate.x");
  const Tensor dy = random_tensor({rows, kHidden}, DType::F32, 6, "calibrate.dy");
  const Tensor y = workspace({rows, kHidden}, "calibrate.y"), dx = workspace({rows, kHidden}, "calibrate.dx");
  const Tensor w = random_tensor({kHidden}, DType::F32, 7, "calibrate.w"), bias = workspace({kHidden}, "calibrate.b");
  const Tensor dw = workspace({kHidden}, "calibrate.dw"), db = workspace({kHidden}, "calibrate.db");
  const Tensor mean = workspace({rows}, "calibrate.mean"), rstd = workspace({rows}, "calibrate.rstd");
  const kernels::ExecContext ctx;
  const double r = double(rows), c = double(kHidden);
  Traffic t;
  t.time(
      norm_bytes(r, c, kF32, false), [&] { kernels::layernorm_forward(ctx, y, mean, rstd, x, w, bias, kEps); },
      z.target_s);
  t.time(
      norm_bytes(r, c, kF32, true),
      [&] {
        kernels::layernorm_backward_input(ctx, dx, dy, x, w, mean, rstd);
        kernels::layernorm_backward_weight(ctx, dw, db, dy, x, mean, rstd);
      },
      z.target_s);
  t.time(
      norm_bytes(r, c, kF32, false), [&] { kernels::rmsnorm_forward(ctx, y, rstd, x, w, kEps); }, z.target_s);
  t.time(
      norm_bytes(r, c, kF32, true),
      [&] {
        kernels::rmsnorm_backward_input(ctx, dx, dy, x, w, rstd);
        kernels::rmsnorm_backward_weight(ctx, dw, dy, x, rstd);
      },
      z.target_s);
  return t;
}

// GeLU over [rows, kHidden] and SwiGLU from [rows, 2 kHidden] to [rows, kHidden].
Traffic activation_traffic(const Sizes& z) {
  const int64_t rows = z.memory_elements / (2 * kHidden);
  const Tensor h = random_tensor({rows, 2 * kHidden}, DType::F32, 8, "calibrate.h");
  const Tensor dh = workspace({rows, 2 * kHidden}, "calibrate.dh");
  const Tensor da = random_tensor({rows, kHidden}, DType::F32, 9, "calibrate.da");
  const Tensor a = workspace({rows, kHidden}, "calibrate.a");
  const Tensor h1 = h.window(0, {rows, kHidden}, "calibrate.h1"), dh1 = dh.window(0, {rows, kHidden}, "calibrate.dh1");
  const kernels::ExecContext ctx;
  const double r = double(rows), c = double(kHidden);
  Traffic t;
  t.time(
      activation_bytes(r, c, kF32, false, false), [&] { kernels::gelu_forward(ctx, a, h1); }, z.target_s);
  t.time(
      activation_bytes(r, c, kF32, false, true), [&] { kernels::gelu_backward(ctx, dh1, da, h1); }, z.target_s);
  t.time(
      activation_bytes(r, c, kF32, true, false), [&] { kernels::swiglu_forward(ctx, a, h); }, z.target_s);
  t.time(
      activation_bytes(r, c, kF32, true, true), [&] { kernels::swiglu_backward(ctx, dh, da, h); }, z.target_s);
  return t;
}

// The residual add.
Traffic elementwise_traffic(const Sizes& z) {
  const int64_t n = z.memory_elements;
  const Tensor a = random_tensor({n}, DType::F32, 10, "calibrate.a"),
               b = random_tensor({n}, DType::F32, 11, "calibrate.b");
  const Tensor out = workspace({n}, "calibrate.out");
  Traffic t;
  t.time(
      elementwise_bytes(double(n), kF32), [&] { kernels::residual_forward({}, out, a, b); }, z.target_s);
  return t;
}

// Token embedding lookup of rows spread over a z.vocab-row table, and its gradient.
Traffic embedding_traffic(const Sizes& z) {
  const int64_t rows = z.memory_elements / kHidden;
  const Tensor tokens = spread_ids(rows, z.vocab, "calibrate.tokens").view({1, rows});
  const Tensor wte = random_tensor({z.vocab, kHidden}, DType::F32, 12, "calibrate.wte");
  const Tensor dwte = workspace({z.vocab, kHidden}, "calibrate.dwte");
  const Tensor out = workspace({rows, kHidden}, "calibrate.out");
  const Tensor dout = random_tensor({rows, kHidden}, DType::F32, 13, "calibrate.dout");
  const double r = double(rows), c = double(kHidden);
  Traffic t;
  t.time(
      embedding_bytes(r, c, kF32, false), [&] { kernels::embedding_forward({}, out, tokens, wte, Tensor{}); },
      z.target_s);
  t.time(
      embedding_bytes(r, c, kF32, true), [&] { kernels::embedding_backward({}, dwte, Tensor{}, dout, tokens); },
      z.target_s);
  return t;
}

// The forward's three kernels and the backward over [rows, z.vocab] logits.
Traffic cross_entropy_traffic(const Sizes& z) {
  const int64_t rows = z.memory_elements / z.vocab;
  const Tensor logits = random_tensor({rows, z.vocab}, DType::F32, 14, "calibrate.logits");
  const Tensor dlogits = workspace({rows, z.vocab}, "calibrate.dlogits");
  const Tensor targets = spread_ids(rows, z.vocab, "calibrate.targets");
  const Tensor row_max = workspace({rows}, "calibrate.row_max"), sum_exp = workspace({rows}, "calibrate.sum_exp");
  const Tensor target_logit = workspace({rows}, "calibrate.target_logit"), loss = workspace({rows}, "calibrate.loss");
  const Tensor lse = workspace({rows}, "calibrate.lse");
  const kernels::ExecContext ctx;
  const double bytes = cross_entropy_bytes(double(rows), double(z.vocab), kF32, false);
  Traffic t;
  t.time(
      bytes,
      [&] {
        kernels::cross_entropy_row_max(ctx, row_max, logits);
        kernels::cross_entropy_sum_exp(ctx, sum_exp, target_logit, logits, row_max, targets, 0);
        kernels::cross_entropy_loss(ctx, loss, lse, row_max, sum_exp, target_logit, targets);
      },
      z.target_s);
  t.time(
      cross_entropy_bytes(double(rows), double(z.vocab), kF32, true),
      [&] { kernels::cross_entropy_backward(ctx, dlogits, logits, lse, targets, 0, 1.0); }, z.target_s);
  return t;
}

// RoPE over kHidden / 128 heads of 128 per token, in place, forward and inverse (backward).
Traffic rope_traffic(const Sizes& z) {
  constexpr int64_t D = 128, H = kHidden / D;
  const int64_t rows = z.memory_elements / kHidden;
  const Tensor x = random_tensor({rows, kHidden}, DType::F32, 15, "calibrate.x");
  const Tensor cos = workspace({rows, D / 2}, "calibrate.cos"), sin = workspace({rows, D / 2}, "calibrate.sin");
  const kernels::ExecContext ctx;
  kernels::rope_tables(ctx, cos, sin, kernels::rope_inv_freq(D, 10000.0, {}));
  const double bytes = rope_bytes(double(rows), double(kHidden), kF32);
  Traffic t;
  for (bool inverse : {false, true})
    t.time(
        bytes,
        [&] {
          kernels::rope_apply(ctx, x, cos, sin, 1, rows, 1, H, D, {kHidden, kHidden}, 0, kernels::RopeLayout::Half,
                              inverse);
        },
        z.target_s);
  return t;
}

// An AdamW step over one flat buffer of z.memory_elements parameters (f32 training: no compute copy).
Traffic optimizer_traffic(const Sizes& z) {
  nn::Parameter p("calibrate.weight", {z.memory_elements}, true);
  const nn::ParamAndGradBuffer buffer({&p}, 0);
  fill_random(buffer.grads(), 16);
  optim::AdamW adamw(buffer, {});
  Traffic t;
  t.time(
      optimizer_bytes(double(z.memory_elements), 0), [&] { adamw.step(1e-4); }, z.target_s);
  return t;
}

// The bandwidth and every MemoryOp's share of it; returns the STREAM rates for the description.
StreamRates add_memory_table(SystemSpec& s, const Sizes& z) {
  const StreamRates before = stream_rates(z.memory_elements, z.target_s);
  const std::map<MemoryOp, Traffic> traffic = {
      {MemoryOp::Norm, norm_traffic(z)},
      {MemoryOp::Activation, activation_traffic(z)},
      {MemoryOp::Elementwise, elementwise_traffic(z)},
      {MemoryOp::Embedding, embedding_traffic(z)},
      {MemoryOp::CrossEntropy, cross_entropy_traffic(z)},
      {MemoryOp::Rope, rope_traffic(z)},
      {MemoryOp::Optimizer, optimizer_traffic(z)},
  };
  // The bandwidth is the best rate measured, by op_counts.h's count, so it bounds every op as the
  // peak bounds every GEMM: STREAM before and after the ops (a shared machine's bandwidth drifts
  // with its neighbours' load), or a kernel that beat both.
  const StreamRates stream = before.max(stream_rates(z.memory_elements, z.target_s));
  s.memory_bandwidth_Bps = stream.best();
  for (const auto& [op, t] : traffic) s.memory_bandwidth_Bps = std::max(s.memory_bandwidth_Bps, t.rate());
  for (const auto& [op, t] : traffic) s.memory_efficiency[op] = t.rate() / s.memory_bandwidth_Bps;
  return stream;
}

// ---- fixed cost per op

// The mean of the fastest call of two tiny kernels: a 2-row GEMM (not the 1-row GEMV path) and a
// 1 x 1 LayerNorm, each sampled over batches of calls (one call lasts about a microsecond, too
// short to time alone).
double op_overhead_seconds(double target_s) {
  constexpr int kCalls = 100;
  const Tensor x = random_tensor({2, 8}, DType::F32, 17, "calibrate.x"),
               w = random_tensor({8, 8}, DType::F32, 18, "calibrate.w");
  const Tensor y = workspace({2, 8}, "calibrate.y");
  const Tensor v = random_tensor({1, 1}, DType::F32, 19, "calibrate.v"),
               one = random_tensor({1}, DType::F32, 20, "calibrate.one");
  const Tensor out = workspace({1, 1}, "calibrate.out"), mean = workspace({1}, "calibrate.mean"),
               rstd = workspace({1}, "calibrate.rstd");
  const double gemm_s =
      sample_seconds([&] { kernels::linear_forward({}, y, x, w, Tensor{}); }, target_s, kCalls, Pick::Fastest);
  const double norm_s = sample_seconds([&] { kernels::layernorm_forward({}, out, mean, rstd, v, one, one, kEps); },
                                       target_s, kCalls, Pick::Fastest);
  return (gemm_s + norm_s) / 2;
}

// ---- links

// A world of one measures no link. The fallback: a memory copy's rate (a shared-memory message is
// copied), efficiency 0.5 (Open MPI copies each message in and out of a shared buffer when the
// kernel's single-copy mechanism is unavailable, as in containers), 2 us per step (the order of an
// Open MPI shared-memory message's latency).
constexpr double kFallbackLatency_s = 2e-6, kFallbackEfficiency = 0.5;

LinkSpec fallback_link(const StreamRates& stream) {
  LinkSpec link{stream.copy / 2, kFallbackLatency_s, {}};  // STREAM counts a copied byte twice
  for (Collective c : kCollectives) link.efficiency[c] = kFallbackEfficiency;
  return link;
}

// Message sizes for the link fit: both sides of kSmallMessageBytes and kLargeMessageBytes.
std::vector<double> message_sizes(bool quick) {
  if (quick) return {4096, 65536, 1 << 20};
  return {4096, 16384, 65536, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26};
}

double physical_memory_bytes() { return double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE)); }

// Sets the thread count for the calibration and gives the caller's back afterwards.
class ThreadScope {
 public:
  explicit ThreadScope(int threads) : saved_(num_threads()) {
    if (threads > 0) set_num_threads(threads);
  }
  ~ThreadScope() { set_num_threads(saved_); }
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  int saved_;
};

template <typename... Args>
std::string format(const char* fmt, Args... args) {
  char buf[160];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

std::string device_description(const CalibrateOptions& o, const StreamRates& stream, const Sizes& z) {
  std::string libs;
  for (const std::string& d : o.dtypes)
    libs += (libs.empty() ? "" : ", ") + d + " on " +
            kernels::cpu::gemm_library_name(kernels::cpu::gemm_library(gemm_dtype(d)));
  const int threads = num_threads();
  return "Calibrated by `megaton plan calibrate` on " + describe(cpu_info()) + ", " + std::to_string(threads) +
         (threads == 1 ? " thread" : " threads") + " per device" +
         (o.quick ? " (quick: a few small points only)" : "") +
         ". peak_flops: the best rate a measured kernel of the dtype reached (GEMMs through kernels::linear_forward: " +
         libs + "; for f32 also the attention kernels), the machine's measured ceiling, not a datasheet figure." +
         " [[attention]]: the f32 flash-attention kernels, one head per thread, against the f32 peak (bf16 training"
         " runs them on an f32 copy)." +
         " memory: bandwidth_Bps = the best rate measured, STREAM copy, triad and an in-place a += s b" +
         format(" (%.1f, %.1f and %.1f GB/s", stream.copy / 1e9, stream.triad / 1e9, stream.update / 1e9) +
         format(" over %.3g MB arrays, before and after the ops) or a kernel's;",
                double(z.memory_elements) * kF32 / 1e6) +
         " [memory.efficiency]: the engine's f32 kernels, op_counts.h's bytes over time x bandwidth." +
         " op_overhead_s: the mean best call of a 2-row GEMM and a 1 x 1 LayerNorm (at most half the fastest GEMM's"
         " time).";
}

}  // namespace

int64_t cold_operand_copies(double bytes_per_copy, double cold_bytes) {
  MEGATON_CHECK(bytes_per_copy > 0, "cold_operand_copies: bytes per copy must be positive, not ", bytes_per_copy);
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(cold_bytes / bytes_per_copy)));
}

// busy_send_delay's message: a pipeline boundary's size (a few hundred rows of a hidden of 256 to 4096
// in f32), and a computation longer than the delays seen (2-6 ms on 2 oversubscribed cores).
constexpr double kBusySendBytes = 1 << 20;
constexpr double kBusySend_s = 0.02;
constexpr int kBusySendRepeats = 25, kBusySendRepeatsQuick = 3;

SystemSpec calibrate_device(const CalibrateOptions& o) {
  check_dtypes(o.dtypes);
  MEGATON_CHECK(o.budget_s > 0, "calibrate: budget_s ", o.budget_s, " is not positive");
  const ThreadScope threads(o.threads);
  const Clock::time_point start = Clock::now();
  const Sizes z = sizes_for(o.quick);
  SystemSpec s;
  s.name = "calibrated";
  s.source = "calibrated";
  s.memory_bytes = physical_memory_bytes();
  s.op_overhead_s = op_overhead_seconds(z.target_s);
  const StreamRates stream = add_memory_table(s, z);
  s.intra_node = s.inter_node = fallback_link(stream);
  // The fixed-size measurements are done; the rest of the device's budget goes to the tables that
  // take as many points as time allows.
  Budget budget(std::max(0.0, o.budget_s * kDeviceShare - seconds_since(start)));
  const double per_dtype = 1.0 / double(o.dtypes.size());
  std::vector<GemmRate> gemms;
  for (const std::string& d : o.dtypes) time_gemms(d, z, budget, per_dtype, gemms);
  add_compute_tables(s, gemms, time_attention(z, budget.next_section(kAttentionShare)));
  s.description = device_description(o, stream, z);
  return s;
}

void calibrate_network(SystemSpec& s, parallel::Communicator& world, const CalibrateOptions& o) {
  const int ranks = world.size();
  s.devices_per_node = ranks;
  s.memory_bytes = physical_memory_bytes() / ranks;
  if (ranks == 1) {
    s.description += " Links: not measured (a world of one process): intra_node = a memory copy's rate" +
                     format(" (%.1f GB/s), efficiency %.1f", s.intra_node.bandwidth_Bps / 1e9, kFallbackEfficiency) +
                     " (a shared-memory message copied in and out)" +
                     format(", latency %.0f us assumed.", kFallbackLatency_s * 1e6);
  } else {
    const std::vector<double> sizes = message_sizes(o.quick);
    // The network's share of the budget, spread over its samples (quick: the device's short samples).
    const double per_sample_s = o.quick
                                    ? sizes_for(true).target_s
                                    : o.budget_s * (1 - kDeviceShare) / double(sizes.size() * std::size(kCollectives));
    s.intra_node = fit_link(time_collectives(world, sizes, per_sample_s), ranks);
    const int busy_repeats = o.quick ? kBusySendRepeatsQuick : kBusySendRepeats;
    s.intra_node.busy_send_delay_s = busy_send_delay(
        busy_send_seconds(world, kBusySendBytes, kBusySend_s, busy_repeats), s.intra_node, kBusySendBytes);
    s.description += " Links: intra_node measured with " + std::to_string(ranks) +
                     " ranks on the communicator (all_reduce, all_gather, reduce_scatter, all_to_all and send / recv "
                     "ping-pong" +
                     format(" from %.0f KB to %.0f MB", sizes.front() / 1024, sizes.back() / (1 << 20)) +
                     "), fitted to collective_time: latency from the small messages, each collective's byte term "
                     "from the large ones, bandwidth_Bps = the fastest fitted rate (normally send_recv's)." +
                     format(
                         " busy_send_delay_s: a %.0f KB send whose sender computes for %.0f ms after posting it, "
                         "mean post-to-arrival of %.0f less the fitted send_recv time.",
                         kBusySendBytes / 1024, kBusySend_s * 1e3, double(busy_repeats));
  }
  s.inter_node = s.intra_node;
  s.description += " inter_node: not measured: one node (a copy of intra_node).";
}

std::string calibration_summary(const SystemSpec& s) {
  std::string out = "peak (the best rate measured):";
  for (const auto& [dtype, flops] : s.peak_flops) out += " " + dtype + format(" %.1f GFLOP/s", flops / 1e9);
  out +=
      format("\n[[gemm]] points: %.0f, [[attention]] points: %.0f", double(s.gemm.size()), double(s.attention.size()));
  out += format("\nmemory bandwidth: %.1f GB/s; efficiency", s.memory_bandwidth_Bps / 1e9);
  for (MemoryOp op : kMemoryOps)
    out += std::string(" ") + memory_op_name(op) + format(" %.2f", s.memory_efficiency.at(op));
  out += format("\nop overhead: %.2f us", s.op_overhead_s * 1e6);
  out += format("\nintra_node link: %.2f GB/s, latency %.2f us, busy-send delay %.2f us; efficiency",
                s.intra_node.bandwidth_Bps / 1e9, s.intra_node.latency_s * 1e6, s.intra_node.busy_send_delay_s * 1e6);
  for (Collective c : kCollectives)
    out += std::string(" ") + collective_name(c) + format(" %.2f", s.intra_node.efficiency.at(c));
  return out + "\n";
}

}  // namespace megaton::plan
