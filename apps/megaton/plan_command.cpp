// `megaton plan`: predicts a training configuration's step time, throughput, MFU and peak memory per
// rank on a system (plan/step_plan.h), searches the parallel layouts of a model for the fastest
// that fits (plan/search.h), lists the shipped systems and measures this machine into a system
// file (`plan calibrate`).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "megaton/core/atomic_file.h"
#include "megaton/core/cpu_info.h"
#include "megaton/core/error.h"
#include "megaton/parallel/communicator.h"
#include "megaton/plan/calibrate.h"
#include "megaton/plan/search.h"
#include "megaton/plan/shipped_systems.h"
#include "megaton/plan/step_plan.h"
#include "megaton/plan/system.h"
#include "megaton/train/train_config.h"
#include "option_range.h"

namespace megaton::app {

namespace {

struct PlanOptions {
  std::string config, system, trace, model;
  std::vector<std::string> sets;
  int64_t devices = 1, global_batch = 0, seq_len = 4096, top = 5;
  double memory_margin = 0.1;
  bool json = false, search = false;
};

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / double(1 << 30));
  return buf;
}

void print_plan(const plan::StepPlan& p, const train::TrainConfig& c, const plan::SystemSpec& s) {
  std::printf("%s on %lld x %s (%s): tp %lld, pp %lld (%s, %lld micro-batches), dp %lld, ep %lld%s%s\n",
              c.model.name.c_str(), static_cast<long long>(p.devices), s.name.c_str(), s.source.c_str(),
              static_cast<long long>(c.tensor_model_parallel_size),
              static_cast<long long>(c.pipeline_model_parallel_size), p.schedule.c_str(),
              static_cast<long long>(p.microbatches), static_cast<long long>(c.data_parallel_size),
              static_cast<long long>(c.expert_model_parallel_size), c.sequence_parallel ? ", sp" : "",
              c.use_distributed_optimizer ? ", distributed optimizer" : "");
  std::printf("step %.4f s | %.0f tokens/s | MFU %.1f%% | peak memory %s (stage %lld) of %s%s\n", p.step_time_s,
              p.tokens_per_s, 100 * p.mfu, gib(p.peak_memory_bytes).c_str(), static_cast<long long>(p.peak_memory_stage),
              gib(s.memory_bytes).c_str(), p.peak_memory_bytes > s.memory_bytes ? " (DOES NOT FIT)" : "");
  std::printf("breakdown (stage %lld): compute %.4f s, exposed tp/ep comm %.4f s, bubble %.4f s, gradient sync %.4f s, "
              "optimizer %.4f s, parameter gather %.4f s\n",
              static_cast<long long>(p.critical_stage), p.compute_s, p.comm_s, p.bubble_s, p.grad_sync_s, p.optimizer_s,
              p.param_gather_s);
  std::printf("%-6s %10s %10s %10s %10s %9s %12s %12s %12s %12s\n", "stage", "end s", "compute s", "comm s", "sync s",
              "in-flight", "params", "grads", "optimizer", "activations");
  for (size_t r = 0; r < p.stages.size(); ++r) {
    const plan::StagePlan& st = p.stages[r];
    std::printf("%-6zu %10.4f %10.4f %10.4f %10.4f %9lld %12s %12s %12s %12s\n", r, st.pipeline_end_s, st.compute_s,
                st.comm_s, st.grad_sync_s, static_cast<long long>(st.in_flight), gib(st.memory.params).c_str(),
                gib(st.memory.grads).c_str(), gib(st.memory.optimizer).c_str(), gib(st.memory.activations).c_str());
  }
}

void run_plan(const PlanOptions& o) {
  const plan::SystemSpec s = plan::resolve_system(o.system);
  std::vector<std::string> sets = o.sets;
  if (!o.model.empty()) sets.insert(sets.begin(), "model.preset=\"" + o.model + "\"");
  train::TrainConfig c = train::load_train_config(o.config, sets);
  train::resolve_parallel_layout(c, o.devices);
  const plan::StepPlan p = plan::plan_step(c, s);
  if (!o.trace.empty()) plan::write_plan_trace(o.trace, p);
  if (o.json)
    std::printf("%s\n", plan::to_json(p, c, s).dump().c_str());
  else
    print_plan(p, c, s);
}

void run_search(const PlanOptions& o) {
  if (o.model.empty()) fail("plan --search: give --model (a preset name)");
  if (o.global_batch <= 0) fail("plan --search: give --global-batch");
  const plan::SystemSpec s = plan::resolve_system(o.system);
  plan::SearchSpace space;
  space.devices = o.devices;
  space.global_batch = o.global_batch;
  space.seq_length = o.seq_len;
  space.memory_margin = o.memory_margin;
  space.base_settings = o.sets;
  space.base_settings.insert(space.base_settings.begin(), "model.preset=\"" + o.model + "\"");
  const plan::SearchResult r = plan::search(space, s, static_cast<size_t>(o.top));
  if (o.json) {
    std::printf("%s\n", plan::to_json(r, s).dump().c_str());
    return;
  }
  std::printf("%s on %lld x %s: %zu layouts planned, %zu fit (memory margin %.0f%%), %.2f s\n", o.model.c_str(),
              static_cast<long long>(o.devices), s.name.c_str(), r.planned, r.fitting, 100 * o.memory_margin,
              r.seconds);
  for (size_t i = 0; i < r.best.size(); ++i)
    std::printf("%zu. %s\n   %.0f tokens/s, MFU %.1f%%, step %.4f s, peak %s | %s\n", i + 1, r.best[i].settings.c_str(),
                r.best[i].plan.tokens_per_s, 100 * r.best[i].plan.mfu, r.best[i].plan.step_time_s,
                gib(r.best[i].plan.peak_memory_bytes).c_str(), r.best[i].why.c_str());
}

// `megaton plan calibrate`: measures this machine with the engine's own kernels (on rank 0 under
// mpirun) and the collectives between the ranks, and writes a system file for the planner.
void add_plan_calibrate(CLI::App* plan) {
  auto* cmd = plan->add_subcommand("calibrate",
                                   "Measure this machine with the engine's kernels (GEMMs, attention, memory-bound "
                                   "ops) and, under mpirun, the collectives between its ranks; write a system file");
  static std::string output, name;
  static plan::CalibrateOptions options;
  cmd->add_option("--output", output, "The system file to write (TOML; replaced atomically)")->required();
  cmd->add_option("--threads", options.threads,
                  "Threads per rank (0: OMP_NUM_THREADS, else every core; under mpirun give each rank its share)")
      ->capture_default_str()
      ->check(in_range<int>(0, 1 << 16));
  cmd->add_option("--budget-s", options.budget_s,
                  "Rough total seconds: the GEMM grid and attention take as many shapes as it allows")
      ->capture_default_str()
      ->check(in_range<double>(1.0, 86400.0));
  cmd->add_flag("--quick", options.quick, "A few small shapes only (about a second; for tests, not for planning)");
  cmd->add_option("--name", name, "The system's name (default: the output file's name without its extension)");
  cmd->callback([] {
    const auto start = std::chrono::steady_clock::now();
    parallel::Communicator& world = parallel::world();
    // The device is measured by rank 0 alone while the others wait: ranks calibrating side by side
    // would each time their kernels against whatever phase the other is in (a STREAM loop beside a
    // GEMM), while in training every rank runs the same kind of op at once.
    plan::SystemSpec spec;
    if (world.rank() == 0) spec = plan::calibrate_device(options);
    world.barrier();
    spec.name = name.empty() ? std::filesystem::path(output).stem().string() : name;
    plan::calibrate_network(spec, world, options);
    if (world.rank() != 0) return;
    write_file_atomically(output, plan::to_toml(spec));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("cpu: %s\n%swrote %s (%d rank%s, %.0f s)\n", describe(cpu_info()).c_str(),
                plan::calibration_summary(spec).c_str(), output.c_str(), world.size(), world.size() > 1 ? "s" : "",
                seconds);
  });
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("plan", "Predict a training configuration's step time, MFU and memory on a system, "
                                         "or search the fastest parallel layout");
  static PlanOptions o;
  cmd->add_option("--config", o.config, "A training config (TOML), as `megaton train --config` takes");
  cmd->add_option("--set", o.sets, "section.key=value overrides (tp=2, pp=4, ...), as `megaton train --set`");
  cmd->add_option("--model", o.model, "A model preset (sets model.preset)");
  cmd->add_option("--system", o.system, "A system file or a shipped system (megaton plan systems)");
  cmd->add_option("--devices", o.devices, "Devices (training processes) in all")
      ->capture_default_str()
      ->check(in_range<int64_t>(1, int64_t{1} << 24));
  cmd->add_flag("--json", o.json, "Print one JSON object");
  cmd->add_option("--trace", o.trace, "Write a Chrome trace of the simulated step to this file");
  cmd->add_flag("--search", o.search, "Search the parallel layouts of --model for --global-batch on --devices");
  cmd->add_option("--global-batch", o.global_batch, "Global batch in sequences (--search)")
      ->check(in_range<int64_t>(1, int64_t{1} << 30));
  cmd->add_option("--seq-len", o.seq_len, "Sequence length (--search)")
      ->capture_default_str()
      ->check(in_range<int64_t>(1, int64_t{1} << 24));
  cmd->add_option("--top", o.top, "Layouts to print (--search)")->capture_default_str()->check(in_range<int64_t>(1, 1000));
  cmd->add_option("--memory-margin", o.memory_margin, "Share of device memory kept free (--search)")
      ->capture_default_str()
      ->check(in_range<double>(0.0, 0.9));
  cmd->callback([cmd] {
    if (!cmd->get_subcommands().empty()) return;
    if (o.system.empty()) fail("plan: give --system (a system file, or one of `megaton plan systems`)");
    if (o.search)
      run_search(o);
    else
      run_plan(o);
  });

  add_plan_calibrate(cmd);
  auto* systems = cmd->add_subcommand("systems", "List the shipped systems, or print one as a system file");
  static std::string print_name;
  systems->add_option("--print", print_name, "Print this system as TOML");
  systems->callback([] {
    if (!print_name.empty()) {
      std::printf("%s", plan::to_toml(plan::resolve_system(print_name)).c_str());
      return;
    }
    for (const std::string& n : plan::shipped_system_names()) {
      const plan::SystemSpec s = *plan::shipped_system(n);
      std::printf("%-6s %s\n", n.c_str(), s.description.c_str());
    }
  });
}

}  // namespace megaton::app
