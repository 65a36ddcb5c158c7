// The run directory (logging.run_dir) before a run writes into it. It must be a directory, or
// creatable, on a file system this process can write (found at the start, not when the first
// checkpoint or the final model is due). And it may hold an earlier run's results (metrics,
// final model, checkpoints), which a fresh run must not silently replace: that takes --resume to
// continue the run or --overwrite to start over in its place.
#pragma once
#include <string>
#include <vector>

namespace megaton::train {

// Fails naming logging.run_dir when the run could not write there: a file in its place or in
// the place of a directory above it, or a directory this process cannot create entries in (a
// read-only file system, missing permissions). Creates nothing.
void check_run_dir_writable(const std::string& run_dir);

// What an earlier run left in run_dir, for messages: "metrics.jsonl", "final/", "checkpoints/"
// (when it holds a checkpoint, complete, torn or moved aside). Empty when there is none.
std::vector<std::string> previous_results(const std::string& run_dir);

// --overwrite: removes an earlier run's metrics, config, final model, checkpoints and record of
// injected faults. Checkpoints that were moved aside as corrupt are kept: no run deletes those.
void clear_previous_results(const std::string& run_dir);

}  // namespace megaton::train
