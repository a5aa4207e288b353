// The Trainer: runs a LightningModule's fit, validate, test and predict.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "volt/module/lightning_module.h"
#include "volt/trainer/fit_result.h"
#include "volt/trainer/run_plan.h"
#include "volt/trainer/trainer_options.h"

namespace volt {

class CheckpointIO;
class PrecisionPlugin;
class Strategy;
namespace internal {
class RequeueSignalGuard;
}

/// Runs a LightningModule like Lightning's Trainer.
///
/// Example:
/// ```
/// volt::Trainer trainer({.max_epochs = 3, .seed = 42});
/// volt::FitResult result = trainer.fit(model);
/// std::cout << result.brief_report() << "\n";
/// ```
class Trainer {
 public:
  /// Validates `options` against this process's environment; throws volt::Error on bad options.
  explicit Trainer(TrainerOptions options = {});
  /// Like above with an explicit environment and machine (tests).
  Trainer(TrainerOptions options, const Env& env, const MachineInfo& machine);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// Trains `module` on its train_dataloader (or `train`), validating on its val_dataloader
  /// (or `val`). Resumes from `ckpt_path` ("last", "best" or a path; empty: options.ckpt_path).
  FitResult fit(LightningModule& module, DataLoader train = {}, DataLoader val = {}, std::string ckpt_path = "");
  /// One validation pass; weights come from `ckpt_path` when given ("best", "last" or a path),
  /// else the module is evaluated as it is (options.ckpt_path applies to fit only).
  EvalResult validate(LightningModule& module, DataLoader val = {}, const std::string& ckpt_path = "");
  /// One test pass; weights come from `ckpt_path` when given ("best", "last" or a path).
  EvalResult test(LightningModule& module, DataLoader test = {}, const std::string& ckpt_path = "");
  /// Runs predict_step over the predict data and returns its outputs in order.
  std::vector<torch::Tensor> predict(LightningModule& module, DataLoader data = {}, const std::string& ckpt_path = "");

  /// Replaces how checkpoints are written and read (default: atomic files).
  void set_checkpoint_io(std::shared_ptr<CheckpointIO> io);
  /// The resolved plan.
  const RunPlan& plan() const { return plan_; }
  /// The callbacks in use, the default ones included once fit started.
  const std::vector<std::shared_ptr<Callback>>& callbacks() const { return callbacks_; }
  /// The precision plugin of this run (autocast, loss scaling, casts), for strategies that run
  /// the steps themselves (dp).
  PrecisionPlugin& precision_plugin() { return *precision_; }
  /// The callback metrics after the last stage.
  const std::map<std::string, double>& callback_metrics() const { return callback_metrics_; }

 private:
  class FitRun;
  std::string resolve_ckpt_path(const std::string& requested) const;
  void configure_loader(DataLoader& loader, bool evaluation = false) const;
  EvalResult evaluate(LightningModule& module, DataLoader loader, const std::string& ckpt_path, bool test);

  TrainerOptions options_;
  RunPlan plan_;
  std::unique_ptr<Strategy> strategy_;
  std::shared_ptr<CheckpointIO> checkpoint_io_;
  std::unique_ptr<PrecisionPlugin> precision_;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  std::map<std::string, double> callback_metrics_;
  std::string best_model_path_;
  std::string last_model_path_;
  std::unique_ptr<internal::RequeueSignalGuard> requeue_guard_;  // SLURM batch jobs with auto_requeue
};

}  // namespace volt
