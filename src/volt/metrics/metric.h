// A metric that accumulates state over many batches and computes one value over all of them,
// on one process or synced across the processes of a run (torchmetrics' Metric for C++).
//
// A subclass declares its states in its constructor, each with the reduction that combines the
// processes' copies (sum, mean, max, min, or concatenation for per-example values), changes them
// in update_state(), and turns the synced states into the value in compute_from(). compute()
// syncs a copy of the states, so updates may continue after it; the local states are what a
// checkpoint saves.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "volt/base/collectives.h"
#include "volt/base/state_dict.h"

namespace volt {

/// How the processes' copies of one metric state become one at compute().
enum class StateReduce {
  kSum,   ///< element-wise sum (counts, sums of errors)
  kMean,  ///< element-wise mean of the processes' values (not weighted by their examples)
  kMax,   ///< element-wise maximum
  kMin,   ///< element-wise minimum
  kCat,   ///< rows concatenated in rank order (per-example scores; each process's count may differ)
};
/// The name of `reduce` ("sum", "mean", "max", "min", "cat").
const char* to_string(StateReduce reduce);
/// Parses a StateReduce name; throws volt::Error listing the accepted names.
StateReduce parse_state_reduce(std::string_view text);

/// A metric accumulated over batches: update() per batch, compute() for the value, reset() to
/// start over. Not copyable (its states are tensors a copy would share).
///
/// compute() is a collective under ddp: every process must call it, the same number of times
/// and for the same metrics in the same order, also a process that saw no data.
class Metric {
 public:
  /// The synced states compute_from() reads, by name; a kCat state is one tensor of all rows.
  using States = std::map<std::string, torch::Tensor>;

  /// A metric named `name` (used in messages and checked when a checkpoint is loaded).
  explicit Metric(std::string name);
  virtual ~Metric() = default;
  Metric(const Metric&) = delete;
  Metric& operator=(const Metric&) = delete;

  /// Adds one batch: checks the inputs and changes the local states (no communication). Safe to
  /// call from several threads at once (dp's replicas on the CPU share one module). Does nothing
  /// while a DiscardMetricUpdates scope lives: a process that ran out of data repeats a step only
  /// to keep its collectives in line, and that step's examples must not count twice.
  void update(const torch::Tensor& preds, const torch::Tensor& target);
  /// The metric over every update on every process since the last reset(): syncs a copy of the
  /// states through `collectives` and computes from it. The local states are left as they were,
  /// so updates may continue. With no collectives (one process) nothing is communicated.
  torch::Tensor compute(Collectives& collectives = local_collectives());
  /// Every state back to its default, and update_count() to 0.
  void reset();

  /// The metric's name, e.g. "MulticlassAccuracy".
  const std::string& name() const { return name_; }
  /// How many update() calls this process made since the last reset().
  int64_t update_count() const { return update_count_; }

  /// This process's local states and update count, for a checkpoint (resume on the same
  /// number of processes). kCat states are saved concatenated.
  StateDict state_dict() const;
  /// Restores what state_dict() returned; throws volt::CheckpointError when a state is missing
  /// or has another dtype or shape (another metric, other options).
  void load_state_dict(const StateDict& state);

  /// Every process's state_dict(), as {"metric", "world_size", "ranks": [rank 0's, rank 1's, ...]},
  /// on every process: what rank 0 saves so that a resume restores each rank's states. A
  /// collective: every process must call it.
  StateDict gathered_state_dict(Collectives& collectives) const;
  /// Restores what gathered_state_dict() returned. With as many processes as were saved, each
  /// restores its own states exactly. With another number, rank 0 takes all saved processes'
  /// states folded into one (sums added, maxima and minima taken, rows concatenated in rank
  /// order, update counts added) and the other ranks start from the defaults, so that compute()
  /// gives the saved value; a kMean state cannot be folded, and throws volt::CheckpointError.
  /// No communication.
  void load_gathered_state_dict(const StateDict& state, const Collectives& collectives);

 protected:
  /// Declares a state (in the constructor). `default_value` is its value after reset(), and
  /// must be the identity of `reduce` (0 for kSum, the lowest value for kMax, ...), since a
  /// process without data contributes its default. For kCat it is an empty tensor (0 rows)
  /// whose dtype and other dimensions every appended row must have.
  void add_state(const std::string& name, const torch::Tensor& default_value, StateReduce reduce);
  /// A kSum/kMean/kMax/kMin state's local value, to change in update_state().
  torch::Tensor& state(const std::string& name);
  /// Appends rows to a kCat state (converted to its dtype; the other dimensions must match).
  void append(const std::string& name, const torch::Tensor& rows);

  /// Checks one batch and changes the local states; called by update().
  virtual void update_state(const torch::Tensor& preds, const torch::Tensor& target) = 0;
  /// The metric's value from synced states.
  virtual torch::Tensor compute_from(const States& states) const = 0;

 private:
  struct State {
    std::string name;
    StateReduce reduce;
    torch::Tensor default_value;
    torch::Tensor value;              // kSum/kMean/kMax/kMin
    std::vector<torch::Tensor> rows;  // kCat: appended per update, concatenated when read
  };
  State& find(const std::string& name);
  /// A kCat state's rows as one tensor (its empty default when there are none).
  static torch::Tensor concatenated(const State& state);
  /// The states synced through `collectives`, one collective per (reduction, dtype) group of
  /// reduced states and one all_gather per kCat state.
  States synced(Collectives& collectives) const;
  void load_local(const StateDict& state, const std::string& where);

  std::string name_;
  std::vector<State> states_;  // declaration order, which is every process's collective order
  int64_t update_count_ = 0;
  std::mutex update_mutex_;  // update() from dp's replica threads
};

namespace internal {
/// While one lives, Metric::update() changes nothing in any metric of this process: the loops
/// hold one around a step a process repeats only to stay in step with the others (its real data
/// ran out), so each example is counted once. Process-wide, not per thread: dp runs that step's
/// pieces on threads of its own.
class DiscardMetricUpdates {
 public:
  /// Starts discarding (scopes nest).
  DiscardMetricUpdates();
  ~DiscardMetricUpdates();
  DiscardMetricUpdates(const DiscardMetricUpdates&) = delete;
  DiscardMetricUpdates& operator=(const DiscardMetricUpdates&) = delete;
};
}  // namespace internal

}  // namespace volt
