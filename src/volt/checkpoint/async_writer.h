// Checkpoints written in the background: the training thread copies the state to host memory at
// a step boundary, and one writer thread serializes and writes it while training goes on.
#pragma once

#include <ATen/core/ivalue.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace volt {

/// A copy of `value` in which every tensor is a CPU tensor with memory of its own (lists, dicts
/// and tuples rebuilt, other values shared): what a background thread may serialize while
/// training changes the originals. The copy is the stall a background write costs the step. A
/// tensor met twice (the same view of the same memory) is copied once and stays one tensor.
c10::IValue host_copy(const c10::IValue& value);

/// Host memory that one snapshot after another is copied into. A fresh copy of a large state
/// spends most of its time faulting in new pages; writing into the buffers of the previous
/// snapshot (same tensors in the same order, as a training state is from step to step) is a plain
/// copy. Tensors on a GPU go to pinned buffers, copied without blocking: the copies are queued on
/// the device's current stream (training's next kernels queue behind them, so they read the
/// state of this step), and an event recorded after them tells the writer when the buffers are
/// complete. The caller must not copy while a write of the previous copy is still reading the
/// buffers (AsyncWriter::wait first).
class HostBuffers {
 public:
  HostBuffers();
  ~HostBuffers();
  HostBuffers(const HostBuffers&) = delete;
  HostBuffers& operator=(const HostBuffers&) = delete;

  /// A copy of `value` as host_copy makes it, whose tensors are this object's buffers: the i-th
  /// tensor (counting a tensor met twice once) reuses the i-th buffer of the previous copy when
  /// its size and dtype are the same.
  /// Tensors on a GPU may still be on their way when it returns: wait_copied() before reading.
  c10::IValue copy(const c10::IValue& value);
  /// Blocks until the device-to-host copies of the last copy() are complete (at once when every
  /// tensor was on the CPU). Any thread; the writer calls it before it serializes.
  void wait_copied();
  /// Bytes held in buffers.
  int64_t bytes() const;

 private:
  std::vector<at::Tensor> buffers_;
  std::vector<bool> pinned_;  // whether buffers_[i] is pinned (it took a GPU tensor's copy)
  // One event per device whose tensors were copied without blocking (opaque: c10::Event).
  struct Pending;
  std::unique_ptr<Pending> pending_;
};

/// What an AsyncWriter has done so far.
struct AsyncWriterStats {
  /// Writes completed (failed ones included).
  int64_t writes = 0;
  /// Seconds the writer thread spent writing, in total.
  double write_seconds = 0.0;
  /// Seconds the training thread waited for a write in flight (submit and wait), in total.
  double waited_seconds = 0.0;
};

/// One background thread that runs tasks in the order given: writes, at most one queued or in
/// flight, and the small tasks that must follow them (deleting the checkpoints a write replaces).
///
/// A task's error is kept and rethrown by the next submit() or wait(), on the training thread,
/// so a failed write fails the run as a synchronous one would (the file it was writing is left
/// as it was; see write_file_atomically). The destructor lets the queued tasks finish: a fit that
/// throws still completes its newest snapshot.
class AsyncWriter {
 public:
  /// Starts the thread.
  AsyncWriter();
  /// Runs what is queued, drops its error, and stops the thread.
  ~AsyncWriter();
  AsyncWriter(const AsyncWriter&) = delete;
  AsyncWriter& operator=(const AsyncWriter&) = delete;

  /// Whether a task is queued or running now.
  bool busy() const;
  /// Waits until every queued task is done (rethrowing an error), then queues `write` and returns
  /// at once.
  void submit(std::function<void()> write);
  /// Queues `task` behind what is queued, without waiting: it runs once the writes before it are
  /// done (a removal that must not come before the checkpoint that replaces it).
  void then(std::function<void()> task);
  /// Waits until every queued task is done; rethrows the error of one that failed.
  void wait();
  /// What was done so far.
  AsyncWriterStats stats() const;

 private:
  void run();
  void wait_locked(std::unique_lock<std::mutex>& lock);

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> queue_;
  bool running_ = false;
  bool stopping_ = false;
  std::exception_ptr error_;
  AsyncWriterStats stats_;
  std::thread thread_;
};

}  // namespace volt
