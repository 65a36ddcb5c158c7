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

#include "megaton/ckpt/manifest.h"

namespace megaton::ckpt {

inline constexpr const char* kLatestName = "latest";

std::string checkpoint_name(int64_t step);  // "step_000123"

// The two halves of a save that several processes write into: prepare_checkpoint creates
// ROOT/step_N.tmp/ afresh (a leftover of an interrupted save of that step is cleared) and returns
// it; once every file is in it, finish_checkpoint adds the manifest (files in `known` with the
// digests given), renames the directory to ROOT/step_N (replacing an older one of that step),
// points ROOT/latest at it (atomic replace), then removes all but the newest keep_last
// checkpoints (0: keep all; checkpoints moved aside are not counted and never removed).
std::string prepare_checkpoint(const std::string& root, int64_t step);
// ROOT/step_N.tmp: where prepare_checkpoint puts a save in progress.
std::string temporary_checkpoint_dir(const std::string& root, int64_t step);
void finish_checkpoint(const std::string& root, int64_t step, const std::vector<FileDigest>& known, int64_t keep_last);
// Both, with write_files filling the directory in between: a save by one process. Safe to call
// again after a failure.
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
