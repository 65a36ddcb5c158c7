#include "megaton/ckpt/async_writer.h"

#include <chrono>
#include <cstdio>
#include <exception>
#include <utility>

#include "megaton/core/error.h"

namespace megaton::ckpt {

namespace {

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

AsyncWriter::AsyncWriter(bool async, int max_attempts) : async_(async), max_attempts_(max_attempts) {
  MEGATON_CHECK(max_attempts_ >= 1, "checkpoint writes need at least one attempt, got ", max_attempts_);
}

AsyncWriter::~AsyncWriter() {
  if (thread_.joinable()) thread_.join();
  if (!failure_.empty()) std::fprintf(stderr, "error: %s\n", failure_.c_str());
}

void AsyncWriter::submit(std::string what, std::function<void()> job) {
  wait();
  if (!async_) {
    run(what, job);
    raise_failure();
    return;
  }
  thread_ = std::thread([this, what = std::move(what), job = std::move(job)] { run(what, job); });
}

void AsyncWriter::wait() {
  if (thread_.joinable()) thread_.join();
  raise_failure();
}

std::vector<WriteReport> AsyncWriter::take_finished() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(finished_, {});
}

void AsyncWriter::run(const std::string& what, const std::function<void()>& job) {
  WriteReport report{what, wall_time(), 0, 0};
  std::string error;
  for (report.attempts = 1;; ++report.attempts) {
    try {
      job();
      break;
    } catch (const std::exception& e) {
      if (report.attempts >= max_attempts_) {
        error = "writing " + what + " failed after " + std::to_string(report.attempts) + " attempts: " + e.what();
        break;
      }
      // A full disk or a flaky network file system often recovers; back off a little longer
      // each time rather than hammering it.
      const auto delay = std::chrono::milliseconds(250 * report.attempts);
      std::fprintf(stderr, "warning: writing %s failed (attempt %d of %d): %s; retrying in %.2f s\n", what.c_str(),
                   report.attempts, max_attempts_, e.what(), std::chrono::duration<double>(delay).count());
      std::this_thread::sleep_for(delay);
    }
  }
  report.end_time = wall_time();
  std::lock_guard<std::mutex> lock(mutex_);
  if (error.empty())
    finished_.push_back(std::move(report));
  else
    failure_ = std::move(error);
}

void AsyncWriter::raise_failure() {
  std::string error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error = std::exchange(failure_, {});
  }
  if (!error.empty()) throw Error(error);
}

}  // namespace megaton::ckpt
