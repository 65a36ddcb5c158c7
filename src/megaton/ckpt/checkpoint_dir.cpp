#include "megaton/ckpt/checkpoint_dir.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "megaton/ckpt/manifest.h"
#include "megaton/core/atomic_file.h"
#include "megaton/core/error.h"

namespace megaton::ckpt {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kPrefix = "step_";
constexpr std::string_view kTmpSuffix = ".tmp";
constexpr std::string_view kAsideSuffix = ".corrupt";

// The step of a checkpoint directory name, or -1 for any other name.
int64_t step_of(const std::string& name) {
  if (!name.starts_with(kPrefix) || name.size() == kPrefix.size()) return -1;
  int64_t step = 0;
  for (size_t i = kPrefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

std::string read_latest(const std::string& root) {
  std::ifstream in(fs::path(root) / kLatestName);
  std::string name;
  std::getline(in, name);
  return name;
}

}  // namespace

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%06ld", static_cast<long>(step));
  return buf;
}

std::string temporary_checkpoint_dir(const std::string& root, int64_t step) {
  return (fs::path(root) / (checkpoint_name(step) + std::string(kTmpSuffix))).string();
}

std::string prepare_checkpoint(const std::string& root, int64_t step) {
  const std::string tmp_dir = temporary_checkpoint_dir(root, step);
  fs::remove_all(tmp_dir);
  fs::create_directories(tmp_dir);
  return tmp_dir;
}

void commit_checkpoint(const std::string& root, int64_t step, const std::function<void(const std::string&)>& write_files,
                       int64_t keep_last) {
  write_files(prepare_checkpoint(root, step));
  finish_checkpoint(root, step, {}, keep_last);
}

void finish_checkpoint(const std::string& root, int64_t step, const std::vector<FileDigest>& known, int64_t keep_last) {
  const std::string name = checkpoint_name(step);
  const fs::path final_dir = fs::path(root) / name;
  const std::string tmp_dir = temporary_checkpoint_dir(root, step);
  write_manifest(tmp_dir, known);
  // rename() cannot replace a non-empty directory; an existing one of the same step is an older
  // save (a resumed run repeating steps after a fallback), so it goes first.
  fs::remove_all(final_dir);
  fs::rename(tmp_dir, final_dir);
  // Its commit also fsyncs ROOT, making the directory rename durable.
  write_file_atomically((fs::path(root) / kLatestName).string(), name + "\n");

  if (keep_last <= 0) return;
  std::vector<std::pair<int64_t, fs::path>> all;
  for (const auto& e : fs::directory_iterator(root))
    if (const int64_t s = step_of(e.path().filename().string()); e.is_directory() && s >= 0) all.emplace_back(s, e.path());
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = static_cast<size_t>(keep_last); i < all.size(); ++i)
    if (all[i].first != step) fs::remove_all(all[i].second);
}

std::vector<std::string> list_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> all;
  if (!fs::is_directory(root)) return {};
  const std::string latest = read_latest(root);
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    const int64_t s = step_of(name);
    if (!e.is_directory() || s < 0) continue;
    // The latest pointer sorts first; every other checkpoint by step, newest first.
    all.emplace_back(name == latest ? INT64_MAX : s, e.path().string());
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> out;
  for (auto& [s, path] : all) out.push_back(std::move(path));
  return out;
}

std::vector<std::string> remove_torn_checkpoints(const std::string& root) {
  std::vector<std::string> removed;
  if (!fs::is_directory(root)) return removed;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.ends_with(kTmpSuffix) && step_of(name.substr(0, name.size() - kTmpSuffix.size())) >= 0)
      removed.push_back(e.path().string());
  }
  for (const std::string& p : removed) fs::remove_all(p);
  // A process killed while replacing ROOT/latest leaves its latest.<pid>.tmp.
  for (std::string& p : remove_abandoned_temporaries(root)) removed.push_back(std::move(p));
  return removed;
}

std::string move_aside(const std::string& dir) {
  std::string target = dir + std::string(kAsideSuffix);
  for (int n = 2; fs::exists(target); ++n) target = dir + std::string(kAsideSuffix) + "." + std::to_string(n);
  std::error_code ec;
  fs::rename(dir, target, ec);
  if (ec) fail("cannot move the rejected checkpoint '", dir, "' aside to '", target, "': ", ec.message());
  return target;
}

std::vector<std::string> list_moved_aside(const std::string& root) {
  std::vector<std::string> out;
  if (!fs::is_directory(root)) return out;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    const size_t at = name.find(kAsideSuffix);
    if (e.is_directory() && at != std::string::npos && step_of(name.substr(0, at)) >= 0) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<std::string> find_valid_checkpoint(
    const std::string& path, const std::function<void(const std::string& dir, const std::string& reason)>& rejected) {
  if (!fs::exists(path)) fail("checkpoint path '", path, "' does not exist");
  if (!fs::is_directory(path))
    fail("checkpoint path '", path, "' is a file; expected a checkpoint directory or a checkpoints directory");
  if (fs::exists(fs::path(path) / kManifestName) || step_of(fs::path(path).filename().string()) >= 0) {
    verify_manifest(path);
    return path;
  }
  for (const std::string& dir : list_checkpoints(path)) {
    try {
      verify_manifest(dir);
      return dir;
    } catch (const Error& e) {
      rejected(dir, e.what());
    }
  }
  return std::nullopt;
}

}  // namespace megaton::ckpt
