#include "volt/trainer/trainer.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <typeinfo>

#include "volt/callbacks/callback.h"
#include "volt/callbacks/model_checkpoint.h"
#include "volt/callbacks/timer.h"
#include "volt/checkpoint/checkpointer.h"
#include "volt/core/console.h"
#include "volt/core/error.h"
#include "volt/environments/requeue.h"
#include "volt/loggers/csv_logger.h"
#include "volt/loggers/hparams_yaml.h"
#include "volt/loggers/mlflow_logger.h"
#include "volt/loggers/tensorboard_logger.h"
#include "volt/loops/evaluation_loop.h"
#include "volt/loops/fit_loop.h"
#include "volt/loops/metric_router.h"
#include "volt/loops/prediction_loop.h"
#include "volt/loops/stage_profile.h"
#include "volt/module/result_collection.h"
#include "volt/module/run_view.h"
#include "volt/nn/sync_batch_norm.h"
#include "volt/optim/lr_scheduler.h"
#include "volt/precision/precision_plugin.h"
#include "volt/profiler/profiler.h"
#include "volt/progress/progress_bar.h"
#include "volt/strategies/fsdp_strategy.h"
#include "volt/strategies/strategy_factory.h"
#include "volt/trainer/process_setup.h"

namespace volt {
namespace {

/// The stage's profiler as the plan asks (timing only when it asks for none).
Profiler make_profiler(const RunPlan& plan) {
  return Profiler(plan.profiler, plan.profiler_wait, plan.profiler_warmup, plan.profiler_active);
}

// The module's view of a stage: the plan's topology and device, the strategy's collectives, and
// the fit loop's progress (or where the last fit ended).
class StageView : public RunView {
 public:
  StageView(Strategy& strategy, torch::Device device, std::shared_ptr<Console> console, const FitProgress& progress)
      : strategy_(strategy), device_(device), console_(std::move(console)), progress_(&progress) {}
  /// Reads `progress` from now on (the fit loop's, once it exists).
  void watch(const FitProgress& progress) { progress_ = &progress; }

  int64_t current_epoch() const override { return progress_->epoch; }
  int64_t global_step() const override { return progress_->global_step; }
  const Topology& topology() const override { return strategy_.topology(); }
  torch::Device device() const override { return device_; }
  Collectives& collectives() const override { return strategy_.collectives(); }
  bool shards_gradients() const override { return strategy_.state_sharding() != nullptr; }
  void print(const std::string& line) const override { console_->info(line); }

 private:
  Strategy& strategy_;
  torch::Device device_;
  std::shared_ptr<Console> console_;
  const FitProgress* progress_;
};

// The callbacks of validate, test and predict: their epoch and batch hooks see the module and
// where the last fit ended. Nothing is saved or logged outside fit, and a stop has nothing to
// stop, so it is ignored.
class StageCallbacks : public CallbackDispatcher, public CallbackServices {
 public:
  StageCallbacks(const std::vector<std::shared_ptr<Callback>>& callbacks, LightningModule& module,
                 const FitProgress& progress, const std::map<std::string, double>& metrics, Strategy& strategy)
      : callbacks_(callbacks), module_(module), progress_(progress), metrics_(metrics), strategy_(strategy) {}

  void dispatch(const CallbackHook& hook, const HookPoint& point) override {
    const CallbackContext c = context(point);
    for (const auto& callback : callbacks_) hook(*callback, c, *this);
  }
  CallbackContext context(const HookPoint& point) const {
    CallbackContext c;
    c.epoch = progress_.epoch;
    c.global_step = progress_.global_step;
    c.metrics = &metrics_;
    c.module = &module_;
    c.batch = point.batch;
    c.batch_idx = point.batch_idx;
    c.dataloader_idx = point.dataloader_idx;
    c.outputs = point.outputs;
    return c;
  }
  void save_checkpoint(const std::string& path) override {
    throw Error(fmt::format(
        "a callback asked to save checkpoint '{}' during validate, test or predict, where there is no training "
        "state to save. HINT: save checkpoints from the fit hooks (on_train_epoch_end, on_validation_end).",
        path));
  }
  void save_weights_checkpoint(const std::string& path) override {
    throw Error(
        fmt::format("a callback asked to save weights checkpoint '{}' during validate, test or predict; only fit saves "
                    "checkpoints. HINT: save checkpoints from the fit hooks (on_train_epoch_end, on_validation_end).",
                    path));
  }
  bool broadcast_decision(bool decision) override { return rank_zero_decision(strategy_, decision); }
  void remove_checkpoint(const std::string& path) override {
    throw Error(
        fmt::format("a callback asked to remove checkpoint '{}' during validate, test or predict; only fit manages "
                    "checkpoints. HINT: remove checkpoints from the fit hooks.",
                    path));
  }
  // validate, test and predict log to no logger (their values are the stage's result).
  void log_metrics(const std::map<std::string, double>&) override {}

  /// Runs `body`; when it throws, the callbacks' on_exception sees the error first.
  template <typename Body>
  auto run(Body&& body) {
    try {
      return body();
    } catch (const std::exception& error) {
      internal::notify_exception(callbacks_, context({}), error, *this);
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

/// The Trainer's callbacks with the module's configure_callbacks() added, by Lightning's rule: a
/// module callback replaces the Trainer's callbacks of its exact type.
std::vector<std::shared_ptr<Callback>> with_module_callbacks(std::vector<std::shared_ptr<Callback>> callbacks,
                                                             LightningModule& module) {
  for (std::shared_ptr<Callback>& added : module.configure_callbacks()) {
    VOLT_CHECK(added != nullptr, "{}::configure_callbacks returned a null callback.", module.name());
    const Callback& replacing = *added;
    callbacks.erase(std::remove_if(callbacks.begin(), callbacks.end(),
                                   [&](const std::shared_ptr<Callback>& c) { return typeid(*c) == typeid(replacing); }),
                    callbacks.end());
    callbacks.push_back(std::move(added));
  }
  return callbacks;
}

/// The module's setup(stage), then `run`, then its teardown(stage), also when `run` throws (then
/// an error from teardown is dropped: the stage's is the one to report).
template <typename Run>
auto with_module_stage(LightningModule& module, Stage stage, Run&& run) {
  module.setup(stage);
  try {
    auto result = run();
    module.teardown(stage);
    return result;
  } catch (...) {
    try {
      module.teardown(stage);
    } catch (...) {
    }
    throw;
  }
}

namespace fs = std::filesystem;

/// How many batches of `loader` a stage runs under `limit` (the Trainer option `what`); unset:
/// until its stream ends.
std::optional<int64_t> batches_to_run(const DataLoader& loader, const BatchLimit& limit, const char* what) {
  if (loader.streaming()) return limit.resolve_unknown(what);
  return limit.resolve(loader.num_batches());
}

/// Puts the module on the run's device (a no-op on the CPU, where modules are built).
void place_module(LightningModule& module, c10::Device device) {
  if (!device.is_cpu()) module.to(device);
}

void validate_optimization(const OptimizerConfig& optimization, const LightningModule& module) {
  VOLT_CHECK(!optimization.optimizers.empty(),
             "{}::configure_optimizers returned no optimizer. HINT: return e.g. "
             "std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-3)).",
             module.name());
  for (const auto& optimizer : optimization.optimizers)
    VOLT_CHECK(optimizer != nullptr, "{}::configure_optimizers returned a null optimizer.", module.name());
  for (const auto& config : optimization.schedulers) {
    VOLT_CHECK(config.scheduler != nullptr, "{}::configure_optimizers returned a null scheduler.", module.name());
    VOLT_CHECK(config.frequency >= 1, "scheduler frequency={} must be >= 1.", config.frequency);
    VOLT_CHECK(!config.scheduler->needs_metric() || !config.monitor.empty(),
               "{} needs a metric, but its SchedulerConfig has no monitor. HINT: set "
               "SchedulerConfig::monitor to a logged metric such as \"val/loss\".",
               config.scheduler->name());
  }
}

ModelCheckpoint* first_model_checkpoint(const std::vector<std::shared_ptr<Callback>>& callbacks) {
  for (const auto& c : callbacks)
    if (auto* checkpoint = dynamic_cast<ModelCheckpoint*>(c.get())) return checkpoint;
  return nullptr;
}

/// The user's callbacks plus the default ModelCheckpoint (or without any, when checkpointing is
/// off) and max_time's Timer, in Lightning's order: checkpointing callbacks last, after e.g.
/// EarlyStopping decided.
std::vector<std::shared_ptr<Callback>> fit_callbacks(std::vector<std::shared_ptr<Callback>> callbacks,
                                                     bool enable_checkpointing, const RunPlan& plan, Console& console) {
  if (plan.max_time) {
    // Lightning's rule: a Timer the user configured wins over max_time.
    const bool has_timer = std::any_of(callbacks.begin(), callbacks.end(),
                                       [](const auto& c) { return dynamic_cast<const Timer*>(c.get()) != nullptr; });
    if (has_timer) {
      console.warn("Ignoring max_time in favour of the Timer callback among the callbacks.");
    } else {
      callbacks.push_back(
          std::make_shared<Timer>(TimerOptions{.duration = std::chrono::duration<double>(*plan.max_time),
                                               .save_checkpoint = plan.enable_checkpointing && !plan.fast_dev_run}));
    }
  }
  if (enable_checkpointing && first_model_checkpoint(callbacks) == nullptr) {
    callbacks.push_back(std::make_shared<ModelCheckpoint>());
  }
  if (!enable_checkpointing) {
    callbacks.erase(std::remove_if(callbacks.begin(), callbacks.end(),
                                   [](const auto& c) { return dynamic_cast<ModelCheckpoint*>(c.get()) != nullptr; }),
                    callbacks.end());
  }
  std::stable_partition(callbacks.begin(), callbacks.end(), [](const std::shared_ptr<Callback>& c) {
    return dynamic_cast<ModelCheckpoint*>(c.get()) == nullptr;
  });
  return callbacks;
}

/// The loggers of a fit on global rank 0: the user's, or Lightning's defaults (TensorBoard event
/// files and the CSV that `volt plot` reads, in one version folder); and an MLFlowLogger when the
/// plan has an MLflow server. The loggers made here warn on `console`, the Trainer's.
std::vector<std::shared_ptr<Logger>> fit_loggers(const TrainerOptions& options, const RunPlan& plan,
                                                 std::shared_ptr<Console> console) {
  if (!plan.is_global_zero()) return {};
  std::vector<std::shared_ptr<Logger>> loggers = options.loggers;
  const bool defaults = loggers.empty() && plan.use_default_logger;
  if (!defaults && !plan.mlflow) return loggers;
  LoggerOptions logger_options;
  logger_options.save_dir = plan.root_dir;
  logger_options.console = std::move(console);
  if (!plan.requeue.job_id.empty()) {
    // A SLURM batch job logs under its job id, so a requeued run continues the same folder.
    logger_options.version = plan.requeue.job_id;
    logger_options.append = true;
  } else {
    // Resolved once, so both loggers get the same folder.
    logger_options.version = resolve_version(logger_options);
  }
  if (defaults) {
    loggers.push_back(std::make_shared<TensorBoardLogger>(logger_options));
    loggers.push_back(std::make_shared<CSVLogger>(logger_options));
  }
  // MLflow beside the others, its local files (the run's id, anything undelivered) in their folder.
  if (plan.mlflow) loggers.push_back(std::make_shared<MLFlowLogger>(logger_options, *plan.mlflow));
  return loggers;
}

/// Rethrows `e` with `message`, keeping its type (and so the exit code run_main maps it to).
[[noreturn]] void rethrow_with_message(const std::exception& e, const std::string& message) {
  if (dynamic_cast<const CheckpointError*>(&e)) throw CheckpointError(message);
  if (dynamic_cast<const Error*>(&e)) throw Error(message);
  if (dynamic_cast<const InternalError*>(&e)) throw InternalError(message);
  throw std::runtime_error(message);
}

}  // namespace

Trainer::Trainer(TrainerOptions options) : Trainer(std::move(options), Env::from_process(), MachineInfo::current()) {}

Trainer::Trainer(TrainerOptions options, const Env& env, const MachineInfo& machine)
    : options_(std::move(options)),
      plan_(resolve_run_plan(options_, env, machine)),
      env_(env),
      checkpointer_(std::make_unique<Checkpointer>()),
      precision_(make_precision_plugin(plan_.precision, device_type(plan_.accelerator))),
      console_(make_stdio_console()) {
  // Now, not in fit: SLURM's signal kills a process that does not catch it, and it may come
  // while the program is still loading its data. The guard restores the previous handler when
  // the Trainer goes.
  if (plan_.requeue.enabled) requeue_guard_ = std::make_unique<internal::RequeueSignalGuard>(plan_.requeue.signal);
  // Lightning's seed_everything, so a module built after the Trainer starts from the same
  // weights every run (each stage seeds again before it runs).
  if (plan_.seed) torch::manual_seed(*plan_.seed);
}

Trainer::~Trainer() {
  // Unwinding from a failure: on_failure already stopped the other processes, and the error on
  // its way up is the one to report.
  if (std::uncaught_exceptions() > 0 || torn_down_) return;
  try {
    teardown();
  } catch (const std::exception& e) {
    // Nothing is left to throw to; the program should have called teardown() to see this. Not
    // rank_console(): the failure is this process's own, and no other process reports it.
    console_->warn(fmt::format("the Trainer's teardown failed, and a destructor cannot throw: {}", e.what()));
  }
}

void Trainer::teardown() {
  torn_down_ = true;
  if (strategy_) strategy_->teardown();
}

std::shared_ptr<Console> Trainer::rank_console() const { return only_on_global_zero(console_, plan_.is_global_zero()); }

void Trainer::set_console(std::shared_ptr<Console> console) {
  VOLT_CHECK(console != nullptr, "set_console got a null Console. HINT: pass volt::make_stdio_console() or your own.");
  console_ = std::move(console);
}

Strategy& Trainer::strategy() {
  // Made by the first stage that needs it, so a Trainer that never runs one picks no port.
  if (!strategy_) strategy_ = make_strategy(plan_, env_, rank_console());
  return *strategy_;
}

template <typename Stage>
auto Trainer::run_stage(Stage&& stage) {
  // The console replaced by set_console() is the one the notes go to, so print them here.
  if (!notes_printed_) {
    notes_printed_ = true;
    const std::shared_ptr<Console> out = rank_console();
    for (const auto& note : plan_.notes) out->info("Note: " + note);
  }
  try {
    return stage();
  } catch (const std::exception& e) {
    if (plan_.topology.world_size == 1) throw;
    // Name the first failure of the run once, instead of every rank's secondary error.
    rethrow_with_message(e, strategy().on_failure(e.what()));
  }
}

template <typename Run>
auto Trainer::with_data_module(LightningModule& module, DataModule& data, Stage stage, Run&& run) {
  run_stage([&] {
    strategy().setup_environment(module);
    const bool prepares =
        data.prepare_data_per_node() ? plan_.topology.local_rank == 0 : plan_.topology.global_rank == 0;
    if (prepares) data.prepare_data();
    // The other processes read what prepare_data wrote: none goes on before it is complete.
    strategy().barrier();
    data.setup(stage);
  });
  try {
    auto result = run();
    data.teardown(stage);
    return result;
  } catch (...) {
    // The stage's error is the one to report; a teardown that fails after it adds nothing.
    try {
      data.teardown(stage);
    } catch (...) {
    }
    throw;
  }
}

FitResult Trainer::fit(LightningModule& module, DataModule& data, std::string ckpt_path) {
  return with_data_module(module, data, Stage::kFit,
                          [&] { return run_stage([&] { return fit_stage(module, {}, {}, ckpt_path, &data); }); });
}

EvalResult Trainer::validate(LightningModule& module, DataModule& data, const std::string& ckpt_path) {
  return with_data_module(module, data, Stage::kValidate,
                          [&] { return evaluate(module, data.val_dataloaders(), ckpt_path, /*test=*/false); });
}

EvalResult Trainer::test(LightningModule& module, DataModule& data, const std::string& ckpt_path) {
  return with_data_module(module, data, Stage::kTest,
                          [&] { return evaluate(module, data.test_dataloaders(), ckpt_path, /*test=*/true); });
}

std::vector<torch::Tensor> Trainer::predict(LightningModule& module, DataModule& data, const std::string& ckpt_path) {
  return with_data_module(module, data, Stage::kPredict,
                          [&] { return predict(module, data.predict_dataloader(), ckpt_path); });
}

void Trainer::configure_loader(DataLoader& loader, bool evaluation, bool contiguous) const {
  if (plan_.use_distributed_sampler) {
    loader.configure(plan_.topology.world_size, plan_.topology.global_rank, plan_.loader_seed, !evaluation, contiguous);
  } else {
    loader.configure(1, 0, plan_.loader_seed);
  }
}

void Trainer::set_checkpoint_io(std::shared_ptr<CheckpointIO> io) { checkpointer_->set_io(std::move(io)); }

LastCheckpointSearch Trainer::last_search(const std::string& log_dir,
                                          const std::vector<std::shared_ptr<Callback>>& callbacks) const {
  LastCheckpointSearch search;
  search.root_dir = plan_.root_dir;
  if (const ModelCheckpoint* checkpoint = first_model_checkpoint(callbacks)) {
    search.checkpoint_dir = checkpoint->options().dirpath;
  }
  // This run's version folder is new and empty; its siblings hold the earlier runs.
  if (!log_dir.empty()) search.logs_dir = fs::path(log_dir).parent_path().string();
  search.version = plan_.requeue.job_id;
  return search;
}

FitResult Trainer::fit(LightningModule& module, DataLoader train, DataLoader val, std::string ckpt_path) {
  std::vector<DataLoader> vals;
  if (val.defined()) vals.push_back(std::move(val));
  return run_stage([&] { return fit_stage(module, std::move(train), std::move(vals), ckpt_path); });
}

FitLoaderCounts Trainer::count_fit_batches(LightningModule& module, DataLoader& train,
                                           std::vector<DataLoader>& val) const {
  VOLT_CHECK(train.defined(),
             "{} has no training data: train_dataloader() returned none and fit() was given none. HINT: override "
             "train_dataloader() or pass a volt::DataLoader to fit().",
             module.name());
  FitLoaderCounts counts;
  if (plan_.overfit_batches) {
    // Lightning's overfit_batches: the same batches every epoch, in both loops.
    const auto unshuffle = [this](DataLoader& loader, const char* stage) {
      if (!loader.defined() || !loader.options().shuffle) return;
      rank_console()->warn(fmt::format(
          "You requested to overfit but enabled {0} dataloader shuffling. We are turning off the {0} dataloader "
          "shuffling for you.",
          stage));
      loader.set_shuffle(false);
    };
    unshuffle(train, "train");
    for (DataLoader& loader : val) unshuffle(loader, "val");
  }
  configure_loader(train, /*evaluation=*/false);
  counts.num_train_batches = batches_to_run(train, plan_.limit_train_batches, "limit_train_batches");
  for (DataLoader& loader : val) {
    VOLT_CHECK(loader.defined(),
               "{}::val_dataloaders() returned an undefined loader among {}. HINT: return only "
               "loaders that have data.",
               module.name(), val.size());
    configure_loader(loader, /*evaluation=*/true);
    counts.num_val_batches.push_back(batches_to_run(loader, plan_.limit_val_batches, "limit_val_batches"));
    counts.has_validation =
        counts.has_validation || !counts.num_val_batches.back() || *counts.num_val_batches.back() > 0;
  }
  const std::optional<int64_t>& num_train_batches = counts.num_train_batches;
  if (!plan_.val_check_interval.is_fraction()) {
    counts.val_interval = plan_.val_check_interval.count();
    VOLT_CHECK(!num_train_batches || *counts.val_interval <= *num_train_batches || !counts.has_validation,
               "val_check_interval={} is larger than the {} training batches of an epoch. HINT: use a value <= {} or "
               "a fraction such as 0.5.",
               *counts.val_interval, *num_train_batches, *num_train_batches);
  } else if (num_train_batches) {
    counts.val_interval =
        std::max<int64_t>(1, static_cast<int64_t>(*num_train_batches * plan_.val_check_interval.fraction()));
  } else {
    // A stream's epoch has no length to take a fraction of: validation runs at its end.
    plan_.val_check_interval.resolve_unknown("val_check_interval");
  }
  return counts;
}

FitResult Trainer::fit_stage(LightningModule& module, DataLoader train, std::vector<DataLoader> val,
                             const std::string& ckpt_path, DataModule* data) {
  const internal::ProcessSettingsScope settings(plan_, /*seed=*/true);
  internal::StopSignalGuard signals;
  // Before any process starts or joins: every rank refuses the same model the same way.
  if (plan_.sync_batchnorm) {
    const std::vector<std::string> plain = plain_batchnorm_paths(module);
    if (!plain.empty()) throw Error(plain_batchnorm_message(plain));
  }
  Strategy& strategy = this->strategy();
  strategy.setup_environment(module);
  const std::shared_ptr<Console> console_ptr = rank_console();
  Console& console = *console_ptr;
  // A fresh fit starts at epoch 0; restore() moves the loop's progress to the checkpoint's.
  fitted_ = FitProgress{};
  StageView view(strategy, plan_.root_device(), console_ptr, fitted_);
  const RunViewScope viewing(module, &view);
  const std::vector<std::shared_ptr<Callback>> stage_callbacks = with_module_callbacks(options_.callbacks, module);
  FitResult result = with_module_stage(module, Stage::kFit, [&] {
    module.configure_model();
    // configure_model may have built BatchNorm layers (each rank the same ones).
    if (plan_.sync_batchnorm) {
      const std::vector<std::string> plain = plain_batchnorm_paths(module);
      if (!plain.empty()) throw Error(plain_batchnorm_message(plain));
    }
    // The layers hold the process group's collectives for this fit only (also when it throws).
    SyncBatchNormScope sync_batchnorm(module, plan_.sync_batchnorm ? &strategy.collectives() : nullptr);

    // Loaders passed to fit() stay for the whole run; those from the DataModule or the module's
    // hooks are asked for again when reload_dataloaders_every_n_epochs says so.
    const bool train_from_hook = !train.defined();
    const bool val_from_hook = val.empty();
    auto train_source = [&] { return data ? data->train_dataloader() : module.train_dataloader(); };
    auto val_source = [&] { return data ? data->val_dataloaders() : module.val_dataloaders(); };
    if (train_from_hook) train = train_source();
    if (val_from_hook) val = val_source();
    const FitLoaderCounts counts = count_fit_batches(module, train, val);

    precision_->convert_module(module);
    // Before configure_optimizers, as in Lightning, so the optimizers hold the device's parameters.
    place_module(module, plan_.root_device());
    module.train();
    for (const auto& callback : stage_callbacks) callback->on_before_configure_optimizers(module);
    const OptimizerConfig optimization = module.configure_optimizers();
    validate_optimization(optimization, module);
    for (const auto& optimizer : optimization.optimizers) optimizer->zero_grad();
    strategy.setup_module(module);
    strategy.setup_optimizers(module, optimization.optimizers);
    if (plan_.strategy == StrategyKind::kFsdp && plan_.sharding_strategy == ShardingStrategy::kFullShard &&
        find_fsdp_units(module, plan_.fsdp_min_unit_params).empty()) {
      console.warn(fmt::format(
          "sharding_strategy='full_shard', but {} holds no volt::FsdpUnit{}: every parameter stays whole on every "
          "process, as under shard_grad_op. HINT: wrap the large layers in volt::FsdpUnit (see "
          "docs/strategies.md), or use sharding_strategy='shard_grad_op'.",
          module.name(),
          plan_.fsdp_min_unit_params > 0 ? fmt::format(" with >= {} parameter elements", plan_.fsdp_min_unit_params)
                                         : std::string()));
    }
    // Each fsdp process sees its shard of the gradients: the loss scaler's inf/NaN check must be
    // every process's, or one would skip a step the others take (PyTorch's ShardedGradScaler).
    if (GradScaler* scaler = precision_->scaler()) {
      scaler->set_found_inf_sync(nullptr);
      if (strategy.state_sharding() != nullptr) {
        scaler->set_found_inf_sync([&strategy](torch::Tensor& found) { strategy.reduce(found, Reduce::kMax); });
      }
    }

    MetricRouter metrics(callback_metrics_, fit_loggers(options_, plan_, console_ptr));
    const std::vector<std::shared_ptr<Callback>> callbacks =
        fit_callbacks(stage_callbacks, plan_.enable_checkpointing, plan_, console);
    FitInfo info;
    info.root_dir = plan_.root_dir;
    info.log_dir = strategy.broadcast_string(metrics.log_dir());
    info.has_validation = counts.has_validation;
    info.is_global_zero = plan_.is_global_zero();
    if (plan_.max_epochs >= 0) info.max_epochs = plan_.max_epochs;
    info.num_lr_schedulers = optimization.schedulers.size();
    info.log_every_n_steps = plan_.log_every_n_steps;
    for (const auto& callback : callbacks) callback->setup(info);
    // A job SLURM restarted resumes where it stopped: the newest HPC checkpoint wins over
    // ckpt_path, which the job script passes again on every restart (Lightning's order).
    std::optional<LoadedCheckpoint> resume;
    if (!plan_.fast_dev_run) resume = checkpointer_->newest_hpc_checkpoint(plan_.hpc_checkpoint_dir, console);
    // options.ckpt_path is fit's default only: validate/test/predict never pick it up implicitly.
    const std::string requested = ckpt_path.empty() ? plan_.ckpt_path : ckpt_path;
    if (resume && !requested.empty()) {
      console.info(
          fmt::format("Resuming from HPC checkpoint {} instead of ckpt_path='{}': the job was stopped by "
                      "SLURM and restarted.",
                      resume->path, requested));
    }
    if (!resume) {
      // The stage's callbacks: a ModelCheckpoint from configure_callbacks names the folder too.
      const std::string path = checkpointer_->resolve(requested, last_search(info.log_dir, stage_callbacks), console);
      if (!path.empty()) resume = LoadedCheckpoint{path, checkpointer_->load(path)};
    }

    // The profile and trace go beside the logs (Lightning's trainer.log_dir), else to the root.
    const std::string profile_dir = info.log_dir.empty() ? plan_.root_dir : info.log_dir;
    Profiler profiler = make_profiler(plan_);
    profiler.start_stage("fit", stage_profile_path(profile_dir, "trace", "fit", plan_.topology.global_rank, ".json"));
    FitLoop loop(FitLoopParts{.plan = plan_,
                              .strategy = strategy,
                              .precision = *precision_,
                              .checkpointer = *checkpointer_,
                              .metrics = metrics,
                              .console = console,
                              .callbacks = callbacks,
                              .profiler = profiler,
                              .config = &options_.config},
                 FitData{.module = module,
                         .train = train,
                         .val = val,
                         .optimization = optimization,
                         .counts = counts,
                         .reload = [&] {
                           if (train_from_hook) train = train_source();
                           if (val_from_hook) val = val_source();
                           return count_fit_batches(module, train, val);
                         }});
    view.watch(loop.progress());
    // Only now, with the checkpoint found, read and restored, does the run write into its log
    // folder: a run refused for its ckpt_path, or for a checkpoint that does not fit, leaves no
    // empty version_N behind.
    if (resume) loop.restore(*resume);
    for (const auto& logger : metrics.loggers()) logger->log_hyperparams(module.hparams());
    // LightningCLI's SaveConfigCallback: the resolved configuration beside the logs, so a run's
    // folder records how it was started.
    if (!options_.config.is_null() && info.is_global_zero && !info.log_dir.empty()) {
      fs::create_directories(info.log_dir);
      const std::string config_path = (fs::path(info.log_dir) / kConfigFileName).string();
      save_hparams_to_yaml(config_path, options_.config);
      for (const auto& logger : metrics.loggers()) logger->after_save_config(config_path);
    }

    FitResult fit_result = [&] {
      // Anomaly mode is the process's: on for this fit only (Lightning wraps its fit loop alike).
      const internal::AnomalyModeScope anomaly(plan_.detect_anomaly);
      try {
        return loop.run();
      } catch (...) {
        strategy.finish_fit(module, /*completed=*/false);
        throw;
      }
    }();
    strategy.finish_fit(module, /*completed=*/true);
    finish_stage_profile(profiler, strategy, console, profile_dir);
    fitted_ = loop.progress();
    checkpointer_->remember(fit_result.best_model_path, fit_result.last_model_path);
    return fit_result;
  });
  if (result.reason != StopReason::kRequeued) return result;
  // Every rank has returned from its last collective; the requeue ends this run at once
  // (SIGTERM now, SIGKILL after KillWait), so it is the very last thing rank 0 does. SIGTERM is
  // ignored from here on: SLURM sends it to a process that only has to exit.
  internal::RequeueSignalGuard::clear();
  signals.ignore_sigterm_after();
  if (!plan_.is_global_zero()) return result;
  const RequeueOutcome outcome = requeue_slurm_job(plan_.requeue.job_id);
  if (outcome.ok) {
    console.info(fmt::format("Requeued SLURM job {} ({}); it resumes from {}", plan_.requeue.job_id, outcome.command,
                             result.hpc_checkpoint_path));
    return result;
  }
  console.warn(
      fmt::format("`{}` failed: {}\nThe HPC checkpoint {} is saved; resubmit the job to resume from it. "
                  "HINT: allow requeueing (#SBATCH --requeue), or set auto_requeue=false to stop on the "
                  "signal without requeueing.",
                  outcome.command, outcome.output, result.hpc_checkpoint_path));
  result.reason = StopReason::kInterrupted;
  result.message = "requeue failed: " + outcome.output;
  return result;
}

void Trainer::load_weights(LightningModule& module, const std::string& ckpt_path) {
  const std::shared_ptr<Console> console_ptr = rank_console();
  Console& console = *console_ptr;
  const std::string path = checkpointer_->resolve(ckpt_path, last_search("", options_.callbacks), console);
  if (!path.empty()) load_module_weights(checkpointer_->load(path), module, path);
}

EvalResult Trainer::evaluate(LightningModule& module, std::vector<DataLoader> loaders, const std::string& ckpt_path,
                             bool test) {
  return run_stage([&] {
    const internal::ProcessSettingsScope settings(plan_, /*seed=*/false);
    strategy().setup_environment(module);
    StageView view(strategy(), plan_.root_device(), rank_console(), fitted_);
    const RunViewScope viewing(module, &view);
    const std::vector<std::shared_ptr<Callback>> callbacks = with_module_callbacks(options_.callbacks, module);
    StageCallbacks hooks(callbacks, module, fitted_, callback_metrics_, strategy());
    return with_module_stage(module, test ? Stage::kTest : Stage::kValidate, [&] {
      return hooks.run([&] {
        module.configure_model();
        const char* stage = test ? "test" : "validate";
        if (loaders.empty()) loaders = test ? module.test_dataloaders() : module.val_dataloaders();
        VOLT_CHECK(!loaders.empty(),
                   "{}() has no data: {}_dataloader() returned none and none was passed. HINT: override "
                   "{}_dataloader() or pass a volt::DataLoader.",
                   stage, test ? "test" : "val", test ? "test" : "val");
        load_weights(module, ckpt_path);
        precision_->convert_module(module);
        place_module(module, plan_.root_device());
        std::vector<std::optional<int64_t>> batches;
        for (DataLoader& loader : loaders) {
          VOLT_CHECK(loader.defined(), "{}() got an undefined loader among {}. HINT: pass only loaders that have data.",
                     stage, loaders.size());
          configure_loader(loader, /*evaluation=*/true);
          loader.set_epoch(0);
          batches.push_back(batches_to_run(loader, test ? plan_.limit_test_batches : plan_.limit_val_batches,
                                           test ? "limit_test_batches" : "limit_val_batches"));
        }
        const std::shared_ptr<Console> console_ptr = rank_console();
        Console& console = *console_ptr;
        const std::unique_ptr<ProgressBar> bar = make_progress_bar(plan_.shows_progress(), console);
        ResultCollection results(/*training=*/false);
        EvalResult out;
        out.stage = stage;
        Profiler profiler = make_profiler(plan_);
        profiler.start_stage(stage,
                             stage_profile_path(plan_.root_dir, "trace", stage, plan_.topology.global_rank, ".json"));
        const EvalCounts counts =
            EvaluationLoop(strategy(), *precision_, plan_.root_device(), bar.get(), &hooks, &profiler)
                .run(module, loaders, batches, test ? EvalStage::kTest : EvalStage::kValidation, results);
        finish_stage_profile(profiler, strategy(), console, plan_.root_dir);
        out.batches = counts.batches;
        out.examples = counts.examples;
        out.metrics = results.epoch_metrics(MetricTarget::kCallback);
        // Kept for a later stage's callbacks, as fit's values are; evaluate() logs to no logger.
        for (const auto& [name, value] : out.metrics) callback_metrics_[name] = value;
        return out;
      });
    });
  });
}

EvalResult Trainer::validate(LightningModule& module, DataLoader val, const std::string& ckpt_path) {
  std::vector<DataLoader> loaders;
  if (val.defined()) loaders.push_back(std::move(val));
  return evaluate(module, std::move(loaders), ckpt_path, /*test=*/false);
}

EvalResult Trainer::test(LightningModule& module, DataLoader test, const std::string& ckpt_path) {
  std::vector<DataLoader> loaders;
  if (test.defined()) loaders.push_back(std::move(test));
  return evaluate(module, std::move(loaders), ckpt_path, /*test=*/true);
}

std::vector<torch::Tensor> Trainer::predict(LightningModule& module, DataLoader data, const std::string& ckpt_path) {
  return run_stage([&] {
    const internal::ProcessSettingsScope settings(plan_, /*seed=*/false);
    // Under ddp every rank predicts a part and rank 0 gathers them: the group must exist.
    strategy().setup_environment(module);
    StageView view(strategy(), plan_.root_device(), rank_console(), fitted_);
    const RunViewScope viewing(module, &view);
    const std::vector<std::shared_ptr<Callback>> callbacks = with_module_callbacks(options_.callbacks, module);
    StageCallbacks hooks(callbacks, module, fitted_, callback_metrics_, strategy());
    return with_module_stage(module, Stage::kPredict, [&] {
      return hooks.run([&] {
        module.configure_model();
        if (!data.defined()) data = module.predict_dataloader();
        VOLT_CHECK(data.defined(),
                   "predict() has no data: predict_dataloader() returned none and none was passed. HINT: override "
                   "predict_dataloader() or pass a volt::DataLoader.");
        load_weights(module, ckpt_path);
        precision_->convert_module(module);
        place_module(module, plan_.root_device());
        configure_loader(data, /*evaluation=*/true, /*contiguous=*/true);
        data.set_epoch(0);
        const std::optional<int64_t> batches =
            batches_to_run(data, plan_.limit_predict_batches, "limit_predict_batches");
        // Unsharded loaders (use_distributed_sampler=false) give every rank everything already.
        const bool gather = plan_.use_distributed_sampler && plan_.topology.world_size > 1;
        Profiler profiler = make_profiler(plan_);
        profiler.start_stage(
            "predict", stage_profile_path(plan_.root_dir, "trace", "predict", plan_.topology.global_rank, ".json"));
        std::vector<torch::Tensor> outputs =
            PredictionLoop(strategy(), *precision_, plan_.root_device(), &hooks, &profiler)
                .run(module, data, batches, gather);
        finish_stage_profile(profiler, strategy(), *rank_console(), plan_.root_dir);
        return outputs;
      });
    });
  });
}

}  // namespace volt
