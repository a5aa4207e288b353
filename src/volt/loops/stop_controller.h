// Why and when a fit stops, decided so that every process stops at the same step.
//
// A stop can start on one process only (a signal, a callback deciding on unsynchronized
// metrics); if that process left the loop alone, the others would block in their next
// collective. The controller keeps this process's proposal apart from the decision every
// process acts on, and turns proposals into decisions through the run's Collectives (MAX of the
// StopCode across processes), so it is unit-tested with fake ones, without processes.
#pragma once

#include <optional>
#include <string>

#include "volt/base/collectives.h"
#include "volt/loops/fit_result.h"

namespace volt {

/// What asked for a stop, ordered so that the processes' maximum is what every process does: a
/// requeue outranks a SIGTERM (both save an HPC checkpoint; the requeue also restarts the job),
/// which outranks Ctrl-C, which outranks a callback's normal stop.
enum class StopCode : int { kNone = 0, kCallback = 1, kInterrupt = 2, kTerminate = 3, kRequeue = 4 };
/// "none", "callback", "interrupt", "terminate", "requeue".
const char* to_string(StopCode code);

/// Collects stop proposals and turns them into the decision every process acts on.
///
/// Limits (max_epochs, max_steps) are the same on every process and stop at once; everything
/// else is a proposal until agree() (blocking) or the next agree_async() (one step later, with
/// no wait on the critical path) makes it the decision on every process.
class StopController {
 public:
  /// Callback stops are ignored until `min_epochs` epochs are complete and `min_steps` optimizer
  /// steps are taken (Lightning's rule).
  explicit StopController(int64_t min_epochs = 0, int64_t min_steps = 0)
      : min_epochs_(min_epochs), min_steps_(min_steps) {}

  /// A callback (or the module) asks to stop during `epoch` (0-based), after `global_step`
  /// optimizer steps, for `why`. Before min_epochs and min_steps are reached it is dropped, not
  /// kept for later: a callback that still wants to stop asks again at its next check (as
  /// EarlyStopping does while its patience stays exhausted), and a resumed run decides the same.
  void propose_callback_stop(int64_t epoch, int64_t global_step, std::string why);
  /// A signal asks to stop; replaces a weaker proposal (`code` is kInterrupt or stronger).
  void propose_interrupt(StopCode code, std::string why);
  /// A limit every process reaches at the same step: decided at once, no agreement needed.
  void stop_at_limit(StopReason limit);

  /// Blocking agreement: waits for a reduction started by agree_async(), then reduces the
  /// current proposal (MAX) over `collectives`. One process's local collectives cost nothing.
  void agree(Collectives& collectives);
  /// Non-blocking agreement: acts on the reduction started one call earlier (whose result has
  /// had a whole step to arrive) and starts one for the current proposal
  /// (Collectives::all_reduce_async). Every process calls it at the same step boundaries, so all
  /// of them act on a proposal at the same step, one step after it was made.
  void agree_async(Collectives& collectives);

  /// True once every process has decided to stop.
  bool should_stop() const { return decided_ != StopCode::kNone || limit_; }
  /// What was decided (kNone for a limit or no stop).
  StopCode code() const { return decided_; }
  /// Why the run stopped, for FitResult (kMaxEpochs until something stops it).
  StopReason reason() const { return reason_; }
  /// The explanation, e.g. "received signal 15" or the callback's reason.
  const std::string& message() const { return message_; }
  /// A requeue or SIGTERM that arrives as the run completes anyway becomes a normal finish at
  /// `limit`: a restarted job would find nothing left to do. Final: later agreements change
  /// nothing.
  void finish_at(StopReason limit);

 private:
  // Waits for the reduction agree_async started, if any, and decides on its result.
  void settle_pending();
  void decide(StopCode agreed);

  int64_t min_epochs_;
  int64_t min_steps_;
  StopCode proposed_ = StopCode::kNone;
  std::string proposed_why_;
  StopCode decided_ = StopCode::kNone;
  bool limit_ = false;
  bool finished_ = false;
  StopReason reason_ = StopReason::kMaxEpochs;
  std::string message_;
  std::optional<ReduceWork> pending_;  // started by agree_async, read by the next agreement
};

}  // namespace volt
