#include "megaton/train/fault_injection.h"

#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "megaton/core/atomic_file.h"
#include "megaton/core/error.h"

namespace megaton::train {

namespace {

constexpr const char* kUsage =
    "expected nan@step=N, spike@step=N, crash@step=N, sigterm@step=N, crash@save[=N], fail@save[=N], "
    "slow@save=SECONDS or fail@final, "
    "optionally followed by ,rank=R";

int64_t parse_count(const std::string& spec, const std::string& text) {
  size_t used = 0;
  int64_t v = -1;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
  }
  if (used != text.size() || v < 1) fail("--inject ", spec, ": '", text, "' is not a positive step number");
  return v;
}

// The R of a `rank=R` qualifier: a rank of the job.
int parse_rank(const std::string& spec, const std::string& text, int world_size) {
  size_t used = 0;
  long long v = -1;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
  }
  if (text.empty() || used != text.size() || v < 0) fail("--inject ", spec, ": '", text, "' is not a rank number");
  if (v >= world_size)
    fail("--inject ", spec, ": there is no rank ", v, ": the job has ", world_size,
         world_size == 1 ? " process (rank 0)" : " processes (ranks 0 to " + std::to_string(world_size - 1) + ")");
  return static_cast<int>(v);
}

}  // namespace

void FaultInjector::parse(const std::string& s, int world_size, std::vector<Spec>& specs, double& save_delay_s) {
  // FAULT[,rank=R]: the fault, then qualifiers.
  const size_t comma = s.find(',');
  const std::string fault = s.substr(0, comma);
  int rank = -1;
  for (size_t start = comma; start != std::string::npos;) {
    const size_t end = s.find(',', start + 1);
    const std::string q = s.substr(start + 1, end == std::string::npos ? std::string::npos : end - start - 1);
    if (!q.starts_with("rank=")) fail("--inject ", s, ": unknown qualifier '", q, "' (expected rank=R)");
    if (rank >= 0) fail("--inject ", s, ": rank given twice");
    rank = parse_rank(s, q.substr(5), world_size);
    start = end;
  }
  const size_t at = fault.find('@'), eq = fault.find('=');
  if (at == std::string::npos) fail("--inject ", s, ": ", kUsage);
  const std::string kind = fault.substr(0, at);
  const std::string trigger = fault.substr(at + 1, eq == std::string::npos ? std::string::npos : eq - at - 1);
  const std::string value = eq == std::string::npos ? "" : fault.substr(eq + 1);
  if ((trigger == "save" || trigger == "final") && rank > 0)
    fail("--inject ", s, ": checkpoints and the final model are written by rank 0 alone, so a fault in their writing "
         "cannot happen on rank ", rank);
  if (trigger == "step" && (kind == "nan" || kind == "spike" || kind == "crash" || kind == "sigterm")) {
    const Fault f = kind == "nan"     ? Fault::Nan
                    : kind == "spike" ? Fault::Spike
                    : kind == "crash" ? Fault::CrashAtStep
                                      : Fault::SignalAtStep;
    specs.push_back({s, f, parse_count(s, value), rank});
  } else if (trigger == "save" && (kind == "crash" || kind == "fail")) {
    specs.push_back({s, kind == "crash" ? Fault::CrashInSave : Fault::FailSave, value.empty() ? -1 : parse_count(s, value),
                     rank});
  } else if (trigger == "final" && kind == "fail" && eq == std::string::npos) {
    specs.push_back({s, Fault::FailFinal, -1, rank});
  } else if (trigger == "save" && kind == "slow") {
    try {
      save_delay_s = std::stod(value);
    } catch (const std::exception&) {
      fail("--inject ", s, ": '", value, "' is not a number of seconds");
    }
  } else {
    fail("--inject ", s, ": ", kUsage);
  }
}

void FaultInjector::validate(const std::vector<std::string>& specs, int world_size) {
  std::vector<Spec> parsed;
  double delay = 0;
  for (const std::string& s : specs) parse(s, world_size, parsed, delay);
}

FaultInjector::FaultInjector(const std::vector<std::string>& specs, const std::string& run_dir, int rank, int world_size)
    : rank_(rank),
      record_path_((std::filesystem::path(run_dir) /
                    (rank == 0 ? std::string("injected_faults") : "injected_faults.rank" + std::to_string(rank)))
                       .string()) {
  for (const std::string& s : specs) parse(s, world_size, specs_, save_delay_s_);
  // What fired on any rank (a job restarted after one rank crashed must not meet the fault again on
  // the others); the record files of every rank (an .tmp is a write that never finished).
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(run_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name != "injected_faults" && !(name.starts_with("injected_faults.rank") && !name.ends_with(".tmp"))) continue;
    std::ifstream in(e.path());
    for (std::string line; std::getline(in, line);) fired_.insert(line);
  }
}

void FaultInjector::corrupt_gradients(int64_t step, const Tensor& grads, double& loss) {
  if (fire(Fault::Nan, step)) {
    grads.data<float>()[0] = std::nanf("");
    loss = std::nan("");
  }
  if (fire(Fault::Spike, step)) {
    constexpr float kSpike = 10.0f;
    float* g = grads.data<float>();
    for (int64_t i = 0; i < grads.numel(); ++i) g[i] *= kSpike;
    loss *= kSpike;
  }
}

bool FaultInjector::fire(Fault kind, int64_t step) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Spec& s : specs_) {
    if (s.kind != kind || (s.step >= 0 && s.step != step) || (s.rank >= 0 && s.rank != rank_) || fired_.count(s.text))
      continue;
    fired_.insert(s.text);
    std::string text;
    for (const std::string& f : fired_) text += f + "\n";
    // A rank other than 0 may meet its fault before rank 0 has created the run directory.
    if (const auto dir = std::filesystem::path(record_path_).parent_path(); !dir.empty())
      std::filesystem::create_directories(dir);
    write_file_atomically(record_path_, text);
    if (rank_ == 0)
      std::fprintf(stderr, "injected fault: %s (step %ld)\n", s.text.c_str(), static_cast<long>(step));
    else
      std::fprintf(stderr, "injected fault: %s (step %ld, rank %d)\n", s.text.c_str(), static_cast<long>(step), rank_);
    return true;
  }
  return false;
}

void FaultInjector::crash(const std::string& why) {
  std::fprintf(stderr, "injected fault: %s: killing the process\n", why.c_str());
  std::fflush(nullptr);
  std::raise(SIGKILL);
  std::abort();  // not reached: SIGKILL cannot be caught
}

}  // namespace megaton::train
