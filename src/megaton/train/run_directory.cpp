#include "megaton/train/run_directory.h"

#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "megaton/ckpt/checkpoint_dir.h"
#include "megaton/core/error.h"

namespace megaton::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kKey = "config key 'logging.run_dir'";

}  // namespace

void check_run_dir_writable(const std::string& run_dir) {
  const fs::path dir = fs::absolute(run_dir);
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    fail(kKey, ": '", run_dir, "' is a file, not a directory");
  // The nearest part of the path that exists is where the first entry will be created.
  fs::path existing = dir;
  while (!fs::exists(existing, ec)) existing = existing.parent_path();
  if (!fs::is_directory(existing, ec))
    fail(kKey, ": cannot create '", run_dir, "': '", existing.string(), "' is a file, not a directory");
  // access() answers for permissions but not for read-only mounts or root on every file system;
  // creating (and removing) an entry answers for all of them.
  std::string probe = (existing / ".megaton_write_test_XXXXXX").string();
  if (!::mkdtemp(probe.data()))
    fail(kKey, ": cannot create '", run_dir, "': '", existing.string(), "' is not writable (", std::strerror(errno), ")");
  fs::remove(probe, ec);
}

std::vector<std::string> previous_results(const std::string& run_dir) {
  const fs::path dir = run_dir;
  std::vector<std::string> held;
  std::error_code ec;
  if (fs::exists(dir / "metrics.jsonl", ec)) held.push_back("metrics.jsonl");
  if (fs::exists(dir / "final", ec)) held.push_back("final/");
  const std::string ckpts = (dir / "checkpoints").string();
  if (fs::is_directory(ckpts, ec) && !fs::is_empty(ckpts, ec)) held.push_back("checkpoints/");
  return held;
}

void clear_previous_results(const std::string& run_dir) {
  const fs::path dir = run_dir;
  if (!fs::is_directory(dir)) return;
  for (const char* name : {"metrics.jsonl", "config.toml", "final", "final.tmp"}) fs::remove_all(dir / name);
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().starts_with("injected_faults")) fs::remove(e.path());
  const std::string ckpts = (dir / "checkpoints").string();
  for (const std::string& c : ckpt::list_checkpoints(ckpts)) fs::remove_all(c);
  ckpt::remove_torn_checkpoints(ckpts);
  fs::remove(fs::path(ckpts) / ckpt::kLatestName);
}

}  // namespace megaton::train
