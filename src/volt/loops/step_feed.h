// The batches a loop steps through, and how processes whose streams differ in length end together.
//
// A map-style loader gives every process the same number of batches, so a pass is a count. A
// stream (IterableDataset) does not: one process may run dry steps before another. Leaving the
// loop early would strand the others in their next collective (the gradient all-reduce, a
// sync_dist log), so every process steps until every stream is dry (PyTorch's Join): before each
// step the processes count how many still have a batch; a process without one runs its step on
// its replay batch at zero weight, so that its collectives still line up while its gradients
// count nothing, and the others' losses are scaled so that the average is the mean over the
// processes with data. The count for step i + 1 rides along with step i (started when the step
// takes its batch, read before its backward), so a step waits for nobody it did not wait for
// before.
#pragma once

#include <cstdint>
#include <optional>

#include "volt/base/collectives.h"
#include "volt/data/data_loader.h"

namespace volt {

/// What one step runs on.
struct StepInput {
  /// This process's batch, or its replay batch when its stream ran dry.
  Batch batch;
  /// True when this process has no batch of its own in this step: its step must count nothing.
  bool joined = false;
  /// The factor on this process's loss: processes / processes with data (1 when all have data),
  /// 0 when joined.
  double weight = 1.0;
};

/// The steps of one pass over a loader, agreed across processes for streams.
class StepFeed {
 public:
  /// Steps [first, end) of `loader`'s current epoch (unset `end`: to its end). For a stream
  /// over several processes, `collectives` counts the processes with data before each step
  /// (all_reduce_async); a map-style loader or one process makes no collective call.
  StepFeed(const DataLoader& loader, int64_t first, std::optional<int64_t> end, Collectives& collectives);

  /// Whether another step happens; every process gets the same answer. Throws volt::Error on
  /// every process when a stream leaves some process without any data in the pass.
  bool has_step();
  /// The next step's input (call after has_step() returned true).
  StepInput take();
  /// Whether the step just taken is the pass's last; for several streams this waits for the
  /// count started by take().
  bool last();
  /// True once the pass has no steps left (has_step() false, or last() true).
  bool finished() const { return finished_; }

 private:
  bool reached_end() const { return end_ && next_ >= *end_; }
  // Starts counting the processes that have a batch for step next_.
  void start_count();
  // Waits for that count (once per step) into with_data_.
  void read_count();

  BatchStream stream_;
  bool streaming_;
  Collectives& collectives_;
  int64_t world_size_;
  int64_t next_;
  std::optional<int64_t> end_;
  std::optional<int64_t> with_data_;         // processes with a batch for step next_
  std::optional<ReduceWork> pending_count_;  // the count for step next_, in flight
  bool finished_ = false;
};

}  // namespace volt
