// The Trainer: runs a LightningModule's fit, validate, test and predict.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "volt/checkpoint/checkpoint_state.h"
#include "volt/data/data_module.h"
#include "volt/loops/fit_result.h"
#include "volt/module/lightning_module.h"
#include "volt/options/trainer_options.h"
#include "volt/plan/run_plan.h"

namespace volt {

class CheckpointIO;
class Checkpointer;
class Collectives;
class Console;
class PrecisionPlugin;
class Strategy;
struct LastCheckpointSearch;
struct LoadedCheckpoint;
namespace internal {
class RequeueSignalGuard;
}

/// Runs a LightningModule like Lightning's Trainer.
///
/// The Trainer is a facade: it resolves the options into a RunPlan once, prepares each stage
/// (processes, loaders, devices, optimizers, loggers, callbacks, checkpoints) and hands the work
/// to the loops in `volt/loops/`.
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
  /// Finishes like teardown(), but cannot throw: a failure is printed as an error.
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
  /// Runs predict_step over the predict data and returns its outputs in order. Under ddp every
  /// process predicts a contiguous part of the data and global rank 0 returns all of them, in
  /// the data's order (the gathered ones on the CPU); the other ranks return their own part.
  std::vector<torch::Tensor> predict(LightningModule& module, DataLoader data = {}, const std::string& ckpt_path = "");

  /// fit() with the data of `data`: its prepare_data (once per node; the node's other processes
  /// wait), setup("fit"), train_dataloader and val_dataloader, then teardown("fit") also when the
  /// fit fails. A loader `data` leaves undefined comes from the module's hook.
  FitResult fit(LightningModule& module, DataModule& data, std::string ckpt_path = "");
  /// validate() with `data`'s val_dataloader, between its setup("validate") and teardown.
  EvalResult validate(LightningModule& module, DataModule& data, const std::string& ckpt_path = "");
  /// test() with `data`'s test_dataloader, between its setup("test") and teardown.
  EvalResult test(LightningModule& module, DataModule& data, const std::string& ckpt_path = "");
  /// predict() with `data`'s predict_dataloader, between its setup("predict") and teardown.
  std::vector<torch::Tensor> predict(LightningModule& module, DataModule& data, const std::string& ckpt_path = "");

  /// Waits for the processes this Trainer launched (ddp's local ranks) and throws volt::Error
  /// when one of them failed. Call it after the last stage to turn a failure that happened after
  /// the last collective into an error; the destructor calls it otherwise and can only print.
  void teardown();

  /// Replaces how checkpoints are written and read (default: atomic files).
  void set_checkpoint_io(std::shared_ptr<CheckpointIO> io);
  /// Replaces where notes, warnings, the progress bar and the model summary go (default: stdout
  /// and stderr). Only global rank 0 writes to it.
  void set_console(std::shared_ptr<Console> console);
  /// The resolved plan.
  const RunPlan& plan() const { return plan_; }
  /// The callback metrics after the last stage.
  const std::map<std::string, double>& callback_metrics() const { return callback_metrics_; }

 private:
  /// Runs `run` after printing the plan's notes (once per Trainer); under several processes an
  /// error is rethrown with the run's first failure named (Strategy::on_failure).
  template <typename Run>
  auto report_failures(Run&& run);
  /// fit() in a process that only supervises (RunPlan::supervises): runs the workers, restarts
  /// them after a failure, and returns a FitResult with `supervised` set.
  FitResult supervise_fit();
  /// The one set-up and teardown of every stage: the process settings, the strategy's
  /// environment, the module's view of the run and the stage's callbacks, then the module's
  /// setup(stage), `body(internal::StageContext&)`, and its teardown(stage) also when `body`
  /// throws. Outside fit, the callbacks' on_exception hears of an error first.
  template <typename Body>
  auto run_stage(LightningModule& module, Stage stage, Body&& body);
  /// prepare_data and setup(stage) of `data`, then `run`, then teardown(stage).
  template <typename Run>
  auto with_data_module(LightningModule& module, DataModule& data, Stage stage, Run&& run);
  /// The console on global rank 0, a silent one elsewhere (kept alive by the caller).
  std::shared_ptr<Console> rank_console() const;
  Strategy& strategy();
  /// Where ckpt_path="last" looks; the first ModelCheckpoint of `callbacks` names the first folder.
  LastCheckpointSearch last_search(const std::string& log_dir,
                                   const std::vector<std::shared_ptr<Callback>>& callbacks) const;
  void load_weights(LightningModule& module, const std::string& ckpt_path);
  /// Collective: the checkpoint a fit resumes from: a restarted run's newest HPC checkpoint or
  /// snapshot (from the memory tier when it has it), else `ckpt_path` (or options.ckpt_path)
  /// resolved; none for a fresh fit.
  std::optional<LoadedCheckpoint> resume_point(const std::string& ckpt_path, const std::string& log_dir,
                                               const std::vector<std::shared_ptr<Callback>>& callbacks,
                                               Collectives& collectives, Console& console);
  EvalResult evaluate(LightningModule& module, std::vector<DataLoader> loaders, const std::string& ckpt_path,
                      bool test);
  /// fit() with the given loaders; those not given come from `data` when set, else the module.
  FitResult fit_stage(LightningModule& module, DataLoader train, std::vector<DataLoader> val,
                      const std::string& ckpt_path, DataModule* data = nullptr);

  TrainerOptions options_;
  // Resolved once, in the constructor, and never changed: every stage reads the same plan.
  const RunPlan plan_;
  Env env_;
  std::unique_ptr<Strategy> strategy_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::unique_ptr<PrecisionPlugin> precision_;
  std::shared_ptr<Console> console_;
  std::map<std::string, double> callback_metrics_;
  // Where the last fit ended: what the module's current_epoch()/global_step() say in later stages.
  FitProgress fitted_;
  bool torn_down_ = false;
  bool notes_printed_ = false;
  std::unique_ptr<internal::RequeueSignalGuard> requeue_guard_;  // SLURM batch jobs with auto_requeue
};

}  // namespace volt
