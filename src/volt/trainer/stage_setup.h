// The steps of a stage's set-up that the Trainer composes: loaders, module placement, optimizers,
// callbacks and loggers. Each is a function of what it uses, so the Trainer reads as the order of
// the steps and each step can be read (and changed) alone.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "volt/callbacks/callback.h"
#include "volt/data/data_loader.h"
#include "volt/loggers/logger.h"
#include "volt/module/lightning_module.h"
#include "volt/options/trainer_options.h"
#include "volt/plan/run_plan.h"

namespace volt {

class Console;
class DataModule;
class FitLoop;
class ModelCheckpoint;
class PrecisionPlugin;
class StateSharding;
class Strategy;
class WeightSource;
struct FitLoaderCounts;
struct FitResult;

namespace internal {

/// How many batches of `loader` a stage runs under `limit` (the Trainer option `what`); unset:
/// until its stream ends.
std::optional<int64_t> batches_to_run(const DataLoader& loader, const BatchLimit& limit, const char* what);

/// Shards `loader` over the plan's processes (unless use_distributed_sampler=false); an
/// `evaluation` loader is not shuffled; a `contiguous` one gives each process a contiguous part.
void configure_loader(DataLoader& loader, const RunPlan& plan, bool evaluation, bool contiguous = false);

/// Configures fit's loaders for the plan and counts their batches; warns on `console` when
/// overfit_batches turns their shuffling off.
FitLoaderCounts count_fit_batches(const RunPlan& plan, Console& console, const LightningModule& module,
                                  DataLoader& train, std::vector<DataLoader>& val);

/// fit's loaders: those passed to fit() stay for the whole run; the others come from the
/// DataModule's hooks when there is one, else from the module's, and are asked for again on
/// reload() (reload_dataloaders_every_n_epochs).
class FitLoaders {
 public:
  /// Keeps `train` when defined and `val` when not empty, and asks `data` (nullptr: none) or
  /// `module` (both borrowed) for the others now, the training loader first.
  FitLoaders(LightningModule& module, DataModule* data, DataLoader train, std::vector<DataLoader> val);
  /// Asks the hooks again for the loaders that fit() was not given.
  void reload();
  /// The training loader; the fit loop borrows it, so a reload replaces what the loop sees.
  DataLoader& train() { return train_; }
  /// The validation loaders (none: no validation), borrowed by the fit loop like train().
  std::vector<DataLoader>& val() { return val_; }

 private:
  void load_from_hooks();

  LightningModule& module_;
  DataModule* data_;
  bool train_from_hook_;
  bool val_from_hook_;
  DataLoader train_;
  std::vector<DataLoader> val_;
};

/// The module's configure_model, and the layers it built checked as sync_batchnorm asks (every
/// rank builds the same ones, so every rank refuses alike).
void configure_fit_model(const RunPlan& plan, LightningModule& module);

/// Readies `module` to train and returns its optimizers and schedulers: cast to `precision` and
/// placed on the plan's root device before configure_optimizers (as in Lightning, so the
/// optimizers hold the device's parameters), in training mode, configure_optimization, then
/// fsdp's warning on `console` and the loss scaler's inf/NaN check shared over `strategy`.
OptimizerConfig prepare_training(const RunPlan& plan, LightningModule& module, PrecisionPlugin& precision,
                                 const std::vector<std::shared_ptr<Callback>>& callbacks, Strategy& strategy,
                                 Console& console);

/// Copies `source`'s weights into `module`'s parameters once the strategy has placed them: each
/// parameter read whole, except those `sharding` keeps in pieces (fsdp full_shard's units; nullptr:
/// none), of which only this process's elements are read and loaded into its pieces (a collective
/// then: call it on every process). Throws volt::Error naming the parameter and the source when
/// the source returns the wrong number of elements.
void load_initial_weights(LightningModule& module, StateSharding* sharding, WeightSource& source);

/// Runs `loop`, with anomaly detection when `detect_anomaly` (the process's mode, restored
/// after), then tells `strategy` that `module`'s fit finished: completed, or not when the loop
/// throws (rethrown).
FitResult run_fit_loop(FitLoop& loop, Strategy& strategy, LightningModule& module, bool detect_anomaly);

/// Converts `module` to `precision`'s dtype, then puts it on `device` (a no-op on the CPU, where
/// modules are built).
void place_module(LightningModule& module, PrecisionPlugin& precision, c10::Device device);

/// Throws volt::Error naming the layers when the plan asks for sync_batchnorm but `module` still
/// holds plain BatchNorm layers.
void refuse_plain_batchnorm(const RunPlan& plan, const LightningModule& module);

/// The module's configure_optimizers(), checked, after the callbacks' on_before_configure_optimizers;
/// the gradients zeroed and `strategy` set up for the module and its optimizers.
OptimizerConfig configure_optimization(LightningModule& module, const std::vector<std::shared_ptr<Callback>>& callbacks,
                                       Strategy& strategy);

/// Warns on `console` when fsdp's full_shard has no volt::FsdpUnit in `module` to shard.
void warn_if_nothing_to_shard(const RunPlan& plan, LightningModule& module, Console& console);

/// Makes the loss scaler's inf/NaN check every process's where `strategy` shards the gradients.
void share_found_inf(PrecisionPlugin& precision, Strategy& strategy);

/// The first ModelCheckpoint among `callbacks`, or nullptr.
ModelCheckpoint* first_model_checkpoint(const std::vector<std::shared_ptr<Callback>>& callbacks);

/// The user's callbacks plus the default ModelCheckpoint (or without any, when checkpointing is
/// off) and max_time's Timer, in Lightning's order: checkpointing callbacks last, after e.g.
/// EarlyStopping decided.
std::vector<std::shared_ptr<Callback>> fit_callbacks(std::vector<std::shared_ptr<Callback>> callbacks,
                                                     const RunPlan& plan, Console& console);

/// The loggers of a fit on global rank 0: the user's, or Lightning's defaults (TensorBoard event
/// files and the CSV that `volt plot` reads, in one version folder); and an MLFlowLogger when the
/// plan has an MLflow server. The loggers made here warn on `console`, the Trainer's.
std::vector<std::shared_ptr<Logger>> fit_loggers(const TrainerOptions& options, const RunPlan& plan,
                                                 std::shared_ptr<Console> console);

/// What the fit's callbacks learn in setup(): the folders, the data and the schedule.
FitInfo fit_info(const RunPlan& plan, std::string log_dir, const FitLoaderCounts& counts,
                 const OptimizerConfig& optimization);

/// LightningCLI's SaveConfigCallback: the program's `config` beside the logs (global rank 0), so
/// a run's folder records how it was started; each of `loggers` hears of the file.
void save_run_config(const nlohmann::json& config, const FitInfo& info,
                     const std::vector<std::shared_ptr<Logger>>& loggers);

}  // namespace internal
}  // namespace volt
