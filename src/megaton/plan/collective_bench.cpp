#include "megaton/plan/collective_bench.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <limits>
#include <map>

#include "megaton/core/error.h"
#include "megaton/plan/collective_cost.h"

namespace megaton::plan {

CollectiveTerms collective_terms(Collective c, int64_t ranks) {
  LinkSpec unit{1.0, 0.0, {}};
  for (Collective k : kCollectives) unit.efficiency[k] = 1.0;
  LinkSpec latency_only = unit;
  latency_only.latency_s = 1.0;
  return {collective_time(c, latency_only, ranks, 0.0), collective_time(c, unit, ranks, 1.0)};
}

namespace {

double weight(const CollectiveSample& s) { return 1.0 / (s.seconds * s.seconds); }

// A collective's byte term (seconds per byte = 1 / (bandwidth * efficiency)) as a function of the
// latency L: the weighted least-squares slope through its large messages once L's steps are taken
// off, slope(L) = alpha - beta * L.
struct ByteTerm {
  double alpha = 0, beta = 0;
  double at(double latency) const { return alpha - beta * latency; }
};

ByteTerm fit_byte_term(std::span<const CollectiveSample> samples, Collective c, int64_t ranks) {
  const CollectiveTerms t = collective_terms(c, ranks);
  double sxx = 0, sxt = 0, sx = 0;
  for (const CollectiveSample& s : samples) {
    if (s.collective != c || s.bytes < kLargeMessageBytes) continue;
    const double x = t.byte_factor * s.bytes, w = weight(s);
    sxx += w * x * x;
    sxt += w * x * s.seconds;
    sx += w * x;
  }
  if (sxx <= 0)
    fail("fit_link: no ", collective_name(c), " timing of a message of at least ", kLargeMessageBytes, " bytes");
  return {sxt / sxx, t.latency_steps * sx / sxx};
}

// The latency that, with every byte term following it, best fits the small messages: each residual
// is linear in L (L * (steps - x * beta) + x * alpha - seconds), so the least squares are closed form.
double fit_latency(std::span<const CollectiveSample> samples, const std::map<Collective, ByteTerm>& terms,
                   int64_t ranks) {
  double spp = 0, spq = 0;
  for (const CollectiveSample& s : samples) {
    if (s.bytes > kSmallMessageBytes) continue;
    const CollectiveTerms t = collective_terms(s.collective, ranks);
    const ByteTerm& b = terms.at(s.collective);
    const double x = t.byte_factor * s.bytes, w = weight(s);
    const double p = t.latency_steps - x * b.beta, q = x * b.alpha - s.seconds;
    spp += w * p * p;
    spq += w * p * q;
  }
  if (spp <= 0) fail("fit_link: no timing of a message of at most ", kSmallMessageBytes, " bytes");
  return std::max(0.0, -spq / spp);  // noise can push a tiny latency below zero
}

}  // namespace

LinkSpec fit_link(std::span<const CollectiveSample> samples, int64_t ranks) {
  MEGATON_CHECK(ranks >= 2, "fit_link needs a group of at least 2 ranks, not ", ranks);
  std::map<Collective, ByteTerm> terms;
  for (Collective c : kCollectives) terms[c] = fit_byte_term(samples, c, ranks);
  LinkSpec link;
  link.latency_s = fit_latency(samples, terms, ranks);
  std::map<Collective, double> rate;  // bytes per second: bandwidth * efficiency
  for (Collective c : kCollectives) {
    const double seconds_per_byte = terms.at(c).at(link.latency_s);
    if (seconds_per_byte <= 0) fail("fit_link: the ", collective_name(c), " timings do not grow with the message size");
    rate[c] = 1.0 / seconds_per_byte;
    link.bandwidth_Bps = std::max(link.bandwidth_Bps, rate[c]);
  }
  for (Collective c : kCollectives) link.efficiency[c] = rate[c] / link.bandwidth_Bps;
  return link;
}

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kBatches = 3;      // a sample is the best batch: the slower ones met the neighbours
constexpr int kMaxCalls = 1000;  // per batch, for the smallest messages

// One call of collective c over `elems` f32 elements (the counted tensor) on this rank; the buffers
// are made once and captured. Zeros: reductions of arbitrary bits could hit slow denormals.
std::function<void()> collective_call(parallel::Communicator& comm, Collective c, int64_t elems) {
  const int64_t n = comm.size(), block = elems / n;
  const Tensor whole = Tensor::zeros({elems}, DType::F32, MemCategory::Workspace, "calibrate.whole");
  const Tensor part = Tensor::zeros({block}, DType::F32, MemCategory::Workspace, "calibrate.part");
  switch (c) {
    case Collective::AllReduce:
      return [&comm, whole] { comm.all_reduce(whole); };
    case Collective::AllGather:
      return [&comm, whole, part] { comm.all_gather(whole, part); };
    case Collective::ReduceScatter:
      return [&comm, whole, part] { comm.reduce_scatter(part, whole); };
    case Collective::AllToAll: {
      const Tensor out = Tensor::zeros({elems}, DType::F32, MemCategory::Workspace, "calibrate.all_to_all");
      const std::vector<int64_t> counts(static_cast<size_t>(n), block);
      return [&comm, whole, out, counts] { comm.all_to_all(out, counts, whole, counts); };
    }
    case Collective::SendRecv: {
      const int peer = comm.rank() ^ 1;
      if (peer >= comm.size()) return [] {};
      const bool first = comm.rank() % 2 == 0;
      return [&comm, whole, peer, first] {  // one round trip
        if (first) comm.send(whole, peer, 0);
        comm.recv(whole, peer, 0);
        if (!first) comm.send(whole, peer, 0);
      };
    }
  }
  fail("collective_call: unknown collective");
}

// Seconds per call of `calls` back-to-back calls, the slowest rank's (the same on every rank).
double slowest_rank_seconds(parallel::Communicator& comm, const std::function<void()>& call, int calls) {
  comm.barrier();
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < calls; ++i) call();
  const double mine = std::chrono::duration<double>(Clock::now() - t0).count() / calls;
  return comm.all_reduce_scalar(mine, parallel::ReduceOp::Max);
}

CollectiveSample time_collective(parallel::Communicator& comm, Collective c, double bytes, double target_s) {
  const int64_t n = comm.size();
  const int64_t elems = std::max<int64_t>(1, static_cast<int64_t>(bytes) / 4 / n) * n;
  const std::function<void()> call = collective_call(comm, c, elems);
  // The first call warms up (connections, buffers) and sizes the batches; its time is agreed on
  // by every rank, so every rank runs the same number of calls.
  const double first = slowest_rank_seconds(comm, call, 1);
  const double batch_s = target_s / kBatches;
  const int calls = static_cast<int>(std::clamp(batch_s / std::max(first, 1e-9), 1.0, double(kMaxCalls)));
  double best = std::numeric_limits<double>::infinity();
  for (int b = 0; b < kBatches; ++b) best = std::min(best, slowest_rank_seconds(comm, call, calls));
  const double messages_per_call = c == Collective::SendRecv ? 2.0 : 1.0;
  return {c, static_cast<double>(elems) * 4.0, best / messages_per_call};
}

// Keeps the calling thread computing for `seconds`: dependent floating-point work, no memory traffic.
void compute_for(double seconds) {
  const Clock::time_point t0 = Clock::now();
  double x = 1;
  while (std::chrono::duration<double>(Clock::now() - t0).count() < seconds)
    for (int i = 0; i < 1000; ++i) x = x * 1.0000001 + 1e-9;
  [[maybe_unused]] volatile double sink = x;  // keeps the loop
}

double steady_seconds() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

}  // namespace

std::vector<double> busy_send_seconds(parallel::Communicator& comm, double bytes, double busy_s, int repeats) {
  MEGATON_CHECK(comm.size() >= 2, "busy_send_seconds needs 2 ranks or more, not ", comm.size());
  MEGATON_CHECK(repeats >= 1 && busy_s > 0 && bytes >= 4, "busy_send_seconds: repeats ", repeats, ", busy_s ", busy_s,
                ", bytes ", bytes);
  const Tensor msg =
      Tensor::zeros({static_cast<int64_t>(bytes) / 4}, DType::F32, MemCategory::Workspace, "calibrate.busy_send");
  std::vector<double> seconds;
  for (int i = -1; i < repeats; ++i) {  // the first one warms up (connections, buffers)
    // The receive is posted before the send, as a pipeline stage posts its next op's receive ahead.
    parallel::WorkHandle recv = comm.rank() == 1 ? comm.recv_async(msg, 0, i + 1) : nullptr;
    comm.barrier();
    double posted = 0, arrived = 0;
    if (comm.rank() == 0) {
      posted = steady_seconds();
      parallel::WorkHandle send = comm.send_async(msg, 1, i + 1);
      compute_for(busy_s);
      send->wait();
    } else if (comm.rank() == 1) {
      recv->wait();
      arrived = steady_seconds();
    }
    posted = comm.all_reduce_scalar(posted, parallel::ReduceOp::Max);
    arrived = comm.all_reduce_scalar(arrived, parallel::ReduceOp::Max);
    if (i >= 0) seconds.push_back(arrived - posted);
  }
  return seconds;
}

double busy_send_delay(std::span<const double> seconds, const LinkSpec& link, double bytes) {
  MEGATON_CHECK(!seconds.empty(), "busy_send_delay: no timings");
  double mean = 0;
  for (double s : seconds) mean += s / double(seconds.size());
  return std::max(0.0, mean - collective_time(Collective::SendRecv, link, 2, bytes));
}

std::vector<CollectiveSample> time_collectives(parallel::Communicator& comm, const std::vector<double>& sizes,
                                               double target_s) {
  std::vector<CollectiveSample> samples;
  for (Collective c : kCollectives)
    for (double bytes : sizes) samples.push_back(time_collective(comm, c, bytes, target_s));
  return samples;
}

}  // namespace megaton::plan
