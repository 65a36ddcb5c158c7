// The checkpoint directory of a run: ROOT/step_000123/ per saved step, ROOT/latest naming the
// newest. A checkpoint is written into ROOT/step_000123.tmp/ and renamed into place only once
// every file and the manifest are on disk, so a crash mid-save leaves a .tmp directory (removed
// by the next run) and never a torn checkpoint under a real name. A checkpoint that fails
// verification is moved aside to ROOT/step_000123.corrupt (never deleted: it may still be
// recoverable by hand), where neither rotation nor a later save of the same step touches it.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace megaton::ckpt {

inline constexpr const char* kLatestName = "latest";

std::string checkpoint_name(int64_t step);  // "step_000123"

// Creates ROOT/step_N.tmp/, lets write_files fill it, adds the manifest, renames the directory to
// ROOT/step_N (replacing an older one of that step), points ROOT/latest at it (atomic replace),
// then removes all but the newest keep_last checkpoints (0: keep all; checkpoints moved aside are
// not counted and never removed). Safe to call again after a failure: a leftover temporary
// directory is cleared first.
void commit_checkpoint(const std::string& root, int64_t step, const std::function<void(const std::string&)>& write_files,
                       int64_t keep_last);

// Complete checkpoint directories under root: the one `latest` names first, then the others from
// the highest step down.
std::vector<std::string> list_checkpoints(const std::string& root);

// Removes ROOT/*.tmp directories left by an interrupted save, and ROOT/latest.<pid>.tmp files
// whose process died replacing ROOT/latest; returns their paths.
std::vector<std::string> remove_torn_checkpoints(const std::string& root);

// Renames checkpoint directory `dir` to DIR.corrupt (DIR.corrupt.2, ... when taken) and returns the
// new path.
std::string move_aside(const std::string& dir);
// The checkpoints moved aside under root.
std::vector<std::string> list_moved_aside(const std::string& root);

// The checkpoint to load from `path`: a checkpoint directory itself (verified; an error if it is
// corrupt), or a checkpoints root, where the newest one that passes verification is chosen and
// every rejected one is passed to `rejected` with its path and the reason. nullopt: the root holds
// none. A path that is not a directory is an error naming it.
std::optional<std::string> find_valid_checkpoint(
    const std::string& path, const std::function<void(const std::string& dir, const std::string& reason)>& rejected);

}  // namespace megaton::ckpt
