#include "megaton/pipeline/simulator.h"

#include <algorithm>
#include <optional>
#include <tuple>

#include "megaton/core/error.h"

namespace megaton::pipeline {

namespace {

// (kind, micro-batch, model chunk in layer order) of a finished compute op. A micro-batch runs
// through one parameter copy only, so the model chunk names the copy's chunk too.
using OpKey = std::tuple<OpKind, int64_t, int>;
struct Done {
  double end;
  int stage = -1;  // -1: not finished
};

// Finished F, B and W parts, indexed by OpKey.
class DoneTable {
 public:
  DoneTable(int64_t microbatches, int model_chunks)
      : chunks_(model_chunks), table_(static_cast<size_t>(3 * microbatches * model_chunks)) {}
  Done& operator[](const OpKey& k) { return table_[index(k)]; }
  const Done* find(const OpKey& k) const {
    const Done& d = table_[index(k)];
    return d.stage < 0 ? nullptr : &d;
  }

 private:
  size_t index(const OpKey& k) const {
    const auto [kind, mb, mc] = k;
    const int64_t part = kind == OpKind::Forward ? 0 : kind == OpKind::BackwardInput ? 1 : 2;
    return static_cast<size_t>((mb * 3 + part) * chunks_ + mc);
  }
  int chunks_;
  std::vector<Done> table_;
};

}  // namespace

Simulation simulate(const Schedule& s, const OpCosts& costs) {
  validate(s);
  const int last_chunk = s.model_chunks() - 1;
  DoneTable done(s.microbatches, s.model_chunks());
  std::vector<size_t> next(static_cast<size_t>(s.stages), 0);
  std::vector<double> free_at(static_cast<size_t>(s.stages), 0.0);
  Simulation sim;
  sim.timeline.resize(static_cast<size_t>(s.stages));
  sim.live.resize(static_cast<size_t>(s.stages));
  struct Held {
    int saved = 0, held_for_w = 0;
  };
  std::vector<Held> held(static_cast<size_t>(s.stages));
  // Each stage runs its parts in list order, so counting as they are scheduled follows the stage's own
  // order whatever the interleaving with other stages.
  const auto record = [&](int stage, OpKind kind, bool with_weight) {
    Held& h = held[static_cast<size_t>(stage)];
    auto& live = sim.live[static_cast<size_t>(stage)];
    if (kind == OpKind::Forward) {
      live.push_back({kind, false, h.saved, h.held_for_w});
      ++h.saved;
    } else if (kind == OpKind::BackwardInput) {
      live.push_back({kind, with_weight, h.saved - 1, h.held_for_w});
      --h.saved;
      h.held_for_w += with_weight ? 0 : 1;
    } else {
      live.push_back({kind, false, h.saved, h.held_for_w - 1});
      --h.held_for_w;
    }
  };

  // The time a F / B / W part's input is available on `stage`, or a negative value while it is not
  // yet produced.
  auto ready = [&](const Op& op, int stage) -> double {
    const int mc = s.model_chunk_of(stage, op.chunk);
    std::optional<OpKey> dep;
    if (op.kind == OpKind::Forward && mc > 0) dep = OpKey{OpKind::Forward, op.microbatch, mc - 1};
    if (op.kind == OpKind::BackwardInput)
      dep = mc < last_chunk ? OpKey{OpKind::BackwardInput, op.microbatch, mc + 1} : OpKey{OpKind::Forward, op.microbatch, mc};
    if (op.kind == OpKind::BackwardWeight) dep = OpKey{OpKind::BackwardInput, op.microbatch, mc};
    if (!dep) return 0.0;
    const Done* d = done.find(*dep);
    if (!d) return -1.0;
    return d->end + (d->stage != stage ? costs.transfer : 0.0);
  };

  if (!costs.per_chunk.empty()) {
    if (costs.per_chunk.size() != static_cast<size_t>(s.model_chunks()))
      fail("simulate: ", costs.per_chunk.size(), " per-chunk costs for schedule '", s.name, "' of ", s.model_chunks(),
           " model chunks");
    if (costs.forward_backward > 0) fail("simulate: forward_backward cost given with per-chunk costs");
  }
  // The cost of one F, B or W part on `stage`.
  const auto part_cost = [&](OpKind k, int stage, int chunk) {
    const ChunkCosts& c = costs.per_chunk.empty()
                              ? ChunkCosts{costs.forward, costs.backward_input, costs.backward_weight}
                              : costs.per_chunk[static_cast<size_t>(s.model_chunk_of(stage, chunk))];
    return k == OpKind::Forward ? c.forward : k == OpKind::BackwardInput ? c.backward_input : c.backward_weight;
  };
  const auto cost_of = [&](const Op& op, int stage) {  // of a compute op
    if (op.kind == OpKind::ForwardBackward && costs.forward_backward > 0) return costs.forward_backward;
    double sum = 0;
    for (const Op& part : compute_parts(op)) sum += part_cost(part.kind, stage, part.chunk);
    return sum;
  };
  size_t remaining = 0;
  for (const auto& ops : s.ops) remaining += ops.size();
  while (remaining > 0) {
    bool progress = false;
    for (int st = 0; st < s.stages; ++st) {
      const auto& ops = s.ops[static_cast<size_t>(st)];
      size_t& i = next[static_cast<size_t>(st)];
      for (; i < ops.size(); ++i, --remaining, progress = true) {
        const Op& op = ops[i];
        const OpParts parts = compute_parts(op);
        if (parts.empty()) continue;  // transfers are modelled as the transfer cost of the input
        double at = 0;  // when every input is there (an F&B waits for both)
        for (const Op& part : parts) {
          const double part_at = ready(part, st);
          at = part_at < 0 || at < 0 ? -1.0 : std::max(at, part_at);
        }
        if (at < 0) break;
        const double start = std::max(free_at[static_cast<size_t>(st)], at);
        double end = start + cost_of(op, st);
        sim.timeline[static_cast<size_t>(st)].push_back({op, start, end});
        // A B (alone or in an F&B) directly followed by its own W: one backward call, so the W runs now
        // and the gradient leaves after it.
        const Op& last = parts.back();
        const bool fused = last.kind == OpKind::BackwardInput && i + 1 < ops.size() &&
                           ops[i + 1] == Op{OpKind::BackwardWeight, last.microbatch, last.chunk};
        for (const Op& part : parts) record(st, part.kind, fused && part.kind == OpKind::BackwardInput);
        if (fused) {
          const double w = part_cost(OpKind::BackwardWeight, st, last.chunk);
          sim.timeline[static_cast<size_t>(st)].push_back({ops[i + 1], end, end + w});
          end += w;
          done[{OpKind::BackwardWeight, last.microbatch, s.model_chunk_of(st, last.chunk)}] = {end, st};
          ++i, --remaining;
        }
        free_at[static_cast<size_t>(st)] = end;
        for (const Op& part : parts) done[{part.kind, part.microbatch, s.model_chunk_of(st, part.chunk)}] = {end, st};
      }
    }
    if (!progress) {
      std::string blocked;
      for (int st = 0; st < s.stages; ++st)
        if (next[static_cast<size_t>(st)] < s.ops[static_cast<size_t>(st)].size())
          blocked += " stage " + std::to_string(st) + " waits at " + op_name(s.ops[static_cast<size_t>(st)][next[static_cast<size_t>(st)]]) + ";";
      fail("schedule '", s.name, "' deadlocks:", blocked);
    }
  }

  double busy = 0;
  for (size_t st = 0; st < sim.timeline.size(); ++st) {
    // Activations: +1 when a forward (alone or in an F&B) starts, -1 when its W ends (releases
    // first at equal times).
    std::vector<std::pair<double, int>> events;
    for (const TimedOp& t : sim.timeline[st]) {
      busy += t.end - t.start;
      sim.step_time = std::max(sim.step_time, t.end);
      if (t.op.kind == OpKind::Forward || t.op.kind == OpKind::ForwardBackward) events.push_back({t.start, +1});
      if (t.op.kind == OpKind::BackwardWeight) events.push_back({t.end, -1});
    }
    std::sort(events.begin(), events.end());
    int live = 0, peak = 0;
    for (const auto& e : events) peak = std::max(peak, live += e.second);
    sim.peak_activations.push_back(peak);
    sim.param_copies.push_back(s.copies);
  }
  sim.bubble_fraction = sim.step_time > 0 ? 1.0 - busy / (s.stages * sim.step_time) : 0.0;
  return sim;
}

}  // namespace megaton::pipeline
