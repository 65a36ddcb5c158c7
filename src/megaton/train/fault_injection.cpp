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
    "expected nan@step=N, spike@step=N, crash@step=N, crash@save[=N], fail@save[=N] or slow@save=SECONDS";

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

}  // namespace

FaultInjector::FaultInjector(const std::vector<std::string>& specs, const std::string& run_dir)
    : record_path_((std::filesystem::path(run_dir) / "injected_faults").string()) {
  for (const std::string& s : specs) {
    const size_t at = s.find('@'), eq = s.find('=');
    if (at == std::string::npos) fail("--inject ", s, ": ", kUsage);
    const std::string kind = s.substr(0, at);
    const std::string trigger = s.substr(at + 1, eq == std::string::npos ? std::string::npos : eq - at - 1);
    const std::string value = eq == std::string::npos ? "" : s.substr(eq + 1);
    if (trigger == "step" && (kind == "nan" || kind == "spike" || kind == "crash")) {
      const Fault f = kind == "nan" ? Fault::Nan : kind == "spike" ? Fault::Spike : Fault::CrashAtStep;
      specs_.push_back({s, f, parse_count(s, value)});
    } else if (trigger == "save" && (kind == "crash" || kind == "fail")) {
      specs_.push_back({s, kind == "crash" ? Fault::CrashInSave : Fault::FailSave, value.empty() ? -1 : parse_count(s, value)});
    } else if (trigger == "save" && kind == "slow") {
      try {
        save_delay_s_ = std::stod(value);
      } catch (const std::exception&) {
        fail("--inject ", s, ": '", value, "' is not a number of seconds");
      }
    } else {
      fail("--inject ", s, ": ", kUsage);
    }
  }
  std::ifstream in(record_path_);
  for (std::string line; std::getline(in, line);) fired_.insert(line);
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
    if (s.kind != kind || (s.step >= 0 && s.step != step) || fired_.count(s.text)) continue;
    fired_.insert(s.text);
    std::string text;
    for (const std::string& f : fired_) text += f + "\n";
    AtomicFile out(record_path_);
    out.write(text.data(), text.size());
    out.commit();
    std::fprintf(stderr, "injected fault: %s (step %ld)\n", s.text.c_str(), static_cast<long>(step));
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
