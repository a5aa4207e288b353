// Lightning's Timer: measures the time training takes and stops it, with a checkpoint, when a
// duration is spent (the Trainer's max_time adds one).
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "volt/callbacks/callback.h"

namespace volt {

/// When the Timer compares the time spent with its duration.
enum class TimerInterval { kStep, kEpoch };
/// "step" or "epoch".
const char* to_string(TimerInterval interval);

/// Options of Timer.
///
/// Example: `Timer({.duration = std::chrono::hours(12)})`.
struct TimerOptions {
  /// How long training may run (Lightning's `duration`); unset: the Timer only measures.
  std::optional<std::chrono::duration<double>> duration;
  /// Check after every training batch (kStep: stops within one step of the limit) or at each
  /// epoch's end.
  TimerInterval interval = TimerInterval::kStep;
  /// Print a line when the time is up.
  bool verbose = true;
  /// Save a checkpoint when training stops because the time is up, so that
  /// `fit(..., ckpt_path="last")` continues the run: Lightning's runs stop through a
  /// validation and ModelCheckpoint, which need not save at a stop inside an epoch.
  bool save_checkpoint = true;
  /// The folder of that checkpoint; empty: ModelCheckpoint's default (`<log_dir>/checkpoints`, or
  /// `<default_root_dir>/checkpoints` without a logger).
  std::string dirpath;
  /// Its file name; "last.ckpt" is what ckpt_path="last" looks for first.
  std::string filename = "last.ckpt";
};

/// Lightning's Timer: counts the training time of a fit (from its train start to its train end,
/// validation inside fit included), adds the time a resumed checkpoint recorded, and when
/// `duration` is spent stops training and saves a checkpoint. Every process acts on global rank
/// 0's clock, so all of them stop at the same step.
class Timer : public Callback {
 public:
  /// The time source (std::chrono::steady_clock::now by default; tests pass a fake).
  using Clock = std::function<std::chrono::steady_clock::time_point()>;

  /// Throws volt::Error for a duration that is not positive or a filename without ".ckpt".
  explicit Timer(TimerOptions options = {}, Clock clock = nullptr);

  std::string state_key() const override { return "Timer"; }
  void setup(const FitInfo& info) override;
  Decision on_train_start(const CallbackContext& context, CallbackServices& services) override;
  Decision on_train_batch_end(const CallbackContext& context, CallbackServices& services) override;
  Decision on_train_epoch_end(const CallbackContext& context, CallbackServices& services) override;
  Decision on_train_end(const CallbackContext& context, CallbackServices& services) override;
  /// Lightning's layout: `{"time_elapsed": {"train": seconds}}`.
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;

  /// Seconds of training so far: those a resumed checkpoint recorded plus this fit's (up to its
  /// train end once it ended).
  double time_elapsed() const;
  /// Seconds left of `duration`; unset without one.
  std::optional<double> time_remaining() const;
  /// The options the Timer runs with.
  const TimerOptions& options() const { return options_; }
  /// The checkpoint saved when the time ran out; empty if none was.
  const std::string& checkpoint_path() const { return checkpoint_path_; }

 private:
  Decision check(const CallbackContext& context, CallbackServices& services);

  TimerOptions options_;
  Clock clock_;
  std::string dirpath_;
  double offset_ = 0.0;  // seconds restored from a checkpoint
  std::optional<std::chrono::steady_clock::time_point> start_;
  std::optional<std::chrono::steady_clock::time_point> end_;
  bool time_up_ = false;
  std::string checkpoint_path_;
};

}  // namespace volt
