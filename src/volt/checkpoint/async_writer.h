// Checkpoints written in the background: the training thread copies the state to host memory at
// a step boundary, and one writer thread serializes and writes it while training goes on.
#pragma once

#include <ATen/core/ivalue.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

namespace volt {

/// A copy of `value` in which every tensor is a CPU tensor with memory of its own (lists, dicts
/// and tuples rebuilt, other values shared): what a background thread may serialize while
/// training changes the originals. The copy is the stall a background write costs the step.
c10::IValue host_copy(const c10::IValue& value);

/// What an AsyncWriter has done so far.
struct AsyncWriterStats {
  /// Writes completed (failed ones included).
  int64_t writes = 0;
  /// Seconds the writer thread spent writing, in total.
  double write_seconds = 0.0;
  /// Seconds the training thread waited for a write in flight (submit and wait), in total.
  double waited_seconds = 0.0;
};

/// One background thread that runs writes one at a time, at most one in flight.
///
/// A write's error is kept and rethrown by the next submit() or wait(), on the training thread,
/// so a failed write fails the run as a synchronous one would (the file it was writing is left
/// as it was; see write_file_atomically). The destructor lets a write in flight finish: a fit
/// that throws still completes its newest snapshot.
class AsyncWriter {
 public:
  /// Starts the thread.
  AsyncWriter();
  /// Waits for the write in flight, drops its error, and stops the thread.
  ~AsyncWriter();
  AsyncWriter(const AsyncWriter&) = delete;
  AsyncWriter& operator=(const AsyncWriter&) = delete;

  /// Whether a write is in flight now.
  bool busy() const;
  /// Waits for the write in flight (rethrowing its error), then hands `write` to the thread
  /// and returns at once.
  void submit(std::function<void()> write);
  /// Waits until no write is in flight; rethrows the error of one that failed.
  void wait();
  /// What was done so far.
  AsyncWriterStats stats() const;

 private:
  void run();
  void wait_locked(std::unique_lock<std::mutex>& lock);

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::optional<std::function<void()>> pending_;
  bool writing_ = false;
  bool stopping_ = false;
  std::exception_ptr error_;
  AsyncWriterStats stats_;
  std::thread thread_;
};

}  // namespace volt
