#include "volt/trainer/trainer.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "volt/callbacks/callback.h"
#include "volt/callbacks/model_checkpoint.h"
#include "volt/checkpoint/checkpoint_io.h"
#include "volt/core/error.h"
#include "volt/distributed/subprocess_launcher.h"
#include "volt/loggers/csv_logger.h"
#include "volt/loggers/hparams_yaml.h"
#include "volt/loggers/tensorboard_logger.h"
#include "volt/module/result_collection.h"
#include "volt/optim/lr_scheduler.h"
#include "volt/precision/precision_plugin.h"
#include "volt/progress/model_summary.h"
#include "volt/progress/progress_bar.h"
#include "volt/strategies/ddp2_strategy.h"
#include "volt/strategies/ddp_strategy.h"
#include "volt/strategies/dp_strategy.h"
#include "volt/trainer/checkpoint_state.h"
#include "volt/trainer/hpc_checkpoints.h"
#include "volt/trainer/process_setup.h"

namespace volt {

namespace {

namespace fs = std::filesystem;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

bool stdout_is_tty() { return isatty(fileno(stdout)) != 0; }

/// Moves a batch to the module's device (Lightning's batch_to_device) and casts floating inputs and
/// targets to the module's dtype (the -true precisions; others keep them).
Batch prepare_batch(Batch batch, c10::Device device, const PrecisionPlugin& precision) {
  if (batch.data.defined()) batch.data = precision.convert_input(batch.data.to(device));
  if (batch.target.defined()) batch.target = precision.convert_input(batch.target.to(device));
  return batch;
}

/// Puts the module on the run's device (a no-op on the CPU, where modules are built).
void place_module(LightningModule& module, c10::Device device) {
  if (!device.is_cpu()) module.to(device);
}

std::string optimizer_kind(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return "Adam";
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return "AdamW";
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return "SGD";
  if (dynamic_cast<const torch::optim::RMSprop*>(&optimizer)) return "RMSprop";
  if (dynamic_cast<const torch::optim::Adagrad*>(&optimizer)) return "Adagrad";
  return "Optimizer";
}

std::vector<torch::Tensor> optimized_parameters(const OptimizerConfig& optimization) {
  std::vector<torch::Tensor> params;
  for (const auto& optimizer : optimization.optimizers)
    for (const auto& group : optimizer->param_groups())
      for (const auto& p : group.params()) params.push_back(p);
  return params;
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

/// Lightning's ordering: checkpointing callbacks run last, after e.g. EarlyStopping decided.
std::vector<std::shared_ptr<Callback>> ordered_callbacks(std::vector<std::shared_ptr<Callback>> callbacks) {
  std::stable_partition(callbacks.begin(), callbacks.end(), [](const std::shared_ptr<Callback>& c) {
    return dynamic_cast<ModelCheckpoint*>(c.get()) == nullptr;
  });
  return callbacks;
}

ModelCheckpoint* first_model_checkpoint(const std::vector<std::shared_ptr<Callback>>& callbacks) {
  for (const auto& c : callbacks)
    if (auto* checkpoint = dynamic_cast<ModelCheckpoint*>(c.get())) return checkpoint;
  return nullptr;
}

/// The newest *.ckpt file under `dir` (recursively), or "".
std::string newest_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "";
  std::string best;
  fs::file_time_type best_time;
  for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    if (!it->is_regular_file(ec) || it->path().extension() != ".ckpt") continue;
    const auto time = it->last_write_time(ec);
    if (best.empty() || time > best_time) {
      best = it->path().string();
      best_time = time;
    }
  }
  return best;
}

/// Runs an evaluation stage (validation, sanity check or test) over `batches` batches.
struct EvalLoop {
  LightningModule& module;
  const DataLoader& loader;
  c10::Device device;
  const PrecisionPlugin& precision;
  ProgressBar* bar;
  Strategy& strategy;

  int64_t run(int64_t batches, bool test, ResultCollection& results, const std::string& stage) const {
    const bool was_training = module.is_training();
    module.eval();
    torch::NoGradGuard no_grad;
    module.set_metric_sink(&results);
    if (test)
      module.on_test_epoch_start();
    else
      module.on_validation_epoch_start();
    if (bar) bar->start(stage, 0, batches);
    int64_t examples = 0;
    for (int64_t i = 0; i < batches; ++i) {
      const Batch batch = prepare_batch(loader.batch(i), device, precision);
      // Evaluation loaders are not padded: every example counts once in the epoch means.
      const int64_t size = batch.data.defined() ? batch.data.size(0) : 1;
      results.set_batch_size(size);
      examples += size;
      const AutocastGuard autocast = precision.forward_context();
      if (test)
        module.test_step(batch, i);
      else
        module.validation_step(batch, i);
      if (bar) bar->update(i + 1, {});
    }
    if (test)
      module.on_test_epoch_end();
    else
      module.on_validation_epoch_end();
    // One collective for all sync_dist values: exact means over every process's real examples.
    results.sync_epoch([this](torch::Tensor& t, Reduce op) { strategy.reduce(t, op); });
    if (bar) bar->finish(results.epoch_metrics(MetricTarget::kProgBar));
    module.set_metric_sink(nullptr);
    module.train(was_training);
    return examples;
  }
};

/// Why a run stops, ordered so that the ranks' maximum is what every rank does: a requeue
/// outranks a SIGTERM (both save an HPC checkpoint; the requeue also restarts the job), which
/// outranks Ctrl-C, which outranks a callback's normal stop.
enum StopCode : int { kNoStop = 0, kCallbackStop = 1, kInterruptStop = 2, kTerminateStop = 3, kRequeueStop = 4 };

}  // namespace

// ---------------------------------------------------------------------------------------------
// FitRun: the state of one Trainer::fit call.
// ---------------------------------------------------------------------------------------------
class Trainer::FitRun : public CallbackServices {
 public:
  FitRun(Trainer& trainer, LightningModule& module, DataLoader train, DataLoader val)
      : trainer_(trainer),
        plan_(trainer.plan_),
        strategy_(*trainer.strategy_),
        module_(module),
        train_(std::move(train)),
        val_(std::move(val)),
        train_results_(/*training=*/true, [this](double value, Reduce op) { return strategy_.reduce(value, op); }),
        val_results_(/*training=*/false) {}

  FitResult run(const std::string& ckpt_path);

  void save_checkpoint(const std::string& path) override {
    // Rank 0 writes; the others do not wait here (their callbacks need not agree on every save),
    // so readers synchronize instead: fit ends with a barrier before any rank reads a file.
    if (strategy_.is_global_zero()) trainer_.checkpoint_io_->save(make_checkpoint(parts_, progress_), path);
    last_saved_ = path;
  }
  void remove_checkpoint(const std::string& path) override {
    if (strategy_.is_global_zero() && trainer_.checkpoint_io_->exists(path)) trainer_.checkpoint_io_->remove(path);
  }
  void log_metrics(const std::map<std::string, double>& metrics) override {
    if (metrics.empty()) return;
    auto with_epoch = metrics;
    with_epoch["epoch"] = static_cast<double>(progress_.epoch);
    for (const auto& logger : loggers_) logger->log_metrics(with_epoch, progress_.global_step);
  }

 private:
  void setup_loggers();
  void setup_callbacks();
  void print_summary();
  void sanity_check();
  void train_epoch();
  bool validation_due_in_epoch() const;
  void run_validation(int64_t batches);
  void validate_mid_epoch();
  void optimizer_step();
  void step_schedulers(Interval interval);
  void finish_epoch();
  void name_learning_rates();
  CallbackContext context(bool sanity = false) const;
  template <typename Hook>
  void dispatch(Hook hook, bool sanity = false);
  void request_stop(StopReason reason, std::string message);
  void interrupt(StopCode code, std::string message);
  void poll_signals();
  void agree_on_stop();
  std::optional<std::pair<std::string, c10::IValue>> newest_valid_hpc_checkpoint() const;
  std::string save_hpc_checkpoint();
  void requeue(FitResult& result);

  Trainer& trainer_;
  const RunPlan& plan_;
  Strategy& strategy_;
  LightningModule& module_;
  DataLoader train_;
  DataLoader val_;
  OptimizerConfig optimization_;
  std::vector<torch::Tensor> clipped_params_;
  TrainingParts parts_;
  std::vector<std::shared_ptr<Logger>> loggers_;
  std::unique_ptr<ProgressBar> bar_;       // training epochs
  std::unique_ptr<ProgressBar> eval_bar_;  // sanity check and validation
  ResultCollection train_results_;
  ResultCollection val_results_;
  FitProgress progress_;
  int64_t num_train_batches_ = 0;
  int64_t num_val_batches_ = 0;
  int64_t val_interval_ = 0;  // validate after every this many batches of an epoch
  bool stop_ = false;
  StopCode stop_code_ = kNoStop;  // what stop_ means, for agree_on_stop
  StopReason stop_reason_ = StopReason::kMaxEpochs;
  std::string stop_message_;
  std::string last_saved_;
  std::chrono::steady_clock::time_point last_bar_update_{};
  std::map<std::string, double> bar_metrics_;  // epoch values kept on the bar
  struct LearningRateName {
    std::string name;
    size_t optimizer;
    size_t group;
  };
  std::vector<LearningRateName> lr_names_;  // LearningRateMonitor's names, fixed per run
  bool validation_ran_at_end_ = false;
};

void Trainer::FitRun::name_learning_rates() {
  // Names are fixed for the run; only the values change, so the per-batch context copies them.
  lr_names_.clear();
  std::map<std::string, int> seen;
  for (size_t i = 0; i < optimization_.optimizers.size(); ++i) {
    const auto& optimizer = *optimization_.optimizers[i];
    std::string name = "lr-" + optimizer_kind(optimizer);
    for (const auto& config : optimization_.schedulers)
      if (!config.name.empty() && optimization_.optimizers.size() == 1) name = config.name;
    if (seen[name]++ > 0) name += "-" + std::to_string(seen[name] - 1);
    const size_t groups = optimizer.param_groups().size();
    for (size_t g = 0; g < groups; ++g) {
      lr_names_.push_back({groups == 1 ? name : name + "/pg" + std::to_string(g + 1), i, g});
    }
  }
}

CallbackContext Trainer::FitRun::context(bool sanity) const {
  CallbackContext c;
  c.epoch = progress_.epoch;
  c.global_step = progress_.global_step;
  c.sanity_checking = sanity;
  c.metrics = &trainer_.callback_metrics_;
  c.learning_rates.reserve(lr_names_.size());
  for (const auto& lr : lr_names_) {
    c.learning_rates.push_back(
        {lr.name, optimization_.optimizers[lr.optimizer]->param_groups()[lr.group].options().get_lr()});
  }
  return c;
}

template <typename Hook>
void Trainer::FitRun::dispatch(Hook hook, bool sanity) {
  if (trainer_.callbacks_.empty()) return;
  const CallbackContext c = context(sanity);
  for (const auto& callback : trainer_.callbacks_) {
    const Decision decision = hook(*callback, c);
    if (decision.stop) request_stop(StopReason::kCallback, decision.reason);
  }
}

void Trainer::FitRun::request_stop(StopReason reason, std::string message) {
  // min_epochs wins over callbacks, as in Lightning; limits and signals always stop.
  if (reason == StopReason::kCallback && progress_.epoch + 1 < plan_.min_epochs) return;
  if (stop_) return;
  stop_ = true;
  stop_code_ = kCallbackStop;
  stop_reason_ = reason;
  stop_message_ = std::move(message);
}

void Trainer::FitRun::interrupt(StopCode code, std::string message) {
  // An interruption replaces a weaker stop decided earlier in the same step.
  if (stop_ && stop_code_ >= code) return;
  stop_ = true;
  stop_code_ = code;
  stop_reason_ = code == kRequeueStop ? StopReason::kRequeued : StopReason::kInterrupted;
  stop_message_ = std::move(message);
}

void Trainer::FitRun::poll_signals() {
  if (plan_.requeue.enabled && internal::RequeueSignalGuard::received()) {
    interrupt(kRequeueStop, fmt::format("received {}, SLURM's requeue signal", signal_name(plan_.requeue.signal)));
  }
  if (const int signal = internal::StopSignalGuard::received()) {
    interrupt(signal == SIGTERM ? kTerminateStop : kInterruptStop, fmt::format("received signal {}", signal));
  }
}

void Trainer::FitRun::agree_on_stop() {
  // Every rank must leave the loop at the same step and take the same path out of it, or the
  // others block in the next collective: a stop anywhere (a signal, a callback deciding on
  // unsynchronized metrics) is a stop everywhere, and the strongest reason wins (StopCode). A
  // signal that reached only some ranks thus still saves one HPC checkpoint at one step for all.
  // One tiny all-reduce per step under ddp; none on one process.
  if (plan_.topology.world_size == 1) return;
  const StopCode mine = stop_ ? stop_code_ : kNoStop;
  const auto agreed =
      static_cast<StopCode>(static_cast<int>(strategy_.reduce(static_cast<double>(mine), Reduce::kMax)));
  if (agreed == mine) return;
  switch (agreed) {
    case kRequeueStop:
      interrupt(agreed, "another process received SLURM's requeue signal");
      break;
    case kTerminateStop:
      interrupt(agreed, "another process received SIGTERM");
      break;
    case kInterruptStop:
      interrupt(agreed, "another process was interrupted");
      break;
    default:
      request_stop(StopReason::kCallback, "a callback on another process stopped training");
      break;
  }
}

std::optional<std::pair<std::string, c10::IValue>> Trainer::FitRun::newest_valid_hpc_checkpoint() const {
  // A job killed while saving leaves at worst a temporary file (saves are atomic), but a file
  // can still be cut short by a full disk or a copy: fall back to the previous one.
  for (const std::string& path : list_hpc_checkpoints(plan_.hpc_checkpoint_dir)) {
    try {
      return std::make_pair(path, trainer_.checkpoint_io_->load(path));
    } catch (const std::exception& e) {
      std::cerr << "warning: HPC checkpoint " << path << " is unreadable; trying the previous one. (" << e.what()
                << ")\n";
    }
  }
  return std::nullopt;
}

std::string Trainer::FitRun::save_hpc_checkpoint() {
  std::string path;
  if (strategy_.is_global_zero()) {
    std::filesystem::create_directories(plan_.hpc_checkpoint_dir);
    path = next_hpc_checkpoint_path(plan_.hpc_checkpoint_dir);
    trainer_.checkpoint_io_->save(make_checkpoint(parts_, progress_), path);
    // Pruned only after the new file is complete: a kill in between leaves one more, never none.
    for (const std::string& old : hpc_checkpoints_to_prune(plan_.hpc_checkpoint_dir, plan_.hpc_checkpoints_to_keep)) {
      trainer_.checkpoint_io_->remove(old);
    }
  }
  // Also a barrier: no rank goes on (and exits) before the file is complete.
  return strategy_.broadcast_string(path);
}

void Trainer::FitRun::requeue(FitResult& result) {
  // Every rank has returned from its last collective; the requeue ends this run at once
  // (SIGTERM now, SIGKILL after KillWait), so it is the very last thing rank 0 does.
  if (!strategy_.is_global_zero()) return;
  const RequeueOutcome outcome = requeue_slurm_job(plan_.requeue.job_id);
  if (outcome.ok) {
    std::cout << "Requeued SLURM job " << plan_.requeue.job_id << " (" << outcome.command << "); it resumes from "
              << result.hpc_checkpoint_path << "\n"
              << std::flush;
    return;
  }
  std::cerr << "error: `" << outcome.command << "` failed: " << outcome.output << "\nThe HPC checkpoint "
            << result.hpc_checkpoint_path
            << " is saved; resubmit the job to resume from it. HINT: allow requeueing (#SBATCH --requeue), or set "
               "auto_requeue=false to stop on the signal without requeueing.\n";
  result.reason = StopReason::kInterrupted;
  result.message = "requeue failed: " + outcome.output;
}

void Trainer::FitRun::setup_loggers() {
  if (!plan_.is_global_zero()) return;
  loggers_ = trainer_.options_.loggers;
  if (loggers_.empty() && plan_.use_default_logger) {
    // Lightning's defaults: TensorBoard event files, and the CSV that `volt plot` reads, in one
    // version folder (resolved once, so both get the same one).
    LoggerOptions options;
    options.save_dir = plan_.root_dir;
    if (!plan_.requeue.job_id.empty()) {
      // A SLURM batch job logs under its job id, so a requeued run continues the same folder.
      options.version = plan_.requeue.job_id;
      options.append = true;
    } else {
      options.version = resolve_version(options);
    }
    loggers_.push_back(std::make_shared<TensorBoardLogger>(options));
    loggers_.push_back(std::make_shared<CSVLogger>(options));
  }
  for (const auto& logger : loggers_) logger->log_hyperparams(module_.hparams());
}

void Trainer::FitRun::setup_callbacks() {
  auto& callbacks = trainer_.callbacks_;
  callbacks = trainer_.options_.callbacks;
  if (plan_.enable_checkpointing && first_model_checkpoint(callbacks) == nullptr) {
    callbacks.push_back(std::make_shared<ModelCheckpoint>());
  }
  if (!plan_.enable_checkpointing) {
    callbacks.erase(std::remove_if(callbacks.begin(), callbacks.end(),
                                   [](const auto& c) { return dynamic_cast<ModelCheckpoint*>(c.get()) != nullptr; }),
                    callbacks.end());
  }
  callbacks = ordered_callbacks(callbacks);
  FitInfo info;
  info.root_dir = plan_.root_dir;
  info.log_dir = strategy_.broadcast_string(loggers_.empty() ? "" : loggers_.front()->log_dir());
  info.has_validation = num_val_batches_ > 0;
  info.is_global_zero = plan_.is_global_zero();
  for (const auto& callback : callbacks) callback->setup(info);
  // LightningCLI's SaveConfigCallback: the resolved configuration beside the logs, so a run's
  // folder records how it was started.
  if (!trainer_.options_.config.is_null() && info.is_global_zero && !info.log_dir.empty()) {
    fs::create_directories(info.log_dir);
    save_hparams_to_yaml((fs::path(info.log_dir) / kConfigFileName).string(), trainer_.options_.config);
  }
}

void Trainer::FitRun::print_summary() {
  if (!plan_.enable_model_summary || !plan_.is_global_zero()) return;
  std::cout << summarize(module_).to_string() << "\n" << std::flush;
}

void Trainer::FitRun::sanity_check() {
  const int64_t n =
      plan_.num_sanity_val_steps == -1 ? num_val_batches_ : std::min(plan_.num_sanity_val_steps, num_val_batches_);
  if (n <= 0) return;
  // The sanity check must not change the run: keep the RNG stream as it was.
  auto generator = at::detail::getDefaultCPUGenerator();
  const torch::Tensor rng = generator.get_state();
  ResultCollection throwaway(/*training=*/false);
  val_.set_epoch(0);
  EvalLoop{module_, val_, plan_.root_device(), *trainer_.precision_, eval_bar_.get(), strategy_}.run(
      n, /*test=*/false, throwaway, "Sanity Checking");
  generator.set_state(rng);
}

bool Trainer::FitRun::validation_due_in_epoch() const {
  return num_val_batches_ > 0 && (progress_.epoch + 1) % plan_.check_val_every_n_epoch == 0;
}

void Trainer::FitRun::run_validation(int64_t batches) {
  progress_.validation_pending = false;
  val_results_.reset();
  val_.set_epoch(0);
  EvalLoop{module_, val_, plan_.root_device(), *trainer_.precision_, eval_bar_.get(), strategy_}.run(
      batches, /*test=*/false, val_results_, "Validation");
  for (const auto& [name, value] : val_results_.epoch_metrics(MetricTarget::kCallback))
    trainer_.callback_metrics_[name] = value;
  log_metrics(val_results_.epoch_metrics(MetricTarget::kLogger));
}

void Trainer::FitRun::validate_mid_epoch() {
  run_validation(num_val_batches_);
  module_.set_metric_sink(&train_results_);
  dispatch([this](Callback& c, const CallbackContext& ctx) { return c.on_validation_end(ctx, *this); });
}

void Trainer::FitRun::optimizer_step() {
  const auto clip = [this] {
    if (!plan_.gradient_clip_val) return;
    if (plan_.gradient_clip_algorithm == GradientClipAlgorithm::kNorm) {
      torch::nn::utils::clip_grad_norm_(clipped_params_, *plan_.gradient_clip_val);
    } else {
      torch::nn::utils::clip_grad_value_(clipped_params_, *plan_.gradient_clip_val);
    }
  };
  // The plugin unscales (16-mixed) before `clip` and may skip the step on inf/NaN gradients; the
  // step still counts, as in Lightning, so schedules and checkpoints do not drift.
  trainer_.precision_->optimizer_step(optimization_.optimizers, clip, [this](size_t i) {
    module_.on_before_optimizer_step(*optimization_.optimizers[i], i);
  });
  for (const auto& optimizer : optimization_.optimizers) optimizer->zero_grad();
  ++progress_.global_step;
  step_schedulers(Interval::kStep);
}

void Trainer::FitRun::step_schedulers(Interval interval) {
  const int64_t count = interval == Interval::kStep ? progress_.global_step : progress_.epoch + 1;
  for (const auto& config : optimization_.schedulers) {
    if (config.interval != interval || count % config.frequency != 0) continue;
    std::optional<double> metric;
    if (config.scheduler->needs_metric()) {
      metric = internal::monitored_value(&trainer_.callback_metrics_, config.monitor, config.scheduler->name());
    }
    config.scheduler->step(metric);
  }
}

void Trainer::FitRun::train_epoch() {
  // Reset and install the sink before the hook: Lightning lets on_train_epoch_start log.
  train_results_.reset();
  module_.set_metric_sink(&train_results_);
  module_.on_train_epoch_start();
  train_.set_epoch(progress_.epoch);
  dispatch([this](Callback& c, const CallbackContext& ctx) { return c.on_train_epoch_start(ctx, *this); });
  if (bar_)
    bar_->start(fmt::format("Epoch {}", progress_.epoch), static_cast<int>(progress_.epoch), num_train_batches_);

  const int64_t accumulate = plan_.accumulate_grad_batches;
  bool validated_at_end = false;
  // Resumed from a checkpoint taken at the end of a batch whose validation had not run yet: run
  // it first, as Lightning's restarting epoch loop does.
  if (progress_.validation_pending) {
    if (progress_.batches_done >= num_train_batches_) {
      validated_at_end = true;
    } else {
      validate_mid_epoch();
    }
  }
  while (progress_.batches_done < num_train_batches_ && !stop_) {
    const int64_t i = progress_.batches_done;
    const Batch batch = prepare_batch(train_.batch(i), plan_.root_device(), *trainer_.precision_);
    module_.on_train_batch_start(batch, i);
    train_results_.set_batch_size(batch.data.defined() ? batch.data.size(0) : 1);
    strategy_.before_forward(module_);
    const torch::Tensor loss = [&] {
      const AutocastGuard autocast = trainer_.precision_->forward_context();
      return strategy_.training_step(module_, batch, i);
    }();
    VOLT_CHECK(loss.defined() && loss.numel() == 1 && loss.requires_grad(),
               "{}::training_step must return a scalar loss that requires grad; got {}. HINT: return the loss "
               "computed from the model's outputs, not a detached value or a number.",
               module_.name(),
               loss.defined() ? fmt::format("shape {} requires_grad={}", c10::str(loss.sizes()), loss.requires_grad())
                              : std::string("an undefined tensor"));
    const bool last = i + 1 == num_train_batches_;
    const bool steps = (i + 1) % accumulate == 0 || last;
    // Only the backward pass that precedes an optimizer step communicates (PyTorch's no_sync).
    strategy_.before_backward(loss, steps);
    trainer_.precision_->backward(accumulate == 1 ? loss : loss / static_cast<double>(accumulate));
    if (steps) optimizer_step();
    module_.on_train_batch_end(loss, batch, i);
    ++progress_.batches_done;
    ++progress_.total_batches;
    // Checkpoints taken by the callbacks below precede this batch's validation, if one is due.
    const bool validation_due = validation_due_in_epoch() && (i + 1) % val_interval_ == 0;
    progress_.validation_pending = validation_due;

    for (const auto& [name, value] : train_results_.step_metrics(MetricTarget::kCallback))
      trainer_.callback_metrics_[name] = value;
    if (progress_.total_batches % plan_.log_every_n_steps == 0) {
      log_metrics(train_results_.step_metrics(MetricTarget::kLogger));
    }
    if (bar_ && std::chrono::steady_clock::now() - last_bar_update_ > std::chrono::milliseconds(100)) {
      last_bar_update_ = std::chrono::steady_clock::now();
      auto shown = train_results_.step_metrics(MetricTarget::kProgBar);
      shown.insert(bar_metrics_.begin(), bar_metrics_.end());
      bar_->update(progress_.batches_done, shown);
    }
    dispatch([this](Callback& c, const CallbackContext& ctx) { return c.on_train_batch_end(ctx, *this); });
    if (plan_.max_steps >= 0 && progress_.global_step >= plan_.max_steps) {
      request_stop(StopReason::kMaxSteps, "");
    }
    poll_signals();
    agree_on_stop();
    // Mid-epoch validation (val_check_interval < 1 epoch); the end-of-epoch one is below.
    if (validation_due) {
      if (last || stop_) {
        validated_at_end = true;
      } else {
        validate_mid_epoch();
      }
    }
  }
  module_.set_metric_sink(nullptr);
  const bool interrupted = stop_reason_ == StopReason::kInterrupted || stop_reason_ == StopReason::kRequeued;
  if (progress_.batches_done < num_train_batches_ && interrupted) return;
  if (validated_at_end || (validation_due_in_epoch() && num_train_batches_ == 0)) {
    run_validation(num_val_batches_);
    validation_ran_at_end_ = true;
  }
  finish_epoch();
}

void Trainer::FitRun::finish_epoch() {
  module_.set_metric_sink(&train_results_);
  module_.on_train_epoch_end();
  module_.set_metric_sink(nullptr);
  train_results_.sync_epoch([this](torch::Tensor& t, Reduce op) { strategy_.reduce(t, op); });
  const auto epoch_metrics = train_results_.epoch_metrics(MetricTarget::kCallback);
  for (const auto& [name, value] : epoch_metrics) trainer_.callback_metrics_[name] = value;
  log_metrics(train_results_.epoch_metrics(MetricTarget::kLogger));
  bar_metrics_ = train_results_.epoch_metrics(MetricTarget::kProgBar);
  if (validation_ran_at_end_) {
    const auto val_bar = val_results_.epoch_metrics(MetricTarget::kProgBar);
    bar_metrics_.insert(val_bar.begin(), val_bar.end());
  }
  if (bar_) {
    auto shown = train_results_.step_metrics(MetricTarget::kProgBar);
    shown.insert(bar_metrics_.begin(), bar_metrics_.end());
    bar_->update(progress_.batches_done, shown);
    bar_->finish(shown);
  }
  // An epoch cut short by max_steps or a stop is not complete: a resume continues inside it.
  const bool complete = progress_.batches_done >= num_train_batches_;
  if (complete) step_schedulers(Interval::kEpoch);
  progress_.epoch_done = complete;
  // Callbacks see (and checkpoints record) the epoch with all its end-of-epoch work done, so
  // a resume from one of these checkpoints starts cleanly at the next epoch.
  if (validation_ran_at_end_) {
    dispatch([this](Callback& c, const CallbackContext& ctx) { return c.on_validation_end(ctx, *this); });
  }
  dispatch([this](Callback& c, const CallbackContext& ctx) { return c.on_train_epoch_end(ctx, *this); });
  agree_on_stop();
  validation_ran_at_end_ = false;
  for (const auto& logger : loggers_) logger->save();
}

FitResult Trainer::FitRun::run(const std::string& ckpt_path) {
  const auto start = std::chrono::steady_clock::now();
  internal::configure_process(plan_);
  internal::StopSignalGuard signals;
  strategy_.setup_environment(module_);

  if (!train_.defined()) train_ = module_.train_dataloader();
  VOLT_CHECK(train_.defined(),
             "{} has no training data: train_dataloader() returned none and fit() was given none. HINT: override "
             "train_dataloader() or pass a volt::DataLoader to fit().",
             module_.name());
  if (!val_.defined()) val_ = module_.val_dataloader();
  trainer_.configure_loader(train_);
  num_train_batches_ = plan_.limit_train_batches.resolve(train_.num_batches());
  if (val_.defined()) {
    trainer_.configure_loader(val_, /*evaluation=*/true);
    num_val_batches_ = plan_.limit_val_batches.resolve(val_.num_batches());
  }
  val_interval_ =
      plan_.val_check_interval.is_fraction()
          ? std::max<int64_t>(1, static_cast<int64_t>(num_train_batches_ * plan_.val_check_interval.fraction()))
          : plan_.val_check_interval.count();
  VOLT_CHECK(plan_.val_check_interval.is_fraction() || plan_.val_check_interval.count() <= num_train_batches_ ||
                 num_val_batches_ == 0,
             "val_check_interval={} is larger than the {} training batches of an epoch. HINT: use a value <= {} or "
             "a fraction such as 0.5.",
             plan_.val_check_interval.count(), num_train_batches_, num_train_batches_);

  trainer_.precision_->convert_module(module_);
  // Before configure_optimizers, as in Lightning, so the optimizers hold the device's parameters.
  place_module(module_, plan_.root_device());
  module_.train();
  optimization_ = module_.configure_optimizers();
  validate_optimization(optimization_, module_);
  clipped_params_ = optimized_parameters(optimization_);
  for (const auto& optimizer : optimization_.optimizers) optimizer->zero_grad();
  name_learning_rates();
  strategy_.setup_module(module_);

  setup_loggers();
  setup_callbacks();
  parts_ = TrainingParts{&module_, &optimization_, &trainer_.callbacks_, trainer_.precision_.get()};
  parts_.config = &trainer_.options_.config;
  if (plan_.enable_progress_bar && plan_.is_global_zero()) {
    ProgressBarOptions options;
    options.is_tty = stdout_is_tty();
    bar_ = std::make_unique<ProgressBar>(options, std::cout);
    eval_bar_ = std::make_unique<ProgressBar>(options, std::cout);
  }

  FitResult result;
  bool finished = false;
  // Loggers learn how the run ended even when it throws.
  struct FinalizeGuard {
    std::vector<std::shared_ptr<Logger>>& loggers;
    LightningModule& module;
    bool& finished;
    ~FinalizeGuard() {
      module.set_metric_sink(nullptr);
      if (finished) return;
      for (const auto& logger : loggers) {
        try {
          logger->finalize("failed");
        } catch (...) {
        }
      }
    }
  } guard{loggers_, module_, finished};

  // A job SLURM restarted resumes where it stopped: the newest HPC checkpoint wins over
  // ckpt_path, which the job script passes again on every restart (Lightning's order).
  std::optional<std::pair<std::string, c10::IValue>> hpc;
  if (!plan_.fast_dev_run) hpc = newest_valid_hpc_checkpoint();
  // options.ckpt_path is fit's default only: validate/test/predict never pick it up implicitly.
  const std::string requested = ckpt_path.empty() ? plan_.ckpt_path : ckpt_path;
  const std::string resume_path = hpc ? hpc->first : trainer_.resolve_ckpt_path(requested);
  if (hpc && !requested.empty() && plan_.is_global_zero()) {
    std::cout << "Resuming from HPC checkpoint " << hpc->first << " instead of ckpt_path='" << requested
              << "': the job was stopped by SLURM and restarted.\n";
  }
  if (!resume_path.empty()) {
    progress_ = restore_checkpoint(hpc ? hpc->second : trainer_.checkpoint_io_->load(resume_path), parts_, resume_path);
    if (progress_.epoch_done) {
      ++progress_.epoch;
      progress_.batches_done = 0;
      progress_.epoch_done = false;
    }
    result.resumed_from = resume_path;
    if (plan_.is_global_zero()) std::cout << "Restored training state from " << resume_path << "\n";
  }

  print_summary();
  module_.on_fit_start();
  sanity_check();
  module_.on_train_start();
  while (!stop_) {
    if (plan_.max_epochs >= 0 && progress_.epoch >= plan_.max_epochs) {
      request_stop(StopReason::kMaxEpochs, "");
      break;
    }
    if (plan_.max_steps >= 0 && progress_.global_step >= plan_.max_steps) {
      request_stop(StopReason::kMaxSteps, "");
      break;
    }
    train_epoch();
    if (!progress_.epoch_done) break;  // interrupted or cut short by max_steps inside the epoch
    ++progress_.epoch;
    progress_.batches_done = 0;
    progress_.epoch_done = false;
  }
  // A requeue asked for at the very last step comes too late to matter: the run is complete, and
  // a restarted job would only load the checkpoint to find nothing left to do.
  const bool complete = (plan_.max_epochs >= 0 && progress_.epoch >= plan_.max_epochs) ||
                        (plan_.max_steps >= 0 && progress_.global_step >= plan_.max_steps);
  if (stop_code_ == kRequeueStop && complete) {
    stop_code_ = kCallbackStop;
    stop_reason_ = plan_.max_steps >= 0 && progress_.global_step >= plan_.max_steps ? StopReason::kMaxSteps
                                                                                    : StopReason::kMaxEpochs;
    stop_message_.clear();
  }
  // SLURM is ending this run: save where it stands, at the step every rank stopped at.
  const bool save_hpc =
      stop_code_ == kRequeueStop || (stop_code_ == kTerminateStop && plan_.requeue.checkpoint_on_sigterm);
  if (stop_ && save_hpc) {
    result.hpc_checkpoint_path = save_hpc_checkpoint();
    if (plan_.is_global_zero()) {
      std::cout << "Saved HPC checkpoint " << result.hpc_checkpoint_path << " (" << stop_message_ << ")\n"
                << std::flush;
    }
  }
  module_.on_train_end();
  dispatch([this](Callback& c, const CallbackContext& ctx) {
    c.on_fit_end(ctx, *this);
    return Decision::proceed();
  });
  module_.on_fit_end();
  const std::string status = stop_reason_ == StopReason::kInterrupted ? "interrupted"
                             : stop_reason_ == StopReason::kRequeued  ? "requeued"
                                                                      : "success";
  for (const auto& logger : loggers_) logger->finalize(status);
  finished = true;

  result.reason = stop_reason_;
  result.message = stop_message_;
  result.epochs_completed = progress_.epoch;
  result.global_step = progress_.global_step;
  result.metrics = trainer_.callback_metrics_;
  result.log_dir = loggers_.empty() ? "" : loggers_.front()->log_dir();
  if (const ModelCheckpoint* checkpoint = first_model_checkpoint(trainer_.callbacks_)) {
    result.best_model_path = checkpoint->best_model_path();
    result.best_model_score = checkpoint->best_model_score();
    result.last_model_path = checkpoint->last_model_path();
  }
  if (result.last_model_path.empty()) result.last_model_path = last_saved_;
  // Files are complete before any rank reads one, and every rank names rank 0's files.
  strategy_.barrier();
  result.best_model_path = strategy_.broadcast_string(result.best_model_path);
  result.last_model_path = strategy_.broadcast_string(result.last_model_path);
  trainer_.best_model_path_ = result.best_model_path;
  trainer_.last_model_path_ = result.last_model_path;
  if (result.reason == StopReason::kRequeued) {
    internal::RequeueSignalGuard::clear();
    signals.ignore_sigterm_after();
    requeue(result);
  }
  result.seconds = seconds_since(start);
  return result;
}

// ---------------------------------------------------------------------------------------------
// Trainer
// ---------------------------------------------------------------------------------------------
Trainer::Trainer(TrainerOptions options) : Trainer(std::move(options), Env::from_process(), MachineInfo::current()) {}

Trainer::Trainer(TrainerOptions options, const Env& env, const MachineInfo& machine)
    : options_(std::move(options)),
      plan_(resolve_run_plan(options_, env, machine)),
      checkpoint_io_(std::make_shared<TorchCheckpointIO>()),
      precision_(make_precision_plugin(plan_.precision, device_type(plan_.accelerator))) {
  callbacks_ = options_.callbacks;
  if (plan_.is_global_zero()) {
    for (const auto& note : plan_.notes) std::cout << "Note: " << note << "\n";
  }
  // Now, not in fit: SLURM's signal kills a process that does not catch it, and it may come
  // while the program is still loading its data.
  if (plan_.requeue.enabled) requeue_guard_ = std::make_unique<internal::RequeueSignalGuard>(plan_.requeue.signal);
  // Seed now, as Lightning's seed_everything, so a module built after the Trainer starts from
  // the same weights every run (fit seeds again before training).
  if (plan_.seed) torch::manual_seed(*plan_.seed);
  if (plan_.strategy == StrategyKind::kSingleDevice) {
    strategy_ = std::make_unique<SingleDeviceStrategy>(plan_.topology);
    return;
  }
  DataParallelOptions dp{.replicas = plan_.replicas_per_process, .deterministic = plan_.deterministic};
  // On GPUs each replica has its device (copies of the module); on the CPU they are threads.
  for (int64_t device : plan_.cuda_devices)
    dp.devices.emplace_back(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
  if (plan_.strategy == StrategyKind::kDp) {
    strategy_ = std::make_unique<DpStrategy>(plan_.topology, std::move(dp));
    return;
  }
  // The one impure step of planning: a launcher picks a free rendezvous port for its children.
  if (plan_.topology.main_port == 0) plan_.topology.main_port = find_free_port();
  DdpOptions ddp;
  ddp.process_group.backend = plan_.process_group_backend;
  ddp.process_group.timeout = plan_.process_group_timeout;
  ddp.process_group.join_timeout = plan_.join_timeout;
  ddp.gradient_sync.bucket_cap_mb = plan_.bucket_cap_mb;
  ddp.gradient_sync.find_unused_parameters = plan_.find_unused_parameters;
  ddp.launch_local_processes = plan_.launch_local_processes;
  // The processes this one launches see only the GPUs the plan selected (CUDA_VISIBLE_DEVICES).
  Env child_env = env;
  for (const auto& [name, value] : plan_.child_env) child_env = child_env.with(name, value);
  if (plan_.strategy == StrategyKind::kDdp2) {
    strategy_ = std::make_unique<Ddp2Strategy>(plan_.topology, ddp, std::move(dp), std::move(child_env));
    return;
  }
  strategy_ = std::make_unique<DdpStrategy>(plan_.topology, ddp, std::move(child_env));
}

Trainer::~Trainer() {
  // Unwinding from a failure: on_failure already stopped the other processes, and the error on
  // its way up is the one to print.
  if (std::uncaught_exceptions() > 0) return;
  try {
    if (strategy_) strategy_->teardown();
  } catch (const std::exception& e) {
    // A process this one launched failed after the last collective: the run failed, and the
    // exit code must say so even though nothing is left to throw to.
    std::cerr << "error: " << e.what() << std::endl;
    std::_Exit(1);
  }
}

void Trainer::configure_loader(DataLoader& loader, bool evaluation) const {
  if (plan_.use_distributed_sampler) {
    loader.configure(plan_.topology.world_size, plan_.topology.global_rank, plan_.loader_seed, !evaluation);
  } else {
    loader.configure(1, 0, plan_.loader_seed);
  }
}

void Trainer::set_checkpoint_io(std::shared_ptr<CheckpointIO> io) {
  VOLT_CHECK(io != nullptr, "set_checkpoint_io got a null CheckpointIO.");
  checkpoint_io_ = std::move(io);
}

std::string Trainer::resolve_ckpt_path(const std::string& requested) const {
  const std::string& path = requested;
  if (path.empty()) return "";
  if (path == "best") {
    VOLT_CHECK(!best_model_path_.empty(),
               "ckpt_path=\"best\" but this Trainer has no best checkpoint yet. HINT: call fit() with a "
               "ModelCheckpoint first, or pass the checkpoint's path.");
    return best_model_path_;
  }
  if (path == "last") {
    if (!last_model_path_.empty()) return last_model_path_;
    std::string found;
    if (const ModelCheckpoint* checkpoint = first_model_checkpoint(callbacks_)) {
      const auto& dir = checkpoint->dirpath();
      if (!dir.empty()) found = newest_checkpoint(dir);
    }
    if (found.empty()) found = newest_checkpoint(plan_.root_dir);
    if (found.empty()) {
      std::cerr << "ckpt_path=\"last\": no checkpoint under " << plan_.root_dir << "; starting from scratch.\n";
    }
    return found;
  }
  VOLT_CHECK(checkpoint_io_->exists(path),
             "ckpt_path='{}' does not exist. HINT: pass an existing .ckpt file, \"last\" or \"best\".", path);
  return path;
}

FitResult Trainer::fit(LightningModule& module, DataLoader train, DataLoader val, std::string ckpt_path) {
  try {
    FitRun run(*this, module, std::move(train), std::move(val));
    return run.run(ckpt_path);
  } catch (const std::exception& e) {
    if (plan_.topology.world_size == 1) throw;
    // Name the first failure of the run once, instead of every rank's secondary error.
    throw Error(strategy_->on_failure(e.what()));
  }
}

EvalResult Trainer::evaluate(LightningModule& module, DataLoader loader, const std::string& ckpt_path, bool test) {
  internal::configure_process(plan_);
  strategy_->setup_environment(module);
  const char* stage = test ? "test" : "validate";
  if (!loader.defined()) loader = test ? module.test_dataloader() : module.val_dataloader();
  VOLT_CHECK(loader.defined(),
             "{}() has no data: {}_dataloader() returned none and none was passed. HINT: override {}_dataloader() "
             "or pass a volt::DataLoader.",
             stage, test ? "test" : "val", test ? "test" : "val");
  const std::string path = resolve_ckpt_path(ckpt_path);
  if (!path.empty()) load_module_weights(checkpoint_io_->load(path), module, path);
  precision_->convert_module(module);
  place_module(module, plan_.root_device());
  configure_loader(loader, /*evaluation=*/true);
  loader.set_epoch(0);
  const int64_t batches = (test ? plan_.limit_test_batches : plan_.limit_val_batches).resolve(loader.num_batches());
  std::unique_ptr<ProgressBar> bar;
  if (plan_.enable_progress_bar && plan_.is_global_zero()) {
    ProgressBarOptions options;
    options.is_tty = stdout_is_tty();
    bar = std::make_unique<ProgressBar>(options, std::cout);
  }
  ResultCollection results(/*training=*/false);
  EvalResult out;
  out.stage = stage;
  out.batches = batches;
  out.examples = EvalLoop{module, loader, plan_.root_device(), *precision_, bar.get(), *strategy_}.run(
      batches, test, results, test ? "Testing" : "Validation");
  out.metrics = results.epoch_metrics(MetricTarget::kCallback);
  for (const auto& [name, value] : out.metrics) callback_metrics_[name] = value;
  return out;
}

EvalResult Trainer::validate(LightningModule& module, DataLoader val, const std::string& ckpt_path) {
  return evaluate(module, std::move(val), ckpt_path, /*test=*/false);
}

EvalResult Trainer::test(LightningModule& module, DataLoader test, const std::string& ckpt_path) {
  return evaluate(module, std::move(test), ckpt_path, /*test=*/true);
}

std::vector<torch::Tensor> Trainer::predict(LightningModule& module, DataLoader data, const std::string& ckpt_path) {
  internal::configure_process(plan_);
  if (!data.defined()) data = module.predict_dataloader();
  VOLT_CHECK(data.defined(),
             "predict() has no data: predict_dataloader() returned none and none was passed. HINT: override "
             "predict_dataloader() or pass a volt::DataLoader.");
  const std::string path = resolve_ckpt_path(ckpt_path);
  if (!path.empty()) load_module_weights(checkpoint_io_->load(path), module, path);
  precision_->convert_module(module);
  place_module(module, plan_.root_device());
  configure_loader(data, /*evaluation=*/true);
  data.set_epoch(0);
  const int64_t batches = plan_.limit_predict_batches.resolve(data.num_batches());
  const bool was_training = module.is_training();
  module.eval();
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> outputs;
  outputs.reserve(static_cast<size_t>(batches));
  for (int64_t i = 0; i < batches; ++i) {
    const Batch batch = prepare_batch(data.batch(i), plan_.root_device(), *precision_);
    const AutocastGuard autocast = precision_->forward_context();
    outputs.push_back(module.predict_step(batch, i));
  }
  module.train(was_training);
  return outputs;
}

}  // namespace volt
