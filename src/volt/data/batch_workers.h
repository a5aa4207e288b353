// Threads that make a loader's batches ahead of the step (DataLoaderOptions::num_workers).
//
// Threads, not processes: a batch is made by the same code that would make it on the step's
// thread, with nothing pickled or copied between address spaces, and a batch's content depends
// only on its index (the loader's order is a pure function of seed and epoch). So workers change
// when a batch is made, never what it holds: a run with 4 workers ends bit-identical to one with 0.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "volt/data/batch.h"

namespace volt::internal {

/// A fixed set of threads that makes batches [first, end) of one pass at a time, at most `ahead`
/// batches beyond the one the consumer waits for, and hands them out in index order.
class BatchWorkers {
 public:
  /// Starts `num_workers` (>= 1) idle threads.
  explicit BatchWorkers(int64_t num_workers);
  /// Cancels the current pass and joins the threads.
  ~BatchWorkers();
  BatchWorkers(const BatchWorkers&) = delete;
  BatchWorkers& operator=(const BatchWorkers&) = delete;

  /// Starts a pass over batches [first, end), each made by `make` (called from the worker
  /// threads, several at once); a pass still running is cancelled first. `describe` names a
  /// batch in errors (e.g. "batch 17 of epoch 3").
  void start(std::function<Batch(int64_t)> make, std::function<std::string(int64_t)> describe, int64_t first,
             int64_t end, int64_t ahead);
  /// Waits for batch `index`, the next one in order, and returns it. A worker's exception comes
  /// out here, once, as volt::Error naming the batch and the worker; the pass stops then.
  Batch take(int64_t index);
  /// Stops the current pass: batches being made are dropped when done, none are started.
  void cancel();
  /// Whether a pass is running (started, not finished or cancelled).
  bool busy() const;

 private:
  struct Made {
    Batch batch;
    std::string error;  // non-empty: making the batch threw this
  };
  void work(int64_t worker);

  mutable std::mutex mutex_;
  std::condition_variable work_ready_;   // a worker may start a batch, or must exit
  std::condition_variable batch_ready_;  // a batch (or an error) was made
  std::function<Batch(int64_t)> make_;
  std::function<std::string(int64_t)> describe_;
  int64_t pass_ = 0;  // counts passes, so a batch of a cancelled pass is recognised and dropped
  bool running_ = false;
  bool failed_ = false;
  bool exiting_ = false;
  int64_t next_ = 0;   // the next batch a worker starts
  int64_t end_ = 0;    // one past the last batch of the pass
  int64_t taken_ = 0;  // the next batch the consumer takes
  int64_t ahead_ = 1;
  std::map<int64_t, Made> made_;
  std::vector<std::thread> threads_;
};

}  // namespace volt::internal
