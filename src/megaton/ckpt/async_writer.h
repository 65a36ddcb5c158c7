// Runs checkpoint writes off the training thread, one at a time. The trainer snapshots its state
// into host buffers and hands the write here, so a step pays only for the copy; the next save
// first waits for this one (at most one in flight, so one set of buffers suffices). A failed
// write is retried, each failure reported on stderr; a write that fails every attempt is raised
// on the training thread at its next submit() or wait(), never dropped.
#pragma once
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace megaton::ckpt {

struct WriteReport {
  std::string what;        // e.g. "checkpoint step_000010"
  double start_time = 0;   // wall clock, seconds since the Unix epoch
  double end_time = 0;
  int attempts = 0;
};

class AsyncWriter {
 public:
  // async = false: submit() runs the job on the caller's thread, with the same retries.
  AsyncWriter(bool async, int max_attempts);
  ~AsyncWriter();  // awaits the job in flight; a failure at that point is printed on stderr
  AsyncWriter(const AsyncWriter&) = delete;
  AsyncWriter& operator=(const AsyncWriter&) = delete;

  // Waits for the job in flight, then starts `job` (which must be safe to run again after it
  // throws). Throws if the previous job failed on every attempt.
  void submit(std::string what, std::function<void()> job);
  // Blocks until no job is in flight; throws if that job failed on every attempt.
  void wait();
  // Jobs completed since the last call, oldest first (for the caller's log).
  std::vector<WriteReport> take_finished();

 private:
  void run(const std::string& what, const std::function<void()>& job);
  void raise_failure();

  bool async_;
  int max_attempts_;
  std::thread thread_;
  std::mutex mutex_;  // guards finished_ and failure_, written by the writer thread
  std::vector<WriteReport> finished_;
  std::string failure_;
};

}  // namespace megaton::ckpt
