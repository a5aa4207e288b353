// The base class a user derives from: model, steps, optimizers and data in one class.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "volt/base/interval.h"
#include "volt/base/reduce.h"
#include "volt/base/state_dict.h"
#include "volt/data/data_loader.h"
#include "volt/data/data_module.h"
#include "volt/module/log_options.h"
#include "volt/module/manual_optimization.h"

namespace volt {

class Callback;
class Collectives;
class LRScheduler;
class Metric;
class MetricSink;
class RunView;
class WeightSource;
class ProcessGroup;
class GradientSynchronizer;
struct Topology;
struct ProcessGroupOptions;
struct GradientSyncOptions;

namespace internal {
class ModuleAccess;
}  // namespace internal

/// A learning-rate scheduler and when it steps (Lightning's lr_scheduler_config).
struct SchedulerConfig {
  /// The scheduler; it must drive one of the returned optimizers.
  std::shared_ptr<LRScheduler> scheduler;
  /// Step after every epoch or after every optimizer step.
  Interval interval = Interval::kEpoch;
  /// Step every `frequency` intervals.
  int64_t frequency = 1;
  /// For schedulers that need a metric (ReduceLROnPlateau): the logged metric to pass.
  std::string monitor;
  /// The name LearningRateMonitor logs under; empty: "lr-<Optimizer>".
  std::string name;
};

/// What configure_optimizers returns: optimizers and their schedulers.
///
/// With automatic optimization every optimizer steps after the backward pass of the loss
/// training_step returned.
struct OptimizerConfig {
  OptimizerConfig() = default;
  /// One optimizer, no scheduler (so `return std::make_shared<torch::optim::Adam>(...);` works).
  template <typename O, typename = std::enable_if_t<std::is_base_of_v<torch::optim::Optimizer, O>>>
  OptimizerConfig(std::shared_ptr<O> optimizer)  // NOLINT: implicit on purpose
      : optimizers{std::move(optimizer)} {}
  /// One optimizer with one scheduler.
  template <typename O, typename = std::enable_if_t<std::is_base_of_v<torch::optim::Optimizer, O>>>
  OptimizerConfig(std::shared_ptr<O> optimizer, SchedulerConfig scheduler)
      : optimizers{std::move(optimizer)}, schedulers{std::move(scheduler)} {}

  /// The optimizers, stepped in order.
  std::vector<std::shared_ptr<torch::optim::Optimizer>> optimizers;
  /// The schedulers.
  std::vector<SchedulerConfig> schedulers;
};

/// Receives what a module logs; the Trainer installs one while a stage runs.
class MetricSink {
 public:
  virtual ~MetricSink() = default;
  /// Records `value` under `name` (see LightningModule::log).
  virtual void log(const std::string& name, const torch::Tensor& value, const LogOptions& options) = 0;
  /// Records that `name` is `metric`'s value at the end of the epoch (see LightningModule::log);
  /// the default refuses, for sinks that only take values.
  virtual void log_metric(const std::string& name, Metric& metric, const LogOptions& options);
};

/// A model with its training logic, like Lightning's LightningModule.
///
/// Derive from it, register submodules as with any torch::nn::Module, and override at least
/// training_step and configure_optimizers. The data hooks may return a DataLoader, or the data
/// can be passed to Trainer::fit directly.
class LightningModule : public torch::nn::Module {
 public:
  /// Named after the derived class, as torch::nn::Module names itself (its demangled type), so
  /// that errors ("Blobs::configure_optimizers returned ...") and summaries name the user's class.
  LightningModule() = default;
  /// `name` is the module's name in errors, summaries and checkpoints' metadata.
  explicit LightningModule(std::string name) : torch::nn::Module(std::move(name)) {}
  ~LightningModule() override;

  // ---- steps -------------------------------------------------------------------------------
  /// Computes the loss of one training batch; backward and the optimizer step are the Trainer's.
  virtual torch::Tensor training_step(const Batch& batch, int64_t batch_idx) = 0;
  /// Combines the losses that training_step returned for the pieces of one batch into the loss
  /// to back-propagate (the seed documents' training_step_end). Under dp and ddp2 each device's
  /// replica ran training_step on `batch_sizes[i]` examples and returned `losses[i]`; otherwise
  /// there is one piece. The default is the mean weighted by piece size, which equals the loss
  /// of the whole batch for per-example-mean losses, and returns a single loss unchanged.
  virtual torch::Tensor training_step_end(const std::vector<torch::Tensor>& losses,
                                          const std::vector<int64_t>& batch_sizes);
  /// Evaluates one validation batch; log metrics with log(). No gradients are recorded.
  virtual void validation_step(const Batch& batch, int64_t batch_idx) {}
  /// Evaluates one test batch; log metrics with log().
  virtual void test_step(const Batch& batch, int64_t batch_idx) {}
  /// Predicts one batch; the default throws, saying to override it.
  virtual torch::Tensor predict_step(const Batch& batch, int64_t batch_idx);
  /// Returns the optimizers and schedulers; called once per fit, after the model is on its device.
  virtual OptimizerConfig configure_optimizers() = 0;

  // ---- data hooks (an undefined DataLoader means "no data for that stage") --------------------
  /// The training data; the default has none (then fit() must be given a loader).
  virtual DataLoader train_dataloader() { return {}; }
  /// The validation data; none skips validation.
  virtual DataLoader val_dataloader() { return {}; }
  /// The test data.
  virtual DataLoader test_dataloader() { return {}; }
  /// The prediction data.
  virtual DataLoader predict_dataloader() { return {}; }
  /// Several validation loaders (Lightning's list from val_dataloader), run one after another in
  /// each validation; values logged while loader k runs are named "<name>/dataloader_idx_<k>"
  /// when there is more than one. The default is val_dataloader() alone (none if undefined).
  virtual std::vector<DataLoader> val_dataloaders();
  /// Several test loaders, as val_dataloaders; the default is test_dataloader() alone.
  virtual std::vector<DataLoader> test_dataloaders();
  /// Which of the stage's loaders the current validation or test step reads (Lightning passes it
  /// to the step as `dataloader_idx`); 0 with one loader and outside evaluation.
  int64_t dataloader_idx() const { return dataloader_idx_; }

  // ---- set-up hooks (docs/hooks.md has the order of every hook) -----------------------------
  /// Builds what `stage` needs on every process, once its processes have joined (so the rank is
  /// known): at the start of each Trainer call, before the stage's loaders are asked for.
  virtual void setup(Stage stage) {}
  /// Releases what setup built, at the end of each Trainer call, also when the stage failed (an
  /// error teardown throws then is dropped: the stage's is the one reported).
  virtual void teardown(Stage stage) {}
  /// Creates layers late (Lightning's configure_model): after setup, before the precision cast,
  /// the move to the device and configure_optimizers, in every Trainer call and on each dp copy
  /// from make_replica, so it must do nothing when the layers exist already.
  virtual void configure_model() {}
  /// Callbacks this module needs, added to the Trainer's for each Trainer call; one of the same
  /// type as a Trainer callback replaces it, and ModelCheckpoints still run last (Lightning's
  /// rules). Called once per Trainer call, first.
  virtual std::vector<std::shared_ptr<Callback>> configure_callbacks() { return {}; }
  /// Weights to start a fit from that live outside the module (e.g. a Hugging Face folder): the
  /// Trainer reads them after configure_optimizers and the strategy's setup, so that under fsdp's
  /// full_shard each process reads only the elements it keeps (see WeightSource). The default,
  /// none, keeps the weights the module was built with. Not asked when the fit resumes from a
  /// checkpoint, nor by validate, test or predict.
  virtual std::shared_ptr<WeightSource> initial_weights() { return nullptr; }

  // ---- batch transfer (every stage, every batch, on the process that reads it) ---------------
  /// Changes a batch as the loader made it, before it moves to the device (e.g. CPU-side
  /// augmentation); returns the batch to move. `dataloader_idx`: which of the stage's loaders.
  virtual Batch on_before_batch_transfer(Batch batch, int64_t dataloader_idx) { return batch; }
  /// Moves a batch to `device` (the run's root device) and returns it; the default moves every
  /// tensor, without blocking when the loader pinned it. Override for batches whose extra
  /// entries need more than .to(device).
  virtual Batch transfer_batch_to_device(Batch batch, torch::Device device, int64_t dataloader_idx);
  /// Changes a batch on the device (e.g. GPU augmentation) before the step sees it (and before
  /// the -true precisions cast its floating tensors).
  virtual Batch on_after_batch_transfer(Batch batch, int64_t dataloader_idx) { return batch; }

  // ---- hooks, called on every process in Lightning's order ----------------------------------
  /// Before anything else in fit().
  virtual void on_fit_start() {}
  /// After fit() finished (also after an early stop).
  virtual void on_fit_end() {}
  /// Before the first training epoch.
  virtual void on_train_start() {}
  /// After the last training epoch.
  virtual void on_train_end() {}
  /// At the start of each training epoch.
  virtual void on_train_epoch_start() {}
  /// At the end of each training epoch, before epoch metrics are computed.
  virtual void on_train_epoch_end() {}
  /// Before each training batch.
  virtual void on_train_batch_start(const Batch& batch, int64_t batch_idx) {}
  /// After each training batch with the loss it returned.
  virtual void on_train_batch_end(const torch::Tensor& loss, const Batch& batch, int64_t batch_idx) {}
  /// Before a validation pass (the sanity check's, fit's and Trainer::validate's), before
  /// on_validation_epoch_start; the module is in eval mode already.
  virtual void on_validation_start() {}
  /// After a validation pass, once its logged values are reduced across processes.
  virtual void on_validation_end() {}
  /// At the start of a validation run.
  virtual void on_validation_epoch_start() {}
  /// At the end of a validation run.
  virtual void on_validation_epoch_end() {}
  /// Before each validation batch's step (not on a replayed batch of a process whose stream ran
  /// dry); `dataloader_idx`: which of the stage's loaders.
  virtual void on_validation_batch_start(const Batch& batch, int64_t batch_idx, int64_t dataloader_idx) {}
  /// After each validation batch's step.
  virtual void on_validation_batch_end(const Batch& batch, int64_t batch_idx, int64_t dataloader_idx) {}
  /// Before a test pass, before on_test_epoch_start.
  virtual void on_test_start() {}
  /// After a test pass, once its logged values are reduced across processes.
  virtual void on_test_end() {}
  /// At the start of testing.
  virtual void on_test_epoch_start() {}
  /// At the end of testing.
  virtual void on_test_epoch_end() {}
  /// Before each test batch's step (not on a replayed batch).
  virtual void on_test_batch_start(const Batch& batch, int64_t batch_idx, int64_t dataloader_idx) {}
  /// After each test batch's step.
  virtual void on_test_batch_end(const Batch& batch, int64_t batch_idx, int64_t dataloader_idx) {}
  /// Before predict's first batch, in eval mode.
  virtual void on_predict_start() {}
  /// After predict's last batch, before every process's outputs are gathered.
  virtual void on_predict_end() {}
  /// At the start of predict's pass over its loader, after on_predict_start.
  virtual void on_predict_epoch_start() {}
  /// At the end of predict's pass, before on_predict_end.
  virtual void on_predict_epoch_end() {}
  /// Before each prediction batch's step.
  virtual void on_predict_batch_start(const Batch& batch, int64_t batch_idx, int64_t dataloader_idx) {}
  /// After each prediction batch's step, with what predict_step returned.
  virtual void on_predict_batch_end(const torch::Tensor& outputs, const Batch& batch, int64_t batch_idx,
                                    int64_t dataloader_idx) {}

  // ---- optimization hooks (fit only; under dp on this module, not on its copies) -------------
  /// Before the backward pass of `loss` (training_step's, divided by accumulate_grad_batches;
  /// under manual optimization manual_backward's), before 16-mixed scales it.
  virtual void on_before_backward(const torch::Tensor& loss) {}
  /// After the backward pass, before the gradients are unscaled or clipped (under ddp they are
  /// averaged across processes already when this backward precedes an optimizer step).
  virtual void on_after_backward() {}
  /// Clips `optimizer`'s gradients at an optimizer step of automatic optimization (after
  /// 16-mixed unscaled them), with the Trainer's gradient_clip_val (unset: no clipping) and
  /// gradient_clip_algorithm; the default calls clip_gradients(optimizer, value, algorithm)
  /// when a value is set. Override to clip differently (per layer, or by a schedule).
  virtual void configure_gradient_clipping(torch::optim::Optimizer& optimizer, std::optional<double> gradient_clip_val,
                                           GradientClipAlgorithm gradient_clip_algorithm);
  /// After the backward pass and gradient clipping, before the optimizer steps.
  virtual void on_before_optimizer_step(torch::optim::Optimizer& optimizer, size_t optimizer_idx) {}
  /// After `optimizer` stepped, before its gradients are zeroed (automatic optimization only):
  /// the weights are updated and the gradients still there.
  virtual void on_before_zero_grad(torch::optim::Optimizer& optimizer) {}
  /// Steps `scheduler` when its SchedulerConfig says (interval, frequency), with the monitored
  /// metric for schedulers that need one; the default calls scheduler.step(metric). Override for
  /// a scheduler that steps differently. Automatic optimization only.
  virtual void lr_scheduler_step(LRScheduler& scheduler, std::optional<double> metric);
  /// Adds the module's own entries to a checkpoint before it is written (plain values only).
  virtual void on_save_checkpoint(StateDict& checkpoint) {}
  /// Reads the module's own entries back from a checkpoint being restored.
  virtual void on_load_checkpoint(const StateDict& checkpoint) {}

  // ---- distributed hooks (the seed documents' init_ddp_connection and configure_ddp) ----------
  /// Joins the ddp process group; return nullptr (the default) for Volt's TCPStore rendezvous
  /// with Gloo, or a joined ProcessGroup made differently (another store, backend or timeout).
  virtual std::shared_ptr<ProcessGroup> init_ddp_connection(const Topology& topology,
                                                            const ProcessGroupOptions& options) {
    return nullptr;
  }
  /// Wraps the model for ddp; return nullptr (the default) for c10d's Reducer over every
  /// trainable parameter, or another GradientSynchronizer (e.g. one that skips frozen parts).
  virtual std::shared_ptr<GradientSynchronizer> configure_ddp(ProcessGroup& group, const GradientSyncOptions& options) {
    return nullptr;
  }
  /// A new module of the same architecture (same options), for dp and ddp2 on several CUDA
  /// devices: the device after the first runs such a copy, which Volt fills with this module's
  /// values before every step and whose gradients it routes back here, so its own initial values
  /// do not matter. The default returns nullptr, which such a run reports as an error; CPU runs
  /// and ddp never call it. Typical override: `return std::make_shared<MyModel>(options_);`.
  virtual std::shared_ptr<LightningModule> make_replica() const { return nullptr; }

  // ---- logging -------------------------------------------------------------------------------
  /// Logs a scalar tensor under `name`; see LogOptions for aggregation and destinations.
  void log(const std::string& name, const torch::Tensor& value, const LogOptions& options = {});
  /// Logs a number under `name`.
  void log(const std::string& name, double value, const LogOptions& options = {});
  /// Logs several values with the same options.
  void log_dict(const std::map<std::string, torch::Tensor>& values, const LogOptions& options = {});
  /// Logs `metric`'s value over the epoch under `name` (Lightning's `self.log(name, metric)`):
  /// the loop calls metric.compute() once at the end of the epoch (of training, or of a
  /// validation or test run), synced over every process, logs that value, and resets the metric.
  /// Call it in the step that updates the metric. The value must be a single number, and
  /// `options.on_step` cannot be true (the metric has no per-batch value: log that as a tensor).
  void log(const std::string& name, Metric& metric, const LogOptions& options = {});

  // ---- metrics that a checkpoint carries ---------------------------------------------------------
  /// Registers `metric` (a member of this module, which it must outlive) under `name`, so that
  /// checkpoints save its states and a resume inside an epoch continues it (like register_module
  /// for submodules). Each name and each metric once; throws volt::Error otherwise.
  void register_metric(const std::string& name, Metric& metric);
  /// The metrics register_metric registered, in registration order.
  const std::vector<std::pair<std::string, Metric*>>& registered_metrics() const { return metrics_; }

  // ---- the run, as the module sees it (outside a stage: epoch 0, step 0, rank 0 of 1) --------
  /// The epoch being trained (0-based); after fit, the epoch fit reached (Lightning's
  /// current_epoch). Valid in every hook and step.
  int64_t current_epoch() const;
  /// Optimizer steps so far; inside training_step, the steps before this one.
  int64_t global_step() const;
  /// The optimizer steps this fit will take unless something stops it early (Lightning's
  /// trainer.estimated_stepping_batches): for a schedule's total length, e.g. warmup then cosine
  /// decay over the whole run, which would otherwise change with the number of processes. Known
  /// from configure_optimizers on; unset outside fit and for an unbounded run (max_epochs and
  /// max_steps both -1, or a stream of unknown length without max_steps).
  std::optional<int64_t> estimated_stepping_batches() const;
  /// This process's rank among all processes.
  int64_t global_rank() const;
  /// This process's rank on its node.
  int64_t local_rank() const;
  /// This process's node.
  int64_t node_rank() const;
  /// How many processes train together.
  int64_t world_size() const;
  /// True on the process that writes logs and checkpoints (global rank 0).
  bool is_global_zero() const;
  /// The device the module runs on; outside a stage, its first parameter's device (CPU when it
  /// has none).
  torch::Device device() const;
  /// Every process's `tensor`, indexed by global rank; the first dimension may differ between
  /// processes (`torch::stack(all_gather(t))` gives Lightning's shape for equal ones). A
  /// collective: every process must call it at the same point. No gradient flows back.
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor);
  /// `tensor` reduced element-wise across processes (a new tensor; `tensor` is unchanged). A
  /// collective, like all_gather.
  torch::Tensor all_reduce(const torch::Tensor& tensor, Reduce op = Reduce::kSum);
  /// The run's collectives, for syncing state by hand (e.g. `metric.compute(collectives())` in a
  /// hook); outside a stage, one process's.
  Collectives& collectives() const;
  /// Writes `line` on the global-zero process only (Lightning's self.print), through the run's
  /// console so it does not tear the progress bar; outside a stage, to standard output.
  void print(const std::string& line) const;

  // ---- manual optimization (Lightning's automatic_optimization = False) -----------------------
  /// Whether the Trainer backpropagates training_step's loss and steps every optimizer (true,
  /// the default) or training_step does it itself with manual_backward and optimizers().
  bool automatic_optimization() const { return automatic_optimization_; }
  /// Switches manual optimization on (false) or off; call it in the constructor.
  void set_automatic_optimization(bool automatic) { automatic_optimization_ = automatic; }
  /// Backpropagates `loss` under manual optimization, through the precision plugin and ddp's
  /// gradient synchronization (Lightning's manual_backward); never call loss.backward() there.
  void manual_backward(const torch::Tensor& loss);
  /// The optimizers configure_optimizers returned, in order, whose step() goes through the
  /// Trainer. Only under manual optimization, during fit.
  std::vector<LightningOptimizer> optimizers();
  /// The schedulers configure_optimizers returned, in order; under manual optimization the
  /// Trainer steps none of them: step them yourself (e.g. in on_train_epoch_end).
  std::vector<std::shared_ptr<LRScheduler>> lr_schedulers();
  /// Makes only `optimizer`'s parameters require gradients (the other optimizers' ones stop
  /// requiring them) until untoggle_optimizer: a GAN's generator step leaves the
  /// discriminator's gradients alone.
  void toggle_optimizer(const LightningOptimizer& optimizer);
  /// Restores what every parameter's requires_grad was before toggle_optimizer.
  void untoggle_optimizer(const LightningOptimizer& optimizer);
  /// Clips `optimizer`'s gradients to `value` (by total norm or per element) when it next
  /// steps, after 16-mixed unscales them (Lightning's clip_gradients).
  void clip_gradients(const LightningOptimizer& optimizer, double value,
                      GradientClipAlgorithm algorithm = GradientClipAlgorithm::kNorm);
  /// Clips `optimizer`'s gradients to `value` now, by their total norm or per element: what the
  /// default configure_gradient_clipping calls, and what an override calls with its own values.
  void clip_gradients(torch::optim::Optimizer& optimizer, double value,
                      GradientClipAlgorithm algorithm = GradientClipAlgorithm::kNorm);

  // ---- hyperparameters -------------------------------------------------------------------------
  /// Records the hyperparameters: written to hparams.yaml and the checkpoint.
  void save_hyperparameters(nlohmann::json hparams) { hparams_ = std::move(hparams); }
  /// The recorded hyperparameters (an empty object when none).
  const nlohmann::json& hparams() const { return hparams_; }

  /// The view of the run a stage installed (RunViewScope; nullptr outside a stage).
  RunView* run_view() const { return run_view_; }
  /// Where log() sends values (MetricSinkScope; nullptr outside a stage).
  MetricSink* metric_sink() const { return sink_; }

 private:
  // What a stage lends the module, installed by the Trainer's loops, strategies and scopes
  // through internal::ModuleAccess, so a user's completion list shows only what a user calls.
  friend class internal::ModuleAccess;
  void set_manual_optimization(ManualOptimization* loop) { manual_ = loop; }
  void set_dataloader_idx(int64_t index) { dataloader_idx_ = index; }
  void set_run_view(RunView* view) { run_view_ = view; }
  void set_metric_sink(MetricSink* sink) { sink_ = sink; }

  MetricSink* sink_ = nullptr;
  RunView* run_view_ = nullptr;
  ManualOptimization* manual_ = nullptr;
  bool automatic_optimization_ = true;
  std::vector<std::pair<std::string, Metric*>> metrics_;
  // The parameters toggle_optimizer stopped requiring gradients (they all did before).
  std::vector<torch::Tensor> toggled_;
  int64_t dataloader_idx_ = 0;
  nlohmann::json hparams_ = nlohmann::json::object();
};

namespace internal {

/// The Trainer's access to what a stage lends a module (its private setters), as LibTorch's
/// Module lets Cloneable in through a friend: for the loops, the strategies and the scopes below.
class ModuleAccess {
 public:
  /// Installs (or clears with nullptr) the training loop's manual optimization.
  static void set_manual_optimization(LightningModule& module, ManualOptimization* loop) {
    module.set_manual_optimization(loop);
  }
  /// Sets what dataloader_idx() returns (the evaluation loop, per loader).
  static void set_dataloader_idx(LightningModule& module, int64_t index) { module.set_dataloader_idx(index); }
  /// Installs (or clears with nullptr) the view of the run; RunViewScope puts the previous one back.
  static void set_run_view(LightningModule& module, RunView* view) { module.set_run_view(view); }
  /// Installs (or clears with nullptr) where log() sends values; MetricSinkScope puts the previous
  /// one back.
  static void set_metric_sink(LightningModule& module, MetricSink* sink) { module.set_metric_sink(sink); }
};

}  // namespace internal

/// Installs `sink` as the module's metric sink for a scope and puts the previous one back at
/// its end, also when a step or hook throws, so the module never points at a collection that
/// no longer exists.
class MetricSinkScope {
 public:
  /// Routes `module`'s log() calls to `sink` (nullptr: nowhere) until the scope ends.
  MetricSinkScope(LightningModule& module, MetricSink* sink) : module_(module), previous_(module.metric_sink()) {
    internal::ModuleAccess::set_metric_sink(module, sink);
  }
  ~MetricSinkScope() { internal::ModuleAccess::set_metric_sink(module_, previous_); }
  MetricSinkScope(const MetricSinkScope&) = delete;
  MetricSinkScope& operator=(const MetricSinkScope&) = delete;

 private:
  LightningModule& module_;
  MetricSink* previous_;
};

/// Installs `view` as the module's view of the run for a scope and puts the previous one back
/// at its end, also when the stage throws, so the module never points at a finished stage.
class RunViewScope {
 public:
  /// Shows `view` to `module` until the scope ends.
  RunViewScope(LightningModule& module, RunView* view) : module_(module), previous_(module.run_view()) {
    internal::ModuleAccess::set_run_view(module, view);
  }
  ~RunViewScope() { internal::ModuleAccess::set_run_view(module_, previous_); }
  RunViewScope(const RunViewScope&) = delete;
  RunViewScope& operator=(const RunViewScope&) = delete;

 private:
  LightningModule& module_;
  RunView* previous_;
};

/// Puts a module into training or evaluation mode for a scope and restores its mode at the end,
/// also when a step throws (an evaluation that fails must not leave the module in eval mode).
class TrainingModeScope {
 public:
  /// Sets `module.train(training)` until the scope ends.
  TrainingModeScope(torch::nn::Module& module, bool training) : module_(module), was_training_(module.is_training()) {
    module.train(training);
  }
  ~TrainingModeScope() { module_.train(was_training_); }
  TrainingModeScope(const TrainingModeScope&) = delete;
  TrainingModeScope& operator=(const TrainingModeScope&) = delete;

 private:
  torch::nn::Module& module_;
  bool was_training_;
};

namespace internal {

/// Sends the log() calls made on this thread to `sink` instead of the module's sink while it
/// lives: dp runs training_step on several threads, and each replica's values are collected
/// apart and combined once on the calling thread, so the module's sink is never shared.
class ThreadMetricSinkScope {
 public:
  /// Routes this thread's log() calls to `sink`.
  explicit ThreadMetricSinkScope(MetricSink* sink);
  ~ThreadMetricSinkScope();
  ThreadMetricSinkScope(const ThreadMetricSinkScope&) = delete;
  ThreadMetricSinkScope& operator=(const ThreadMetricSinkScope&) = delete;

 private:
  MetricSink* previous_;
};

}  // namespace internal
}  // namespace volt
