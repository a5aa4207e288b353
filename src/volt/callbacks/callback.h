// Callbacks: small objects that watch training and return decisions.
//
// A callback sees what it needs (a CallbackContext) and acts through a narrow interface
// (CallbackServices); it never holds the Trainer. Its only way to change the run is to return
// Decision::stop.
#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "volt/base/interval.h"
#include "volt/base/monitor_mode.h"
#include "volt/base/state_dict.h"

namespace torch {
class Tensor;
namespace optim {
class Optimizer;
}  // namespace optim
}  // namespace torch

namespace volt {

class LightningModule;
struct Batch;

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
  /// When the scheduler that sets it steps (kStep when any of its optimizer's schedulers steps
  /// per optimizer step); unset: no scheduler changes it.
  std::optional<Interval> interval;
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
  /// TrainerOptions::max_epochs; unset when unlimited.
  std::optional<int64_t> max_epochs;
  /// How many learning-rate schedulers configure_optimizers returned.
  size_t num_lr_schedulers = 0;
  /// TrainerOptions::log_every_n_steps: step values are logged every this many optimizer steps.
  int64_t log_every_n_steps = 50;
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
  /// The module the stage runs (Lightning's pl_module): read it, or change what a module's own
  /// hook could change (freeze a layer, log), at any hook; nullptr only in a context a test built.
  LightningModule* module = nullptr;
  /// The module's optimizers, in configure_optimizers' order, during fit (e.g. to change a
  /// learning rate); nullptr in validate, test and predict.
  const std::vector<std::shared_ptr<torch::optim::Optimizer>>* optimizers = nullptr;
  /// At a batch hook: the batch, as the transfer hooks left it on the device; nullptr elsewhere.
  const Batch* batch = nullptr;
  /// At a batch hook: the batch's index in its epoch or pass; -1 elsewhere.
  int64_t batch_idx = -1;
  /// At a validation or test batch hook: which of the stage's loaders the batch came from.
  int64_t dataloader_idx = 0;
  /// At on_train_batch_end: training_step's loss; at on_predict_batch_end: predict_step's
  /// output; nullptr elsewhere.
  const torch::Tensor* outputs = nullptr;
};

/// What a hook is about beyond the run's state; a loop passes it to CallbackDispatcher::dispatch,
/// which copies it into the CallbackContext.
struct HookPoint {
  /// Whether the sanity check is running.
  bool sanity_checking = false;
  /// The batch of a batch hook (nullptr: not a batch hook).
  const Batch* batch = nullptr;
  /// The batch's index (-1: not a batch hook).
  int64_t batch_idx = -1;
  /// The batch's loader among the stage's loaders.
  int64_t dataloader_idx = 0;
  /// The step's output, at on_train_batch_end and on_predict_batch_end.
  const torch::Tensor* outputs = nullptr;
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
  /// Once per fit, before training starts (after the module's setup, configure_model and
  /// configure_optimizers: Volt's FitInfo needs the loaders and loggers).
  virtual void setup(const FitInfo& info) {}
  /// Once per fit, after the module's configure_model and before its configure_optimizers
  /// (Lightning's BaseFinetuning freezes in its setup there): freeze what should stay out of the
  /// optimizers. Not called by validate, test or predict.
  virtual void on_before_configure_optimizers(LightningModule& module) {}
  /// While fit restores a checkpoint, after this callback's load_state_dict and before the
  /// optimizers' saved states load: give the optimizers the param groups this callback had added
  /// when the checkpoint was written (BaseFinetuning's unfrozen layers), so that those states fit.
  virtual void restore_optimizer_layout(LightningModule& module,
                                        const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) {}
  /// At the start of fit, before the module's on_fit_start and the sanity check.
  virtual Decision on_fit_start(const CallbackContext& context, CallbackServices& services) { return {}; }
  /// Before the sanity check's validation pass, when one runs (num_sanity_val_steps > 0 and
  /// validation data): e.g. to silence something during it.
  virtual Decision on_sanity_check_start(const CallbackContext& context, CallbackServices& services) { return {}; }
  /// After the sanity check's validation pass, when one ran.
  virtual Decision on_sanity_check_end(const CallbackContext& context, CallbackServices& services) { return {}; }
  /// After the sanity check, before the first training epoch (before the module's on_train_start).
  virtual Decision on_train_start(const CallbackContext& context, CallbackServices& services) { return {}; }
  /// After the last training epoch, before the module's on_train_end.
  virtual Decision on_train_end(const CallbackContext& context, CallbackServices& services) { return {}; }
  /// At the start of each training epoch, before the module's on_train_epoch_start.
  virtual Decision on_train_epoch_start(const CallbackContext& context, CallbackServices& services) { return {}; }
  /// Before each training batch's step, with the batch (before the module's
  /// on_train_batch_start); not on a replayed batch of a process whose stream ran dry.
  virtual Decision on_train_batch_start(const CallbackContext& context, CallbackServices& services) { return {}; }
  /// Before each backward pass of a training step (automatic, or manual_backward), with its loss,
  /// before the module's on_before_backward; not on a replayed batch of a process whose stream
  /// ran dry.
  virtual Decision on_before_backward(const CallbackContext& context, CallbackServices& services,
                                      const torch::Tensor& loss) {
    return {};
  }
  /// After each such backward pass (gradients computed, under ddp synchronized), before the
  /// module's on_after_backward.
  virtual Decision on_after_backward(const CallbackContext& context, CallbackServices& services) { return {}; }
  /// After an automatic optimizer step, before `optimizer`'s gradients are zeroed (before the
  /// module's on_before_zero_grad); manual optimization zeroes them itself and calls neither.
  virtual Decision on_before_zero_grad(const CallbackContext& context, CallbackServices& services,
                                       torch::optim::Optimizer& optimizer) {
    return {};
  }
  /// After the gradients are unscaled and clipped, before `optimizer` (configure_optimizers'
  /// number `index`) steps; before the module's on_before_optimizer_step.
  virtual Decision on_before_optimizer_step(const CallbackContext& context, CallbackServices& services,
                                            torch::optim::Optimizer& optimizer, size_t index) {
    return {};
  }
  /// After each training batch (after the optimizer step, if one happened, the module's
  /// on_train_batch_end and the step's metrics), with the batch and its loss.
  virtual Decision on_train_batch_end(const CallbackContext& context, CallbackServices& services) { return {}; }
  /// After each training epoch, with that epoch's aggregated metrics.
  virtual Decision on_train_epoch_end(const CallbackContext& context, CallbackServices& services) { return {}; }
  /// After each validation run of a fit (not the sanity check, not Trainer::validate), with
  /// its metrics published: after the module's on_validation_end.
  virtual Decision on_validation_end(const CallbackContext& context, CallbackServices& services) { return {}; }
  /// At the start of a validation pass (the sanity check's too), before the module's
  /// on_validation_epoch_start.
  virtual Decision on_validation_epoch_start(const CallbackContext& context, CallbackServices& services) { return {}; }
  /// At the end of a validation pass, before the module's on_validation_epoch_end (its values
  /// are not reduced yet).
  virtual Decision on_validation_epoch_end(const CallbackContext& context, CallbackServices& services) { return {}; }
  /// Before each validation batch's step, with the batch.
  virtual Decision on_validation_batch_start(const CallbackContext& context, CallbackServices& services) { return {}; }
  /// After each validation batch's step, with the batch.
  virtual Decision on_validation_batch_end(const CallbackContext& context, CallbackServices& services) { return {}; }
  /// At the start of a test pass, before the module's on_test_epoch_start.
  virtual Decision on_test_epoch_start(const CallbackContext& context, CallbackServices& services) { return {}; }
  /// At the end of a test pass, before the module's on_test_epoch_end.
  virtual Decision on_test_epoch_end(const CallbackContext& context, CallbackServices& services) { return {}; }
  /// Before each test batch's step, with the batch.
  virtual Decision on_test_batch_start(const CallbackContext& context, CallbackServices& services) { return {}; }
  /// After each test batch's step, with the batch.
  virtual Decision on_test_batch_end(const CallbackContext& context, CallbackServices& services) { return {}; }
  /// At the start of predict, before the module's on_predict_start.
  virtual Decision on_predict_start(const CallbackContext& context, CallbackServices& services) { return {}; }
  /// At the end of predict (before the outputs are gathered), before the module's on_predict_end.
  virtual Decision on_predict_end(const CallbackContext& context, CallbackServices& services) { return {}; }
  /// Before each prediction batch's step, with the batch.
  virtual Decision on_predict_batch_start(const CallbackContext& context, CallbackServices& services) { return {}; }
  /// After each prediction batch's step, with the batch and predict_step's output (e.g. to write
  /// it out, as Lightning's BasePredictionWriter).
  virtual Decision on_predict_batch_end(const CallbackContext& context, CallbackServices& services) { return {}; }
  /// After training stops.
  virtual void on_fit_end(const CallbackContext& context, CallbackServices& services) {}
  /// When fit's loop or a validate, test or predict pass throws `error`, before it propagates
  /// (e.g. to save what can be saved through `services`, as OnExceptionCheckpoint does); the
  /// error propagates whatever this does.
  virtual void on_exception(const CallbackContext& context, const std::exception& error, CallbackServices& services) {}
  /// Adds the callback's own entries to a checkpoint being built (plain values only), after
  /// every callback's state_dict and before the module's on_save_checkpoint.
  virtual void on_save_checkpoint(const CallbackContext& context, StateDict& checkpoint) {}
  /// Reads the callback's own entries from a checkpoint being restored, after load_state_dict
  /// and the module's on_load_checkpoint.
  virtual void on_load_checkpoint(const CallbackContext& context, const StateDict& checkpoint) {}
  /// Whether on_train_batch_end may save a full checkpoint at this step (ModelCheckpoint:
  /// every_n_train_steps' steps; every step with train_time_interval). Under ddp the loop gathers the registered
  /// metrics' states from every process only before such steps (a collective per step would cost too much), so the
  /// answer must be the same on every process; a callback that saves at a step it said false to saves no metric states
  /// (with a warning). Under fsdp the optimizers' states are gathered at the same points, and such a save is refused
  /// (a checkpoint without them would not resume).
  virtual bool saves_checkpoint_at_train_batch_end(const CallbackContext& context) const { return false; }
  /// The number of batches to accumulate in `epoch` that this callback asks for
  /// (GradientAccumulationScheduler); unset: no opinion. Asked at every training epoch's start; it
  /// must depend on the epoch alone, so that a resumed run accumulates as an uninterrupted one.
  virtual std::optional<int64_t> accumulate_grad_batches(int64_t epoch) const { return std::nullopt; }
  /// State to resume from (plain values only).
  virtual StateDict state_dict() const { return make_state_dict(); }
  /// Restores what state_dict returned.
  virtual void load_state_dict(const StateDict& state) {}
};

/// A callback hook as a loop calls it on each callback.
using CallbackHook = std::function<Decision(Callback&, const CallbackContext&, CallbackServices&)>;

/// Calls hooks on a stage's callbacks. The fit loop's turns a stop into a proposal that every
/// process agrees on; validate, test and predict have nothing to stop and ignore it.
class CallbackDispatcher {
 public:
  virtual ~CallbackDispatcher() = default;
  /// Calls `hook` on every callback in order, with `point` in the context.
  virtual void dispatch(const CallbackHook& hook, const HookPoint& point) = 0;
};

namespace internal {
/// Calls on_exception(context, error, services) on every callback; a callback that throws in
/// turn is skipped, so that `error` is the one that propagates.
void notify_exception(const std::vector<std::shared_ptr<Callback>>& callbacks, const CallbackContext& context,
                      const std::exception& error, CallbackServices& services);
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
