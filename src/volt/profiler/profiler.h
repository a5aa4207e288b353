// Where a run's time goes: Volt's actions (data fetch, forward, backward, the wait for gradient
// synchronization, the optimizer step, validation, checkpoint saves, ...) timed on every process,
// summed per stage, and what each profiler kind makes of them (Lightning's `profiler=`).
//
// The loops time their actions always: a few clock reads per step (well under 1% of a small
// step), which the straggler report needs whether or not a profiler was asked for. This header
// is torch-free; the LibTorch trace lives behind `TraceRecorder` in profiler.cpp.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "volt/options/option_enums.h"

namespace volt {

/// What the loops time. kTrainStep is one training batch from fetching it to the end of its
/// hooks; the parts that follow it (through kLogging) add up to it up to the loop's own
/// bookkeeping. The rest happen around steps (kValidation, the evaluation loop's actions) or
/// inside one of the parts (kCheckpointSave runs inside kHooks).
enum class Action : uint8_t {
  kTrainStep,       ///< "train_step": one training batch, all of it
  kDataFetch,       ///< "data_fetch": the next batch from the loader (waiting for its workers)
  kTransfer,        ///< "batch_transfer": the batch to the device (and the transfer hooks)
  kForward,         ///< "forward": training_step (under autocast)
  kBackward,        ///< "backward": the backward pass, less its wait for the gradient all-reduce
  kGradSync,        ///< "gradient_sync_wait": what backward waited for the gradients' synchronization
  kOptimizerStep,   ///< "optimizer_step": clip, step, zero_grad and step-interval schedulers
  kHooks,           ///< "hooks": the batch's callbacks and module hooks, the stop agreement
  kLogging,         ///< "logging": step metrics to the loggers and the progress bar
  kValidation,      ///< "validation": a whole validation run inside fit
  kEvalDataFetch,   ///< "eval_data_fetch": the next batch of a validation, test or predict loader
  kEvalStep,        ///< "eval_step": validation_step, test_step or predict_step
  kCheckpointSave,  ///< "checkpoint_save": writing a checkpoint (inside the hook that asked for it)
  kCount,           ///< the number of actions (not an action)
};
/// The number of actions.
inline constexpr size_t kActionCount = static_cast<size_t>(Action::kCount);
/// The action's name in tables, files and traces ("data_fetch", ...).
const char* to_string(Action action);
/// The parts of a training step, in the order they happen; their sum is the step up to the
/// loop's bookkeeping ("other" in the breakdown).
inline constexpr Action kStepParts[] = {Action::kDataFetch, Action::kTransfer,      Action::kForward, Action::kBackward,
                                        Action::kGradSync,  Action::kOptimizerStep, Action::kHooks,   Action::kLogging};

/// Count, total, fastest and slowest of one action's timings, in seconds.
struct ActionStats {
  int64_t count = 0;  ///< times the action ran
  double total = 0;   ///< seconds in all
  double min = 0;     ///< the fastest (0 while count is 0)
  double max = 0;     ///< the slowest
  /// Adds one timing.
  void add(double seconds);
  /// Seconds per run (0 while count is 0).
  double mean() const { return count > 0 ? total / static_cast<double>(count) : 0.0; }
};

/// Every action's statistics over some span (a stage, or the straggler report's window).
struct ProfileStats {
  std::array<ActionStats, kActionCount> actions{};  ///< indexed by Action
  /// The statistics of `action`.
  ActionStats& operator[](Action action) { return actions[static_cast<size_t>(action)]; }
  /// The statistics of `action`.
  const ActionStats& operator[](Action action) const { return actions[static_cast<size_t>(action)]; }
};

/// A training step's mean split into its parts (kStepParts), in seconds.
struct StepBreakdown {
  double step = 0;                               ///< the measured step's mean
  std::vector<std::pair<Action, double>> parts;  ///< each part that ran: its time per step
  double other = 0;                              ///< step minus the parts (bookkeeping)
};
/// The breakdown of `stats`' training steps: each part's total over the steps' count (parts
/// that never ran are left out).
StepBreakdown step_breakdown(const ProfileStats& stats);

/// The simple profiler's report of one process: a table of every action that ran (mean, count,
/// total, share of the stage's wall time) and the step breakdown.
std::string format_profile(const ProfileStats& stats, const std::string& stage, double stage_seconds);
/// Every process's means side by side, one column per rank (ranks named with their hosts), or
/// min / median / max and the slowest rank past 8 processes, so a slow process stands out.
std::string format_profile_across_ranks(const std::vector<ProfileStats>& ranks, const std::vector<std::string>& hosts);
/// `stats` as text that decode_profile_stats reads back (what the processes exchange).
std::string encode_profile_stats(const ProfileStats& stats);
/// The statistics encode_profile_stats wrote; throws volt::Error on anything else.
ProfileStats decode_profile_stats(const std::string& text);

class TraceRecorder;

/// Times the loops' actions for one stage and, under profiler="pytorch", traces a window of
/// steps with LibTorch's profiler (Volt's actions as named ranges in the trace).
class Profiler {
 public:
  using Clock = std::chrono::steady_clock;

  /// `kind` unset: timing only. `wait`, `warmup`, `active`: the trace's schedule in steps.
  explicit Profiler(std::optional<ProfilerKind> kind = std::nullopt, int64_t wait = 1, int64_t warmup = 1,
                    int64_t active = 3);
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  /// Times `action` from construction to destruction; while a trace records, it is also a named
  /// range ("volt/forward") in the trace.
  class Scope {
   public:
    Scope(Profiler& profiler, Action action);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    /// Seconds since construction.
    double elapsed() const;
    /// Leaves `seconds` out of what this scope records: a part inside it timed as another action
    /// (backward's wait for the all-reduce), so the two never count the same time twice.
    void exclude(double seconds) { excluded_ += seconds; }

   private:
    Profiler& profiler_;
    Action action_;
    Clock::time_point start_;
    double excluded_ = 0;
    std::unique_ptr<struct TraceRange> range_;
  };

  /// Adds one timing of `action` to the stage's and the window's statistics.
  void record(Action action, double seconds);
  /// Begins a stage ("fit", "validate", "test", "predict"): clears the statistics; under
  /// profiler="pytorch" the trace's schedule starts, its file `trace_path`.
  void start_stage(const std::string& stage, const std::string& trace_path);
  /// One step (a training or evaluation batch) is done: moves the trace's schedule on.
  void step_done();
  /// Ends the stage: a trace still recording is written with the steps it has. Returns the
  /// stage's wall time in seconds.
  double end_stage();
  /// The current stage's statistics.
  const ProfileStats& stats() const { return stage_; }
  /// The statistics since the previous call (the straggler report's window); starts a new one.
  ProfileStats take_window();
  /// What was asked for (unset: timing only).
  std::optional<ProfilerKind> kind() const { return kind_; }
  /// The stage begun last ("" before any).
  const std::string& stage() const { return stage_name_; }
  /// The trace file written by the last end_stage() or step_done() ("" when none).
  const std::string& trace_written() const { return trace_written_; }

 private:
  std::optional<ProfilerKind> kind_;
  int64_t wait_;
  int64_t warmup_;
  int64_t active_;
  ProfileStats stage_;
  ProfileStats window_;
  std::string stage_name_;
  Clock::time_point stage_start_;
  std::string trace_path_;
  std::string trace_written_;
  int64_t steps_ = 0;  // steps done in this stage, for the trace's schedule
  std::unique_ptr<TraceRecorder> trace_;
  bool tracing_ = false;  // a trace records (warm-up or active): scopes open named ranges
};

}  // namespace volt
