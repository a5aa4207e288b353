// Callbacks: small objects that watch training and return decisions.
//
// A callback sees what it needs (a CallbackContext) and acts through a narrow interface
// (CallbackServices); it never holds the Trainer. Its only way to change the run is to return
// Decision::stop.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "volt/base/monitor_mode.h"
#include "volt/base/state_dict.h"

namespace volt {

/// What a callback wants the loop to do next.
struct Decision {
  /// Whether training should stop at the next safe point.
  bool stop = false;
  /// Why, for the FitResult (empty when continuing).
  std::string reason;

  /// Carry on.
  static Decision proceed() { return {}; }
  /// Stop training, for `why`.
  static Decision stop_training(std::string why) { return {true, std::move(why)}; }
};

/// A learning rate as LearningRateMonitor names it: "lr-Adam", "lr-SGD/pg1".
struct NamedLearningRate {
  /// The metric name.
  std::string name;
  /// The current value.
  double lr = 0.0;
};

/// Facts about the run, fixed for a whole fit(); given to Callback::setup.
struct FitInfo {
  /// Trainer's default_root_dir.
  std::string root_dir;
  /// The first logger's version directory; empty without loggers.
  std::string log_dir;
  /// Whether a validation loop will run.
  bool has_validation = false;
  /// Whether this process writes files (global rank 0).
  bool is_global_zero = true;
};

/// What a callback can read at a hook.
struct CallbackContext {
  /// The current epoch, 0-based.
  int64_t epoch = 0;
  /// Optimizer steps taken so far.
  int64_t global_step = 0;
  /// True during the sanity check (callbacks should not act on its metrics).
  bool sanity_checking = false;
  /// The callback metrics: everything logged, latest step values and epoch aggregates.
  const std::map<std::string, double>* metrics = nullptr;
  /// The current learning rates with their monitor names.
  std::vector<NamedLearningRate> learning_rates;
};

/// What a callback may ask the trainer to do.
class CallbackServices {
 public:
  virtual ~CallbackServices() = default;
  /// Saves a full checkpoint of the run now to `path` (atomically; every rank must call it).
  virtual void save_checkpoint(const std::string& path) = 0;
  /// Saves only the module's weights (with epoch, step, loops and hyperparameters) to `path`:
  /// Lightning's save_weights_only file, which loads weights but cannot resume a fit.
  virtual void save_weights_checkpoint(const std::string& path) = 0;
  /// Global rank 0's `decision`, returned on every process, so that a choice made on something
  /// that differs between processes (a clock) is the same everywhere. A collective: every
  /// process must call it at the same hook. One process: `decision` itself.
  virtual bool broadcast_decision(bool decision) = 0;
  /// Deletes a checkpoint this run wrote (rank 0 does the deleting).
  virtual void remove_checkpoint(const std::string& path) = 0;
  /// Sends metrics to the loggers at the current global step.
  virtual void log_metrics(const std::map<std::string, double>& metrics) = 0;
};

/// Base class of callbacks; every hook does nothing by default.
class Callback {
 public:
  virtual ~Callback() = default;
  /// The key of this callback's state in a checkpoint, e.g. "EarlyStopping{'monitor': 'val/loss', 'mode': 'min'}".
  virtual std::string state_key() const = 0;
  /// The key an older Volt saved this callback's state under, read when state_key() is absent
  /// (Lightning's `_legacy_state_key`); "" when there is none.
  virtual std::string legacy_state_key() const { return ""; }
  /// Once per fit, before training starts.
  virtual void setup(const FitInfo& info) {}
  /// At the start of each training epoch.
  virtual Decision on_train_epoch_start(const CallbackContext& context, CallbackServices& services) { return {}; }
  /// After each training batch (after the optimizer step, if one happened).
  virtual Decision on_train_batch_end(const CallbackContext& context, CallbackServices& services) { return {}; }
  /// After each training epoch, with that epoch's aggregated metrics.
  virtual Decision on_train_epoch_end(const CallbackContext& context, CallbackServices& services) { return {}; }
  /// After each validation run, with its metrics.
  virtual Decision on_validation_end(const CallbackContext& context, CallbackServices& services) { return {}; }
  /// After training stops.
  virtual void on_fit_end(const CallbackContext& context, CallbackServices& services) {}
  /// State to resume from (plain values only).
  virtual StateDict state_dict() const { return make_state_dict(); }
  /// Restores what state_dict returned.
  virtual void load_state_dict(const StateDict& state) {}
};

namespace internal {
/// Looks up `monitor` in `metrics`; throws volt::Error listing the available names with a HINT.
double monitored_value(const std::map<std::string, double>* metrics, const std::string& monitor,
                       const std::string& who);
/// A score saved in a callback's state: a number (older Volt) or a one-element tensor (Lightning,
/// which compares it with torch.lt/gt and so needs a tensor).
double score_value(const c10::IValue& value);
/// `score` as Lightning saves a score: a 0-dim float64 tensor (exact for a double).
at::Tensor score_tensor(double score);
}  // namespace internal

}  // namespace volt
