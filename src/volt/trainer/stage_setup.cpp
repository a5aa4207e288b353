#include "volt/trainer/stage_setup.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "volt/callbacks/model_checkpoint.h"
#include "volt/callbacks/timer.h"
#include "volt/checkpoint/weight_source.h"
#include "volt/core/console.h"
#include "volt/core/error.h"
#include "volt/data/data_module.h"
#include "volt/loggers/csv_logger.h"
#include "volt/loggers/hparams_yaml.h"
#include "volt/loggers/mlflow_logger.h"
#include "volt/loggers/tensorboard_logger.h"
#include "volt/loops/fit_loop.h"
#include "volt/nn/sync_batch_norm.h"
#include "volt/optim/lr_scheduler.h"
#include "volt/plan/process_setup.h"
#include "volt/precision/grad_scaler.h"
#include "volt/precision/precision_plugin.h"
#include "volt/strategies/fsdp_unit.h"
#include "volt/strategies/state_sharding.h"
#include "volt/strategies/strategy.h"

namespace volt::internal {
namespace {

namespace fs = std::filesystem;

void validate_optimization(const OptimizerConfig& optimization, const LightningModule& module) {
  VOLT_CHECK(!optimization.optimizers.empty(),
             "{}::configure_optimizers returned no optimizer. HINT: return e.g. "
             "std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-3)).",
             module.name());
  for (const auto& optimizer : optimization.optimizers)
    VOLT_CHECK(optimizer != nullptr,
               "{}::configure_optimizers returned a null optimizer. HINT: create each optimizer it returns, e.g. with "
               "std::make_shared.",
               module.name());
  for (const auto& config : optimization.schedulers) {
    VOLT_CHECK(config.scheduler != nullptr,
               "{}::configure_optimizers returned a null scheduler. HINT: create each SchedulerConfig::scheduler, e.g. "
               "with std::make_shared<StepLR>(...), or leave the config out.",
               module.name());
    VOLT_CHECK(config.frequency >= 1,
               "scheduler frequency={} must be >= 1. HINT: SchedulerConfig::frequency is how many intervals pass "
               "between steps of the scheduler; the default is 1.",
               config.frequency);
    VOLT_CHECK(!config.scheduler->needs_metric() || !config.monitor.empty(),
               "{} needs a metric, but its SchedulerConfig has no monitor. HINT: set "
               "SchedulerConfig::monitor to a logged metric such as \"val/loss\".",
               config.scheduler->name());
  }
}

}  // namespace

std::optional<int64_t> batches_to_run(const DataLoader& loader, const BatchLimit& limit, const char* what) {
  if (loader.streaming()) return limit.resolve_unknown(what);
  return limit.resolve(loader.num_batches());
}

void configure_loader(DataLoader& loader, const RunPlan& plan, bool evaluation, bool contiguous) {
  if (plan.use_distributed_sampler) {
    loader.configure(plan.topology.world_size, plan.topology.global_rank, plan.loader_seed, !evaluation, contiguous);
  } else {
    loader.configure(1, 0, plan.loader_seed);
  }
}

FitLoaderCounts count_fit_batches(const RunPlan& plan, Console& console, const LightningModule& module,
                                  DataLoader& train, std::vector<DataLoader>& val) {
  VOLT_CHECK(train.defined(),
             "{} has no training data: train_dataloader() returned none and fit() was given none. HINT: override "
             "train_dataloader() or pass a volt::DataLoader to fit().",
             module.name());
  FitLoaderCounts counts;
  if (plan.overfit_batches) {
    // Lightning's overfit_batches: the same batches every epoch, in both loops.
    const auto unshuffle = [&console](DataLoader& loader, const char* stage) {
      if (!loader.defined() || !loader.options().shuffle) return;
      console.warn(fmt::format(
          "You requested to overfit but enabled {0} dataloader shuffling. We are turning off the {0} dataloader "
          "shuffling for you.",
          stage));
      loader.set_shuffle(false);
    };
    unshuffle(train, "train");
    for (DataLoader& loader : val) unshuffle(loader, "val");
  }
  configure_loader(train, plan, /*evaluation=*/false);
  counts.num_train_batches = batches_to_run(train, plan.limit_train_batches, "limit_train_batches");
  for (DataLoader& loader : val) {
    VOLT_CHECK(loader.defined(),
               "{}::val_dataloaders() returned an undefined loader among {}. HINT: return only "
               "loaders that have data.",
               module.name(), val.size());
    configure_loader(loader, plan, /*evaluation=*/true);
    counts.num_val_batches.push_back(batches_to_run(loader, plan.limit_val_batches, "limit_val_batches"));
    counts.has_validation =
        counts.has_validation || !counts.num_val_batches.back() || *counts.num_val_batches.back() > 0;
  }
  const std::optional<int64_t>& num_train_batches = counts.num_train_batches;
  if (!plan.val_check_interval.is_fraction()) {
    counts.val_interval = plan.val_check_interval.count();
    VOLT_CHECK(!num_train_batches || *counts.val_interval <= *num_train_batches || !counts.has_validation,
               "val_check_interval={} is larger than the {} training batches of an epoch. HINT: use a value <= {} or "
               "a fraction such as 0.5.",
               *counts.val_interval, *num_train_batches, *num_train_batches);
  } else if (num_train_batches) {
    counts.val_interval =
        std::max<int64_t>(1, static_cast<int64_t>(*num_train_batches * plan.val_check_interval.fraction()));
  } else {
    // A stream's epoch has no length to take a fraction of: validation runs at its end.
    plan.val_check_interval.resolve_unknown("val_check_interval");
  }
  return counts;
}

FitLoaders::FitLoaders(LightningModule& module, DataModule* data, DataLoader train, std::vector<DataLoader> val)
    : module_(module),
      data_(data),
      train_from_hook_(!train.defined()),
      val_from_hook_(val.empty()),
      train_(std::move(train)),
      val_(std::move(val)) {
  load_from_hooks();
}

void FitLoaders::reload() { load_from_hooks(); }

void FitLoaders::load_from_hooks() {
  if (train_from_hook_) train_ = data_ ? data_->train_dataloader() : module_.train_dataloader();
  if (val_from_hook_) val_ = data_ ? data_->val_dataloaders() : module_.val_dataloaders();
}

void configure_fit_model(const RunPlan& plan, LightningModule& module) {
  module.configure_model();
  refuse_plain_batchnorm(plan, module);
}

OptimizerConfig prepare_training(const RunPlan& plan, LightningModule& module, PrecisionPlugin& precision,
                                 const std::vector<std::shared_ptr<Callback>>& callbacks, Strategy& strategy,
                                 Console& console) {
  place_module(module, precision, plan.root_device());
  module.train();
  OptimizerConfig optimization = configure_optimization(module, callbacks, strategy);
  warn_if_nothing_to_shard(plan, module, console);
  share_found_inf(precision, strategy);
  return optimization;
}

namespace {

// source.read(...) checked to hold `end - begin` elements.
at::Tensor read_checked(WeightSource& source, const std::string& name, const std::vector<int64_t>& shape, int64_t begin,
                        int64_t end) {
  const at::Tensor values = source.read(name, shape, begin, end);
  VOLT_CHECK(values.defined() && values.numel() == end - begin,
             "initial weights from {}: asked for elements [{}, {}) of '{}' {}, it returned {} values. HINT: "
             "WeightSource::read returns exactly end - begin elements, flat in row-major order.",
             source.describe(), begin, end, name, c10::str(c10::IntArrayRef(shape)),
             values.defined() ? values.numel() : 0);
  return values;
}

}  // namespace

void load_initial_weights(LightningModule& module, StateSharding* sharding, WeightSource& source) {
  ParameterPieces pieces;
  if (sharding != nullptr && sharding->shards_parameters()) pieces = sharding->local_parameter_pieces();
  torch::NoGradGuard no_grad;
  for (auto& item : module.named_parameters()) {
    if (pieces.count(item.key()) > 0) continue;
    torch::Tensor& parameter = item.value();
    const std::vector<int64_t> shape = parameter.sizes().vec();
    parameter.copy_(read_checked(source, item.key(), shape, 0, parameter.numel()).view(parameter.sizes()));
  }
  if (pieces.empty()) return;
  for (auto& [name, piece] : pieces) {
    piece.values = read_checked(source, name, piece.shape, piece.begin, piece.end)
                       .to(piece.values.options())
                       .view(piece.values.sizes());
  }
  sharding->load_parameter_pieces(pieces, source.describe());
}

FitResult run_fit_loop(FitLoop& loop, Strategy& strategy, LightningModule& module, bool detect_anomaly) {
  FitResult result = [&] {
    // Anomaly mode is the process's: on for this fit only (Lightning wraps its fit loop alike).
    const AnomalyModeScope anomaly(detect_anomaly);
    try {
      return loop.run();
    } catch (...) {
      strategy.finish_fit(module, /*completed=*/false);
      throw;
    }
  }();
  strategy.finish_fit(module, /*completed=*/true);
  return result;
}

void place_module(LightningModule& module, PrecisionPlugin& precision, c10::Device device) {
  precision.convert_module(module);
  if (!device.is_cpu()) module.to(device);
}

void refuse_plain_batchnorm(const RunPlan& plan, const LightningModule& module) {
  if (!plan.sync_batchnorm) return;
  const std::vector<std::string> plain = plain_batchnorm_paths(module);
  if (!plain.empty()) throw Error(plain_batchnorm_message(plain));
}

OptimizerConfig configure_optimization(LightningModule& module, const std::vector<std::shared_ptr<Callback>>& callbacks,
                                       Strategy& strategy) {
  for (const auto& callback : callbacks) callback->on_before_configure_optimizers(module);
  OptimizerConfig optimization = module.configure_optimizers();
  validate_optimization(optimization, module);
  for (const auto& optimizer : optimization.optimizers) optimizer->zero_grad();
  strategy.setup_module(module);
  strategy.setup_optimizers(module, optimization.optimizers);
  return optimization;
}

void warn_if_nothing_to_shard(const RunPlan& plan, LightningModule& module, Console& console) {
  if (plan.strategy != StrategyKind::kFsdp || plan.sharding_strategy != ShardingStrategy::kFullShard) return;
  if (!find_fsdp_units(module, plan.fsdp_min_unit_params).empty()) return;
  console.warn(fmt::format(
      "sharding_strategy='full_shard', but {} holds no volt::FsdpUnit{}: every parameter stays whole on every "
      "process, as under shard_grad_op. HINT: wrap the large layers in volt::FsdpUnit (see "
      "docs/strategies.md), or use sharding_strategy='shard_grad_op'.",
      module.name(),
      plan.fsdp_min_unit_params > 0 ? fmt::format(" with >= {} parameter elements", plan.fsdp_min_unit_params)
                                    : std::string()));
}

void share_found_inf(PrecisionPlugin& precision, Strategy& strategy) {
  GradScaler* scaler = precision.scaler();
  if (scaler == nullptr) return;
  // Each fsdp process sees its shard of the gradients: the loss scaler's inf/NaN check must be
  // every process's, or one would skip a step the others take (PyTorch's ShardedGradScaler).
  scaler->set_found_inf_sync(nullptr);
  if (strategy.state_sharding() != nullptr) {
    scaler->set_found_inf_sync(
        [&strategy](torch::Tensor& found) { strategy.collectives().all_reduce(found, Reduce::kMax); });
  }
}

ModelCheckpoint* first_model_checkpoint(const std::vector<std::shared_ptr<Callback>>& callbacks) {
  for (const auto& c : callbacks)
    if (auto* checkpoint = dynamic_cast<ModelCheckpoint*>(c.get())) return checkpoint;
  return nullptr;
}

std::vector<std::shared_ptr<Callback>> fit_callbacks(std::vector<std::shared_ptr<Callback>> callbacks,
                                                     const RunPlan& plan, Console& console) {
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
  if (plan.enable_checkpointing && first_model_checkpoint(callbacks) == nullptr) {
    callbacks.push_back(std::make_shared<ModelCheckpoint>());
  }
  if (!plan.enable_checkpointing) {
    callbacks.erase(std::remove_if(callbacks.begin(), callbacks.end(),
                                   [](const auto& c) { return dynamic_cast<ModelCheckpoint*>(c.get()) != nullptr; }),
                    callbacks.end());
  }
  std::stable_partition(callbacks.begin(), callbacks.end(), [](const std::shared_ptr<Callback>& c) {
    return dynamic_cast<ModelCheckpoint*>(c.get()) == nullptr;
  });
  return callbacks;
}

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

FitInfo fit_info(const RunPlan& plan, std::string log_dir, const FitLoaderCounts& counts,
                 const OptimizerConfig& optimization) {
  FitInfo info;
  info.root_dir = plan.root_dir;
  info.log_dir = std::move(log_dir);
  info.has_validation = counts.has_validation;
  info.is_global_zero = plan.is_global_zero();
  if (plan.max_epochs >= 0) info.max_epochs = plan.max_epochs;
  info.num_lr_schedulers = optimization.schedulers.size();
  info.log_every_n_steps = plan.log_every_n_steps;
  return info;
}

void save_run_config(const nlohmann::json& config, const FitInfo& info,
                     const std::vector<std::shared_ptr<Logger>>& loggers) {
  if (config.is_null() || !info.is_global_zero || info.log_dir.empty()) return;
  fs::create_directories(info.log_dir);
  const std::string config_path = (fs::path(info.log_dir) / kConfigFileName).string();
  save_hparams_to_yaml(config_path, config);
  for (const auto& logger : loggers) logger->after_save_config(config_path);
}

}  // namespace volt::internal
