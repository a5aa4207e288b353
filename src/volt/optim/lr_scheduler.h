// Learning-rate schedulers whose state can be checkpointed.
//
// LibTorch 1.13's own schedulers (torch::optim::StepLR) keep their state private, so a resumed
// run could not continue their schedule. These follow PyTorch's formulas and state_dict key
// names. The epoch-based ones compute each lr in closed form from `last_epoch` and `base_lrs`
// (PyTorch multiplies step by step; the two agree up to float rounding), so a resumed run sets
// exactly the lrs the uninterrupted run would have.
//
// Example (one scheduler step per epoch):
//
//     torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
//     volt::StepLR scheduler(optimizer, /*step_size=*/30, /*gamma=*/0.1);
//     for (int epoch = 0; epoch < 90; ++epoch) {
//       train_one_epoch(model, optimizer);
//       scheduler.step();
//     }
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "volt/base/monitor_mode.h"

namespace volt {

namespace internal {
class FieldReader;
}  // namespace internal

/// The key under which a scheduler's kind ("StepLR", ...) is stored in its state_dict.
inline constexpr const char* kSchedulerKindKey = "volt_scheduler";

/// A learning-rate schedule over an optimizer's param groups, advanced by step().
///
/// Like PyTorch's, a scheduler takes each group's lr at construction as its base lr and performs
/// step 0 when constructed (last_epoch() becomes 0). The optimizer must outlive the scheduler.
/// A param group added later (BaseFinetuning's unfrozen backbone) has no base lr: each step
/// multiplies its current lr by the step's factor for the first group (the new lr over the last),
/// which is what PyTorch's chainable step() does for the multiplicative schedules, and keeps
/// what a callback set it to in between.
class LRScheduler {
 public:
  /// Schedules `optimizer`'s param groups, starting from their current lrs.
  explicit LRScheduler(torch::optim::Optimizer& optimizer);
  virtual ~LRScheduler();
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  /// Advances one period (an epoch or a step, as the trainer is configured) and sets each param
  /// group's lr.
  ///
  /// `metric` is the monitored value (e.g. the validation loss). Only schedulers whose
  /// needs_metric() is true use it, and they throw volt::Error when it is missing; the others
  /// ignore it, so a trainer can pass its monitored value, if any, to every scheduler alike.
  void step(std::optional<double> metric = std::nullopt);

  /// The lr of each param group as set by the last step (or by construction).
  std::vector<double> get_last_lr() const;
  /// How many periods have passed: 0 after construction, +1 per step().
  int64_t last_epoch() const;
  /// The optimizer whose param groups it schedules.
  torch::optim::Optimizer& optimizer() const { return *optimizer_; }
  /// Whether step() needs a metric (true for ReduceLROnPlateau).
  virtual bool needs_metric() const { return false; }
  /// The scheduler's kind as PyTorch names the class, e.g. "StepLR".
  virtual std::string name() const = 0;

  /// The scheduler's state with PyTorch's key names: "last_epoch", "base_lrs", "_last_lr",
  /// "_step_count", the subclass's hyperparameters, and "volt_scheduler" holding name().
  c10::Dict<std::string, c10::IValue> state_dict() const;
  /// Restores what state_dict() wrote, hyperparameters included (as PyTorch does; a LambdaLR's
  /// function stays the one it was built with). Does not set the optimizer's lrs: they come back
  /// with the optimizer's own state, and the next step() recomputes them. Throws
  /// volt::CheckpointError listing every problem (another kind of scheduler, another number of
  /// param groups, missing or mistyped fields) and leaves the scheduler unchanged then.
  void load_state_dict(const c10::Dict<std::string, c10::IValue>& state);

 protected:
  /// The lr of each param group the scheduler was made with (or, for a scheduler that reads the
  /// current lrs, of every group) for the current last_epoch(); called by step() after it
  /// advanced last_epoch().
  virtual std::vector<double> compute_lrs() = 0;
  /// Receives step()'s metric before compute_lrs(); called only when needs_metric() is true.
  virtual void observe(double metric) {}
  /// Adds the subclass's hyperparameters and counters to `state`.
  virtual void save_fields(c10::Dict<std::string, c10::IValue>& state) const {}
  /// Reads what save_fields wrote. Problems go to the reader; a failed load is undone by
  /// load_state_dict, so this may assign fields as it reads them.
  virtual void load_fields(internal::FieldReader& reader) {}

  /// Performs PyTorch's initial step (last_epoch 0). Each concrete scheduler calls it at the end
  /// of its constructor, once compute_lrs() can run.
  void initial_step();
  /// The lr each param group had when the scheduler was created.
  const std::vector<double>& base_lrs() const;
  /// Each param group's lr now.
  std::vector<double> current_lrs() const;
  /// The number of param groups.
  size_t group_count() const;

 private:
  void advance();
  void set_lrs(const std::vector<double>& lrs);
  void load_or_throw(const c10::Dict<std::string, c10::IValue>& state);

  torch::optim::Optimizer* optimizer_;
  int64_t last_epoch_ = -1;
  int64_t step_count_ = 0;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;
};

/// Multiplies the lr by `gamma` every `step_size` periods: lr = base_lr * gamma^(epoch / step_size).
///
/// Example: `volt::StepLR scheduler(optimizer, /*step_size=*/30, /*gamma=*/0.1);`
class StepLR final : public LRScheduler {
 public:
  /// `step_size` > 0 periods between decays by `gamma` > 0.
  StepLR(torch::optim::Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  std::string name() const override { return "StepLR"; }

 protected:
  std::vector<double> compute_lrs() override;
  void save_fields(c10::Dict<std::string, c10::IValue>& state) const override;
  void load_fields(internal::FieldReader& reader) override;

 private:
  int64_t step_size_;
  double gamma_;
};

/// Multiplies the lr by `gamma` at each milestone: lr = base_lr * gamma^(milestones <= epoch).
///
/// Example: `volt::MultiStepLR scheduler(optimizer, {30, 80}, 0.1);`
class MultiStepLR final : public LRScheduler {
 public:
  /// `milestones` >= 0 in any order (a repeated one decays repeatedly, as in PyTorch).
  MultiStepLR(torch::optim::Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1);
  std::string name() const override { return "MultiStepLR"; }

 protected:
  std::vector<double> compute_lrs() override;
  void save_fields(c10::Dict<std::string, c10::IValue>& state) const override;
  void load_fields(internal::FieldReader& reader) override;

 private:
  std::vector<int64_t> milestones_;  // sorted
  double gamma_;
};

/// Multiplies the lr by `gamma` every period: lr = base_lr * gamma^epoch.
///
/// Example: `volt::ExponentialLR scheduler(optimizer, 0.95);`
class ExponentialLR final : public LRScheduler {
 public:
  /// `gamma` > 0.
  ExponentialLR(torch::optim::Optimizer& optimizer, double gamma);
  std::string name() const override { return "ExponentialLR"; }

 protected:
  std::vector<double> compute_lrs() override;
  void save_fields(c10::Dict<std::string, c10::IValue>& state) const override;
  void load_fields(internal::FieldReader& reader) override;

 private:
  double gamma_;
};

/// Anneals the lr along a cosine from base_lr to `eta_min` over `t_max` periods (and back up
/// after, as PyTorch's does): lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / t_max)) / 2.
///
/// Example: `volt::CosineAnnealingLR scheduler(optimizer, /*t_max=*/max_epochs);`
class CosineAnnealingLR final : public LRScheduler {
 public:
  /// `t_max` > 0 periods to reach `eta_min` >= 0.
  CosineAnnealingLR(torch::optim::Optimizer& optimizer, int64_t t_max, double eta_min = 0.0);
  std::string name() const override { return "CosineAnnealingLR"; }

 protected:
  std::vector<double> compute_lrs() override;
  void save_fields(c10::Dict<std::string, c10::IValue>& state) const override;
  void load_fields(internal::FieldReader& reader) override;

 private:
  int64_t t_max_;
  double eta_min_;
};

/// Warms the lr up linearly from `warmup_start_factor` x base_lr to base_lr over `warmup_steps`
/// periods, then anneals it along a half cosine to `eta_min` at `total_steps`, and holds it there
/// (the transformer schedule: Hugging Face's get_cosine_schedule_with_warmup with eta_min 0 and a
/// start factor 0, stepped per optimizer step). For period e:
///   e < warmup_steps: base_lr * (f + (1 - f) * e / warmup_steps), f = warmup_start_factor;
///   else: eta_min + (base_lr - eta_min) * (1 + cos(pi * min(1, (e - warmup) / (total - warmup)))) / 2.
/// Closed form in the period, so a resumed run sets exactly the lrs an uninterrupted one would.
///
/// Example (the whole run, whatever the number of processes; interval kStep):
/// `volt::LinearWarmupCosineLR scheduler(optimizer, /*warmup_steps=*/100, *estimated_stepping_batches());`
class LinearWarmupCosineLR final : public LRScheduler {
 public:
  /// `warmup_steps` >= 0 periods of warmup within `total_steps` > warmup_steps periods; `eta_min`
  /// >= 0 the final lr; `warmup_start_factor` in [0, 1] the first period's share of base_lr.
  LinearWarmupCosineLR(torch::optim::Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps,
                       double eta_min = 0.0, double warmup_start_factor = 0.0);
  std::string name() const override { return "LinearWarmupCosineLR"; }

 protected:
  std::vector<double> compute_lrs() override;
  void save_fields(c10::Dict<std::string, c10::IValue>& state) const override;
  void load_fields(internal::FieldReader& reader) override;

 private:
  int64_t warmup_steps_;
  int64_t total_steps_;
  double eta_min_;
  double warmup_start_factor_;
};

/// Sets the lr to base_lr * lambda(epoch).
///
/// Example (linear warm-up over 5 periods):
/// `volt::LambdaLR scheduler(optimizer, [](int64_t e) { return std::min(1.0, (e + 1) / 5.0); });`
class LambdaLR final : public LRScheduler {
 public:
  /// The factor for each epoch; the same function for every param group. Called at construction
  /// for epoch 0.
  LambdaLR(torch::optim::Optimizer& optimizer, std::function<double(int64_t epoch)> lr_lambda);
  std::string name() const override { return "LambdaLR"; }

 protected:
  std::vector<double> compute_lrs() override;
  void save_fields(c10::Dict<std::string, c10::IValue>& state) const override;

 private:
  std::function<double(int64_t)> lr_lambda_;
};

/// How ReduceLROnPlateau's threshold measures an improvement: relative to the best value so far
/// ("rel": better than best * (1 -/+ threshold)) or absolute ("abs": best -/+ threshold).
enum class ThresholdMode { kRel, kAbs };
/// "rel" or "abs".
const char* to_string(ThresholdMode mode);
/// Parses "rel" or "abs"; throws volt::Error listing the accepted names.
ThresholdMode parse_threshold_mode(std::string_view text);

/// Options of ReduceLROnPlateau, with PyTorch's defaults.
///
/// Example (an accuracy that should rise):
///
///     volt::ReduceLROnPlateauOptions options;
///     options.mode = volt::Mode::kMax;
///     options.patience = 3;
///     volt::ReduceLROnPlateau scheduler(optimizer, options);
struct ReduceLROnPlateauOptions {
  /// Whether the metric should decrease (kMin) or increase (kMax).
  Mode mode = Mode::kMin;
  /// The lr is multiplied by this when the metric plateaus; in (0, 1).
  double factor = 0.1;
  /// How many periods without improvement are tolerated before the lr is reduced; >= 0.
  int64_t patience = 10;
  /// The least change that counts as an improvement, measured as `threshold_mode` says; >= 0.
  double threshold = 1e-4;
  /// Relative or absolute threshold.
  ThresholdMode threshold_mode = ThresholdMode::kRel;
  /// How many periods to wait after a reduction before counting bad periods again; >= 0.
  int64_t cooldown = 0;
  /// No group's lr is reduced below this; >= 0.
  double min_lr = 0.0;
  /// Reductions smaller than this are skipped; >= 0.
  double eps = 1e-8;
};

/// Reduces the lr by `factor` when a metric has stopped improving for `patience` periods.
///
/// Needs the metric on every step: `scheduler.step(val_loss)`. Unlike the other schedulers it
/// works on each group's current lr (as PyTorch's does), so its schedule continues after a
/// resume only when the optimizer's state (which holds the lrs) is restored too.
class ReduceLROnPlateau final : public LRScheduler {
 public:
  /// Throws volt::Error when an option is out of range.
  explicit ReduceLROnPlateau(torch::optim::Optimizer& optimizer, const ReduceLROnPlateauOptions& options = {});
  std::string name() const override { return "ReduceLROnPlateau"; }
  bool needs_metric() const override { return true; }

 protected:
  std::vector<double> compute_lrs() override;
  void observe(double metric) override;
  void save_fields(c10::Dict<std::string, c10::IValue>& state) const override;
  void load_fields(internal::FieldReader& reader) override;

 private:
  bool is_better(double metric) const;

  ReduceLROnPlateauOptions options_;
  std::vector<double> min_lrs_;
  double best_;
  int64_t num_bad_epochs_ = 0;
  int64_t cooldown_counter_ = 0;
  bool reduce_ = false;  // set by observe() for the compute_lrs() of the same step
};

}  // namespace volt
