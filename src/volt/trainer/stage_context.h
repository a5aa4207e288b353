// What the Trainer's stage runner sets up around every stage (fit, validate, test, predict): the
// module's view of the run, the callbacks of the stage, and a teardown that always runs.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "volt/callbacks/callback.h"
#include "volt/checkpoint/checkpoint_state.h"
#include "volt/module/lightning_module.h"
#include "volt/module/run_view.h"
#include "volt/strategies/strategy.h"

namespace volt {

class Console;

namespace internal {

/// The module's view of a stage: the plan's topology and device, the strategy's collectives, and
/// the fit loop's progress (or where the last fit ended).
class StageView : public RunView {
 public:
  /// Reads `strategy`'s topology and collectives, `progress` until watch() names another.
  StageView(Strategy& strategy, torch::Device device, std::shared_ptr<Console> console, const FitProgress& progress)
      : strategy_(strategy), device_(device), console_(std::move(console)), progress_(&progress) {}
  /// Reads `progress` from now on (the fit loop's, once it exists).
  void watch(const FitProgress& progress) { progress_ = &progress; }
  /// What estimated_stepping_batches() answers from now on (the fit stage, once its loaders are
  /// counted and before configure_optimizers).
  void set_estimated_stepping_batches(std::optional<int64_t> steps) { estimated_stepping_batches_ = steps; }

  int64_t current_epoch() const override { return progress_->epoch; }
  int64_t global_step() const override { return progress_->global_step; }
  std::optional<int64_t> estimated_stepping_batches() const override { return estimated_stepping_batches_; }
  const Topology& topology() const override { return strategy_.topology(); }
  torch::Device device() const override { return device_; }
  Collectives& collectives() const override { return strategy_.collectives(); }
  bool shards_gradients() const override;
  void print(const std::string& line) const override;

 private:
  Strategy& strategy_;
  torch::Device device_;
  std::shared_ptr<Console> console_;
  const FitProgress* progress_;
  std::optional<int64_t> estimated_stepping_batches_;
};

/// The callbacks of validate, test and predict: their epoch and batch hooks see the module and
/// where the last fit ended. Nothing is saved or logged outside fit, and a stop has nothing to
/// stop, so it is ignored.
class StageCallbacks : public CallbackDispatcher, public CallbackServices {
 public:
  /// Dispatches to `callbacks` with `progress` and `metrics` (the last fit's) in their context.
  StageCallbacks(const std::vector<std::shared_ptr<Callback>>& callbacks, LightningModule& module,
                 const FitProgress& progress, const std::map<std::string, double>& metrics, Strategy& strategy)
      : callbacks_(callbacks), module_(module), progress_(progress), metrics_(metrics), strategy_(strategy) {}

  void dispatch(const CallbackHook& hook, const HookPoint& point) override;
  /// What a hook at `point` sees.
  CallbackContext context(const HookPoint& point) const;
  void save_checkpoint(const std::string& path) override;
  void save_weights_checkpoint(const std::string& path) override;
  bool broadcast_decision(bool decision) override;
  void remove_checkpoint(const std::string& path) override;
  // validate, test and predict log to no logger (their values are the stage's result).
  void log_metrics(const std::map<std::string, double>&) override {}

  /// Runs `body`; when it throws, the callbacks' on_exception sees the error first.
  template <typename Body>
  auto run(Body&& body) {
    try {
      return body();
    } catch (const std::exception& error) {
      notify_exception(callbacks_, context({}), error, *this);
      throw;
    }
  }

 private:
  const std::vector<std::shared_ptr<Callback>>& callbacks_;
  LightningModule& module_;
  const FitProgress& progress_;
  const std::map<std::string, double>& metrics_;
  Strategy& strategy_;
};

/// What a stage's body works with, set up by the Trainer's stage runner for that stage only.
struct StageContext {
  /// The run's strategy, its environment set up (processes joined).
  Strategy& strategy;
  /// The Trainer's console on global rank 0, a silent one elsewhere.
  std::shared_ptr<Console> console;
  /// The module's view of the run (fit points it at its loop's progress).
  StageView& view;
  /// The Trainer's callbacks with the module's configure_callbacks() added.
  const std::vector<std::shared_ptr<Callback>>& callbacks;
  /// `callbacks` as validate, test and predict dispatch to them.
  StageCallbacks& hooks;
};

/// Runs `run`, then `teardown`, also when `run` throws; then an error from `teardown` is
/// dropped: the stage's error is the one to report, and a teardown failing after it adds nothing.
template <typename Run, typename Teardown>
auto run_then_teardown(Run&& run, Teardown&& teardown) {
  try {
    auto result = run();
    teardown();
    return result;
  } catch (...) {
    try {
      teardown();
    } catch (...) {
    }
    throw;
  }
}

/// The Trainer's callbacks with the module's configure_callbacks() added, by Lightning's rule: a
/// module callback replaces the Trainer's callbacks of its exact type.
std::vector<std::shared_ptr<Callback>> with_module_callbacks(std::vector<std::shared_ptr<Callback>> callbacks,
                                                             LightningModule& module);

}  // namespace internal
}  // namespace volt
