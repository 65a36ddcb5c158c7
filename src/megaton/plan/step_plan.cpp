#include "megaton/plan/step_plan.h"

#include <algorithm>
#include <cmath>

#include "megaton/pipeline/generators.h"
#include "megaton/pipeline/trace.h"
#include "megaton/plan/collective_cost.h"
#include "megaton/plan/op_counts.h"
#include "megaton/train/pipeline_layout.h"

namespace megaton::plan {

namespace {

// Routed-expert weights this pipeline rank holds (the buckets summed over the expert-data-parallel
// group instead of dp): per MoE layer, E / ep experts of fc1 [2F, C] and fc2 [C, F].
double expert_elements(const train::TrainConfig& c, const models::StageLayout& layout, int stage) {
  const models::TransformerConfig& m = c.model;
  if (m.mlp_type != "moe") return 0;
  double n = 0;
  int64_t first = 0;
  for (size_t mc = 0; mc < layout.num_chunks(); ++mc) {
    const bool here =
        layout.chunk_rank[mc] == stage || (!layout.chunk_copy_rank.empty() && layout.chunk_copy_rank[mc] == stage);
    for (int64_t l = first; l < first + layout.chunk_layers[mc]; ++l)
      if (here && m.is_moe_layer(l))
        n += double(m.moe.num_moe_experts / c.expert_model_parallel_size) * 3.0 * double(m.hidden_size) *
             double(m.moe.moe_ffn_hidden_size);
    first += layout.chunk_layers[mc];
  }
  return n;
}

// Seconds past the window's end until the last of the buckets is reduced: the buckets become ready
// one after another across `window` (the last micro-batch's backward on this rank) and the
// communication thread reduces them in turn; without overlap all of them after it.
double exposed_reduction(const std::vector<double>& bucket_costs, double window, bool overlap) {
  double done = 0;
  const double n = double(bucket_costs.size());
  for (size_t i = 0; i < bucket_costs.size(); ++i) {
    const double ready = overlap ? window * double(i + 1) / n : window;
    done = std::max(done, ready) + bucket_costs[i];
  }
  return std::max(0.0, done - window);
}

// The buckets of `elements` fp32 gradients, bucket_size elements each (the last one shorter).
void add_buckets(std::vector<double>& costs, const SystemSpec& s, Collective col, GroupShape g, double elements,
                 double bucket_size) {
  for (double left = elements; left > 0; left -= bucket_size)
    costs.push_back(collective_seconds(s, col, g, std::min(left, bucket_size) * 4.0));
}

// Fills a stage's data-parallel reduction, optimizer and gather figures (st.memory already set).
void finish_stage(StagePlan& st, const train::TrainConfig& c, const SystemSpec& s, const models::StageLayout& layout,
                  int stage, double backward_window, double forward_window) {
  const Groups g = groups_of(c);
  const double elements = st.memory.grads / 4.0;  // the fp32 gradient buffer, padding included
  const double experts = std::min(elements, expert_elements(c, layout, stage));
  const double dense = elements - experts;
  const bool distopt = c.use_distributed_optimizer;
  const Collective reduce = distopt ? Collective::ReduceScatter : Collective::AllReduce;
  std::vector<double> buckets;
  add_buckets(buckets, s, reduce, g.dp, dense, double(c.bucket_size));
  add_buckets(buckets, s, reduce, g.edp, experts, double(c.bucket_size));
  st.grad_sync_s = exposed_reduction(buckets, backward_window, c.overlap_grad_reduce);
  // DualPipe's mirrored pair sums its whole buffer; a tied embedding is summed by the first and last stages.
  if (!layout.chunk_copy_rank.empty())
    st.grad_sync_s += collective_seconds(s, Collective::AllReduce, {2, g.pp.stride}, elements * 4.0);
  else if (c.model.tie_embeddings && c.pipeline_model_parallel_size > 1 &&
           (stage == 0 || stage + 1 == c.pipeline_model_parallel_size))
    st.grad_sync_s +=
        collective_seconds(s, Collective::AllReduce, {2, g.pp.stride * (c.pipeline_model_parallel_size - 1)},
                           double(c.model.padded_vocab_size(c.tensor_model_parallel_size)) / double(g.tp.size) *
                               double(c.model.hidden_size) * 4.0);
  const double owned = distopt ? dense / double(g.dp.size) + experts / double(g.edp.size) : elements;
  const double compute_elem = c.bf16 || c.fp16 ? 2.0 : 0.0;
  const double bw = s.memory_bandwidth_Bps;
  // Grad norm (reads the gradients), the AdamW update of the owned elements, zeroing the buffer.
  st.optimizer_s = elements * 4.0 / (bw * s.memory_efficiency.at(MemoryOp::Elementwise)) +
                   optimizer_bytes(owned, compute_elem) / (bw * s.memory_efficiency.at(MemoryOp::Optimizer)) +
                   elements * 4.0 / (bw * s.memory_efficiency.at(MemoryOp::Elementwise));
  if (distopt) {
    std::vector<double> gathers;
    add_buckets(gathers, s, Collective::AllGather, g.dp, dense, double(c.bucket_size));
    add_buckets(gathers, s, Collective::AllGather, g.edp, experts, double(c.bucket_size));
    double total = 0;
    for (double x : gathers) total += x;
    // Under overlap_param_gather the next forward waits only for what its first micro-batch's
    // forward outruns.
    st.param_gather_s = c.overlap_param_gather ? std::max(0.0, total - forward_window) : total;
  }
}

}  // namespace

pipeline::Schedule step_schedule(const train::TrainConfig& c) {
  const int stages = static_cast<int>(c.pipeline_model_parallel_size);
  return stages == 1 ? pipeline::no_pipelining(c.grad_accum_steps())
                     : pipeline::generate(c.pipeline_schedule, stages,
                                          static_cast<int>(train::pipeline_chunks_per_rank(c)), c.grad_accum_steps());
}

StepPlan plan_step(const train::TrainConfig& c, const SystemSpec& s, const pipeline::Schedule* schedule) {
  StepPlan p;
  const int stages = static_cast<int>(c.pipeline_model_parallel_size);
  p.microbatches = c.grad_accum_steps();
  p.devices = c.tensor_model_parallel_size * std::max<int64_t>(1, c.data_parallel_size) * stages;
  const pipeline::Schedule own = schedule ? pipeline::Schedule{} : step_schedule(c);
  const pipeline::Schedule& sched = schedule ? *schedule : own;
  const models::StageLayout layout = train::pipeline_layout(c, sched);
  p.schedule = sched.name;
  pipeline::OpCosts costs;
  for (size_t mc = 0; mc < layout.num_chunks(); ++mc) {
    p.chunks.push_back(chunk_cost(c, s, layout, static_cast<int64_t>(mc)));
    const ChunkCost& k = p.chunks.back();
    costs.per_chunk.push_back({k.forward.seconds(), k.backward_input.seconds(), k.backward_weight.seconds()});
  }
  const double rows = double(c.micro_batch_size * c.seq_length);
  const double sp_rows = c.sequence_parallel ? rows / double(c.tensor_model_parallel_size) : rows;
  const double elem = c.bf16 || c.fp16 ? 2.0 : 4.0;
  const GroupShape pp = groups_of(c).pp;
  // The sender goes on to its next op at once, so a boundary also waits for its communication thread.
  const LinkSpec& pp_link = group_link(s, {2, pp.stride});
  costs.transfer = collective_time(Collective::SendRecv, pp_link, 2, sp_rows * double(c.model.hidden_size) * elem) +
                   pp_link.busy_send_delay_s;
  p.simulation = pipeline::simulate(sched, costs);

  double ready = 0;  // when the last rank's gradients are final
  double after = 0;  // the optimizer step and parameter gather, every rank in parallel after the grad norm
  for (int r = 0; r < stages; ++r) {
    StagePlan st;
    double backward_window = 0, forward_window = 0;  // the last micro-batch's B and W, the first's F
    for (const pipeline::TimedOp& t : p.simulation.timeline[size_t(r)]) {
      st.pipeline_end_s = std::max(st.pipeline_end_s, t.end);
      st.busy_s += t.end - t.start;
      for (const pipeline::Op& part : pipeline::compute_parts(t.op)) {
        const ChunkCost& k = p.chunks[size_t(sched.model_chunk_of(r, part.chunk))];
        const PhaseCost& ph = part.kind == pipeline::OpKind::Forward         ? k.forward
                              : part.kind == pipeline::OpKind::BackwardInput ? k.backward_input
                                                                             : k.backward_weight;
        st.comm_s += ph.comm_s;
        st.compute_s += ph.seconds() - ph.comm_s;
        if (part.kind != pipeline::OpKind::Forward && part.microbatch + 1 == p.microbatches)
          backward_window += ph.seconds();
        if (part.kind == pipeline::OpKind::Forward && part.microbatch == 0) forward_window += ph.seconds();
      }
    }
    st.in_flight = std::max<int64_t>(1, p.simulation.peak_activations[size_t(r)]);
    st.memory = peak_memory(c, r, st.in_flight, p.simulation.live[size_t(r)]);
    st.peak_memory_bytes = st.memory.total();
    finish_stage(st, c, s, layout, r, backward_window, forward_window);
    ready = std::max(ready, st.pipeline_end_s + st.grad_sync_s);
    after = std::max(after, st.optimizer_s + st.param_gather_s);
    p.stages.push_back(st);
  }
  p.step_time_s = ready + after;
  for (int r = 0; r < stages; ++r) {
    const StagePlan& st = p.stages[size_t(r)];
    // The critical rank is the busiest: the others' extra idle time is waiting for it.
    const StagePlan& worst = p.stages[size_t(p.critical_stage)];
    if (st.busy_s + st.grad_sync_s + st.optimizer_s + st.param_gather_s >
        worst.busy_s + worst.grad_sync_s + worst.optimizer_s + worst.param_gather_s)
      p.critical_stage = r;
    if (st.peak_memory_bytes > p.peak_memory_bytes) {
      p.peak_memory_bytes = st.peak_memory_bytes;
      p.peak_memory_stage = r;
    }
  }
  const StagePlan& crit = p.stages[size_t(p.critical_stage)];
  p.compute_s = crit.compute_s;
  p.comm_s = crit.comm_s;
  p.grad_sync_s = crit.grad_sync_s;
  p.optimizer_s = crit.optimizer_s;
  p.param_gather_s = crit.param_gather_s;
  p.bubble_s = std::max(0.0, p.step_time_s - p.compute_s - p.comm_s - p.grad_sync_s - p.optimizer_s - p.param_gather_s);
  const double tokens = double(c.global_batch_size * c.seq_length);
  p.tokens_per_s = tokens / p.step_time_s;
  p.mfu =
      tokens * c.model.flops_per_token(c.seq_length) / (p.step_time_s * double(p.devices) * s.peak(compute_dtype(c)));
  return p;
}

nlohmann::json to_json(const StepPlan& p, const train::TrainConfig& c, const SystemSpec& s) {
  nlohmann::json stages = nlohmann::json::array();
  for (const StagePlan& st : p.stages) {
    nlohmann::json mem;
    mem["params"] = st.memory.params;
    mem["grads"] = st.memory.grads;
    mem["optimizer"] = st.memory.optimizer;
    mem["activations"] = st.memory.activations;
    mem["workspace"] = st.memory.workspace;
    mem["other"] = st.memory.other;
    stages.push_back({{"pipeline_end_s", st.pipeline_end_s},
                      {"compute_s", st.compute_s},
                      {"comm_s", st.comm_s},
                      {"grad_sync_s", st.grad_sync_s},
                      {"optimizer_s", st.optimizer_s},
                      {"param_gather_s", st.param_gather_s},
                      {"in_flight_microbatch_chunks", st.in_flight},
                      {"peak_memory_bytes", st.peak_memory_bytes},
                      {"memory_bytes", mem}});
  }
  nlohmann::json chunks = nlohmann::json::array();
  for (const ChunkCost& k : p.chunks) {
    nlohmann::json phases;
    for (const auto& [name, ph] : {std::pair{"forward", &k.forward}, std::pair{"backward_input", &k.backward_input},
                                   std::pair{"backward_weight", &k.backward_weight}})
      phases[name] = {{"seconds", ph->seconds()}, {"compute_s", ph->compute_s}, {"memory_s", ph->memory_s},
                      {"overhead_s", ph->overhead_s}, {"comm_s", ph->comm_s}, {"flops", ph->flops}};
    chunks.push_back(phases);
  }
  return {{"system", s.name},
          {"chunks", chunks},
          {"system_source", s.source},
          {"model", c.model.name},
          {"devices", p.devices},
          {"parallel",
           {{"tensor_model_parallel_size", c.tensor_model_parallel_size},
            {"pipeline_model_parallel_size", c.pipeline_model_parallel_size},
            {"virtual_pipeline_model_parallel_size", c.virtual_pipeline_model_parallel_size},
            {"pipeline_schedule", c.pipeline_schedule},
            {"data_parallel_size", c.data_parallel_size},
            {"expert_model_parallel_size", c.expert_model_parallel_size},
            {"sequence_parallel", c.sequence_parallel},
            {"use_distributed_optimizer", c.use_distributed_optimizer}}},
          {"micro_batch_size", c.micro_batch_size},
          {"global_batch_size", c.global_batch_size},
          {"seq_length", c.seq_length},
          {"microbatches", p.microbatches},
          {"schedule", p.schedule},
          {"step_time_s", p.step_time_s},
          {"tokens_per_s", p.tokens_per_s},
          {"mfu", p.mfu},
          {"peak_memory_bytes", p.peak_memory_bytes},
          {"peak_memory_stage", p.peak_memory_stage},
          {"fits", p.peak_memory_bytes <= s.memory_bytes},
          {"breakdown_s",
           {{"compute", p.compute_s},
            {"exposed_comm", p.comm_s},
            {"bubble", p.bubble_s},
            {"grad_sync", p.grad_sync_s},
            {"optimizer", p.optimizer_s},
            {"param_gather", p.param_gather_s}}},
          {"critical_stage", p.critical_stage},
          {"bubble_fraction", p.simulation.bubble_fraction},
          {"stages", stages}};
}

void write_plan_trace(const std::string& path, const StepPlan& p) {
  std::vector<pipeline::TraceRow> rows;
  double ready = 0;
  for (const StagePlan& st : p.stages) ready = std::max(ready, st.pipeline_end_s + st.grad_sync_s);
  for (size_t r = 0; r < p.stages.size(); ++r) {
    const StagePlan& st = p.stages[r];
    pipeline::TraceRow row{"stage " + std::to_string(r), p.simulation.timeline[r]};
    if (st.grad_sync_s > 0)
      row.spans.push_back({"gradient reduction (exposed)", st.pipeline_end_s, st.pipeline_end_s + st.grad_sync_s});
    row.spans.push_back({"optimizer", ready, ready + st.optimizer_s});
    if (st.param_gather_s > 0)
      row.spans.push_back(
          {"parameter all-gather (exposed)", ready + st.optimizer_s, ready + st.optimizer_s + st.param_gather_s});
    rows.push_back(std::move(row));
  }
  pipeline::write_chrome_trace(path, rows, 1e6, {{"step_time_s", p.step_time_s}, {"schedule", p.schedule}});
}

}  // namespace megaton::plan
