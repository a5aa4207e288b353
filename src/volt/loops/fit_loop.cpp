#include "volt/loops/fit_loop.h"

#include <ATen/CPUGeneratorImpl.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "volt/callbacks/model_checkpoint.h"
#include "volt/core/console.h"
#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/loops/evaluation_loop.h"
#include "volt/loops/metric_router.h"
#include "volt/optim/lr_scheduler.h"
#include "volt/optim/optimizer_state.h"
#include "volt/plan/process_setup.h"
#include "volt/plan/run_plan.h"
#include "volt/precision/precision_plugin.h"
#include "volt/profiler/profiler.h"
#include "volt/profiler/straggler.h"
#include "volt/progress/model_summary.h"
#include "volt/progress/progress_bar.h"
#include "volt/strategies/strategy.h"

namespace volt {

namespace {

/// "lr-Adam", or "lr-LBFGS" for torch::optim::LBFGS: Lightning names learning rates after the
/// optimizer's class, without its namespace.
std::string learning_rate_name(const torch::optim::Optimizer& optimizer) {
  const std::string kind = optimizer_kind(optimizer);
  const size_t colon = kind.rfind("::");
  return "lr-" + (colon == std::string::npos ? kind : kind.substr(colon + 2));
}

const ModelCheckpoint* first_model_checkpoint(const std::vector<std::shared_ptr<Callback>>& callbacks) {
  for (const auto& c : callbacks)
    if (const auto* checkpoint = dynamic_cast<const ModelCheckpoint*>(c.get())) return checkpoint;
  return nullptr;
}

/// Where `progress` stands, for messages: "epoch 3 after 12 batches, global step 100", or at an
/// epoch boundary "the end of epoch 2, global step 96".
std::string fit_position(const FitProgress& progress) {
  if (progress.batches_done > 0 || progress.epoch == 0) {
    return fmt::format("epoch {} after {} batch{}, global step {}", progress.epoch, progress.batches_done,
                       progress.batches_done == 1 ? "" : "es", progress.global_step);
  }
  return fmt::format("the end of epoch {}, global step {}", progress.epoch - 1, progress.global_step);
}

// Checks in a row a process must be slow in to be named: one slow window can be a checkpoint
// save or a hiccup of its host.
constexpr int64_t kStragglerPatience = 2;

}  // namespace

FitLoop::FitLoop(FitLoopConfig config, FitLoopParts parts, FitData data)
    : config_(std::move(config)),
      parts_(parts),
      data_(data),
      bar_(make_progress_bar(config_.show_progress, parts.console)),
      eval_bar_(make_progress_bar(config_.show_progress, parts.console)),
      epoch_loop_(config_.epoch, parts.strategy, parts.precision, parts.metrics, data.module, data.train,
                  data.optimization, bar_.get(), parts.profiler),
      val_results_(/*training=*/false),
      checkpoints_(config_.checkpoints, parts.strategy, parts.strategy.state_sharding(), parts.checkpointer,
                   parts.metrics, parts.console,
                   TrainingParts{&data.module, &data.optimization, &parts.callbacks, &parts.precision, parts.config},
                   progress_),
      stop_(config_.min_epochs, config_.min_steps) {
  progress_.train_stream_layout = data.train.stream_layout();
  if (config_.epoch.straggler_every_n_steps) {
    stragglers_ = std::make_unique<StragglerDetector>(config_.straggler_threshold, kStragglerPatience);
  }
  name_learning_rates();
}

FitLoop::~FitLoop() = default;

void FitLoop::name_learning_rates() {
  // Names are fixed for the run; only the values change, so the per-batch context copies them.
  const auto& optimization = data_.optimization;
  std::map<std::string, int> seen;
  for (size_t i = 0; i < optimization.optimizers.size(); ++i) {
    const auto& optimizer = *optimization.optimizers[i];
    std::string name = learning_rate_name(optimizer);
    for (const auto& config : optimization.schedulers)
      if (!config.name.empty() && optimization.optimizers.size() == 1) name = config.name;
    if (seen[name]++ > 0) name += "-" + std::to_string(seen[name] - 1);
    // LearningRateMonitor logs each learning rate when its scheduler changes it.
    std::optional<Interval> interval;
    for (const auto& config : optimization.schedulers) {
      if (&config.scheduler->optimizer() != &optimizer) continue;
      if (!interval || config.interval == Interval::kStep) interval = config.interval;
    }
    const size_t groups = optimizer.param_groups().size();
    for (size_t g = 0; g < groups; ++g) {
      lr_names_.push_back({groups == 1 ? name : name + "/pg" + std::to_string(g + 1), i, g, interval});
    }
  }
}

CallbackContext FitLoop::context(const HookPoint& point) const {
  CallbackContext c;
  c.epoch = progress_.epoch;
  c.global_step = progress_.global_step;
  c.sanity_checking = point.sanity_checking;
  c.module = &data_.module;
  c.optimizers = &data_.optimization.optimizers;
  c.batch = point.batch;
  c.batch_idx = point.batch_idx;
  c.dataloader_idx = point.dataloader_idx;
  c.outputs = point.outputs;
  c.metrics = &parts_.metrics.callback_metrics();
  c.learning_rates.reserve(lr_names_.size());
  for (const auto& lr : lr_names_) {
    c.learning_rates.push_back(
        {lr.name, data_.optimization.optimizers[lr.optimizer]->param_groups()[lr.group].options().get_lr(),
         lr.interval});
  }
  return c;
}

bool rank_zero_decision(Strategy& strategy, bool decision) {
  if (strategy.topology().world_size == 1) return decision;
  const double vote = strategy.is_global_zero() && decision ? 1.0 : 0.0;
  return strategy.collectives().all_reduce(vote, Reduce::kMax) > 0.5;
}

bool FitLoop::broadcast_decision(bool decision) { return rank_zero_decision(parts_.strategy, decision); }

void FitLoop::save_checkpoint(const std::string& path) {
  const Profiler::Scope timed(parts_.profiler, Action::kCheckpointSave);
  checkpoints_.save(path);
}

void FitLoop::save_weights_checkpoint(const std::string& path) {
  const Profiler::Scope timed(parts_.profiler, Action::kCheckpointSave);
  checkpoints_.save_weights(path);
}

void FitLoop::remove_checkpoint(const std::string& path) { checkpoints_.remove(path); }

void FitLoop::prepare_metric_states(bool train_batch_end) {
  checkpoints_.begin_gather_point();
  if (!checkpoints_.needs_gather() || parts_.callbacks.empty()) return;
  if (train_batch_end) {
    // Every process asks the same callbacks about the same step, so all of them agree.
    const CallbackContext c = context(HookPoint{});
    const bool may_save = std::any_of(parts_.callbacks.begin(), parts_.callbacks.end(), [&c](const auto& callback) {
      return callback->saves_checkpoint_at_train_batch_end(c);
    });
    if (!may_save) return;
  }
  checkpoints_.gather();
}

void FitLoop::log_metrics(const std::map<std::string, double>& metrics) {
  parts_.metrics.log(metrics, progress_.epoch, progress_.global_step);
}

void FitLoop::dispatch(const CallbackHook& hook, const HookPoint& point) {
  if (parts_.callbacks.empty()) return;
  const CallbackContext c = context(point);
  for (const auto& callback : parts_.callbacks) {
    const Decision decision = hook(*callback, c, *this);
    if (decision.stop) stop_.propose_callback_stop(progress_.epoch, progress_.global_step, decision.reason);
  }
  checkpoints_.after_dispatch();
  // One process needs no agreement: a callback's stop holds from the next check on, as it
  // always did. Several processes agree at the next step boundary or epoch end.
  if (config_.topology.world_size == 1) stop_.agree(local_collectives());
}

int64_t FitLoop::accumulate_grad_batches(int64_t epoch) const {
  return volt::accumulate_grad_batches(parts_.callbacks, config_.epoch.accumulate_grad_batches, epoch);
}

bool FitLoop::validates_in_epoch(int64_t epoch) const {
  return data_.counts.has_validation && (epoch + 1) % config_.check_val_every_n_epoch == 0;
}

void FitLoop::run_validation() {
  inject_fault(FaultPoint::kValidation);
  const Profiler::Scope timed(parts_.profiler, Action::kValidation);
  progress_.validation_pending = false;
  val_results_.reset();
  for (DataLoader& loader : data_.val) loader.set_epoch(0);
  EvaluationLoop(parts_.strategy, parts_.precision, config_.epoch.device, eval_bar_.get(), this, &parts_.profiler)
      .run(data_.module, data_.val, data_.counts.num_val_batches, EvalStage::kValidation, val_results_);
  parts_.metrics.publish_epoch(val_results_, progress_.epoch, progress_.global_step);
}

void FitLoop::validate_mid_epoch() {
  run_validation();
  prepare_metric_states(/*train_batch_end=*/false);
  dispatch([](Callback& c, const CallbackContext& ctx, CallbackServices& s) { return c.on_validation_end(ctx, s); },
           {});
  // Validation already waited for every process; agreeing here too costs one small collective
  // and makes a decision on validation metrics hold from the next batch on, on every process.
  at_epoch_end();
}

std::map<std::string, double> FitLoop::validate_end_of_epoch() {
  run_validation();
  return val_results_.epoch_metrics(MetricTarget::kProgBar);
}

void FitLoop::poll_signals() {
  if (config_.requeue.enabled && internal::RequeueSignalGuard::received()) {
    stop_.propose_interrupt(StopCode::kRequeue,
                            fmt::format("received {}, SLURM's requeue signal", signal_name(config_.requeue.signal)));
  }
  if (const int signal = internal::StopSignalGuard::received()) {
    stop_.propose_interrupt(signal == SIGTERM ? StopCode::kTerminate : StopCode::kInterrupt,
                            fmt::format("received signal {}", signal));
  }
}

void FitLoop::snapshot_if_due() {
  const SnapshotSchedule& schedule = config_.snapshots;
  if (progress_marker_) progress_marker_->record(progress_.global_step);
  // Once per optimizer step: a boundary inside an accumulation window holds gradients that no
  // checkpoint keeps, and its resume would not be exact.
  const int64_t step = progress_.global_step;
  if (step == snapshot_checked_step_) return;
  snapshot_checked_step_ = step;
  // A sharded snapshot, or a callback's sharded save under async_checkpointing, being written.
  checkpoints_.advance_sharded_write();
  if (!schedule.enabled()) return;
  bool due = schedule.every_n_steps && step % *schedule.every_n_steps == 0;
  if (schedule.every_n_seconds) {
    // The first boundary of the fit sets the first time-due step; each snapshot sets the next.
    if (!time_due_step_) {
      time_due_step_ = agree_time_due_step();
    } else {
      due = due || step >= *time_due_step_;
    }
  }
  // A fit stopping here saves what its stop asks for (an HPC checkpoint, on_train_end's) instead.
  if (!due || stop_.should_stop()) return;
  const Profiler::Scope timed(parts_.profiler, Action::kCheckpointSave);
  checkpoints_.begin_gather_point();
  const bool die_mid_write = config_.fault && config_.fault->at == FaultPoint::kSnapshot &&
                             config_.fault->rank == config_.topology.global_rank && step >= config_.fault->step;
  checkpoints_.save_snapshot(schedule.skip_when_busy, die_mid_write);
  if (schedule.every_n_seconds) time_due_step_ = agree_time_due_step();
}

void FitLoop::remove_interrupted_writes() {
  // Only a run that writes there: the folder (by default, default_root_dir) is no other run's then.
  const bool writes = config_.snapshots.enabled() || config_.requeue.enabled || config_.requeue.checkpoint_on_sigterm;
  if (!writes) return;
  const std::string& dir = config_.checkpoints.hpc_checkpoint_dir;
  const auto [removed, bytes] = volt::remove_interrupted_writes(dir);
  if (removed.empty()) return;
  parts_.console.info(fmt::format("Removed {} temporary file{} ({:.1f} MB) that a write killed half-way left in {}: {}",
                                  removed.size(), removed.size() == 1 ? "" : "s", static_cast<double>(bytes) / 1e6, dir,
                                  join(removed, ", ")));
}

void FitLoop::mark_finished(StopReason reason) {
  // Interrupted or requeued, the run is to go on from its files. A fast_dev_run resumed from none.
  if (reason == StopReason::kInterrupted || reason == StopReason::kRequeued || config_.fast_dev_run) return;
  try {
    mark_run_finished(config_.checkpoints.hpc_checkpoint_dir);
  } catch (const CheckpointError& e) {
    parts_.console.warn(
        fmt::format("{} A new run in this folder would resume from this finished run's files.", e.what()));
  }
}

int64_t FitLoop::agree_time_due_step() {
  // Clocks differ between processes, and a snapshot is collective: rank 0's clock decides, as a
  // step count at its pace since the previous snapshot (or since training started).
  const auto now = std::chrono::steady_clock::now();
  const int64_t step = progress_.global_step;
  double due = 0.0;
  if (config_.topology.is_global_zero()) {
    const double elapsed = std::chrono::duration<double>(now - snapshot_clock_).count();
    const double per_step = elapsed / static_cast<double>(std::max<int64_t>(1, step - snapshot_clock_step_));
    const double steps = std::ceil(*config_.snapshots.every_n_seconds / std::max(per_step, 1e-9));
    due = static_cast<double>(step) + std::max(1.0, steps);
  }
  snapshot_clock_ = now;
  snapshot_clock_step_ = step;
  if (config_.topology.world_size > 1) due = parts_.strategy.collectives().all_reduce(due, Reduce::kMax);
  return static_cast<int64_t>(due);
}

void FitLoop::inject_fault(FaultPoint point) {
  const std::optional<FaultInjection>& fault = config_.fault;
  if (!fault || fault->rank != config_.topology.global_rank) return;
  if (progress_.global_step >= fault->step) fault_armed_ = true;
  if (!fault_armed_ || fault->at != point) return;
  parts_.console.warn(fmt::format("VOLT_INJECT_FAULT: rank {} kills itself at {} of step {}.", fault->rank,
                                  to_string(point), progress_.global_step));
  die_of_injected_fault();
}

SnapshotStats FitLoop::finish_snapshots() {
  // The files are complete from here on; a failure after this resumes from them.
  checkpoints_.complete_sharded_write();
  checkpoints_.release_memory_tier();
  const SnapshotStats stats = checkpoints_.snapshot_stats();
  if (config_.snapshots.enabled() && (stats.saved > 0 || stats.skipped > 0)) {
    const SnapshotSchedule& schedule = config_.snapshots;
    const std::string interval = describe_snapshot_interval(schedule.every_n_steps, schedule.every_n_seconds);
    parts_.console.info(
        fmt::format("Snapshots: {} saved into {} ({}), {} skipped; the steps spent {:.3f} s copying state to host "
                    "memory ({:.1f} ms per snapshot; the first, which allocates the buffers, {:.1f} ms) and {:.3f} s "
                    "waiting for the writer, which wrote for {:.3f} s.",
                    stats.saved, config_.checkpoints.hpc_checkpoint_dir, interval, stats.skipped, stats.copy_seconds,
                    stats.saved > 0 ? 1000.0 * stats.copy_seconds / static_cast<double>(stats.saved) : 0.0,
                    1000.0 * stats.first_copy_seconds, stats.waited_seconds, stats.write_seconds));
  }
  return stats;
}

void FitLoop::at_step_boundary() {
  snapshot_if_due();
  inject_fault(FaultPoint::kStep);
  poll_signals();
  if (config_.topology.world_size == 1) {
    stop_.agree(local_collectives());
    return;
  }
  // Every rank must leave the loop at the same step and take the same path out of it, or the
  // others block in their next collective. The agreement rides along without a wait: started
  // now, read at the next boundary, when a whole step has passed.
  stop_.agree_async(parts_.strategy.collectives());
}

void FitLoop::check_stragglers() {
  if (!stragglers_) return;
  const Topology& topology = config_.topology;
  const RankTiming mine = rank_timing(parts_.profiler.take_window(), topology.global_rank, topology.host);
  // A collective at the same batch on every process; a rank that died or hangs fails it by name.
  std::vector<RankTiming> all;
  for (const std::string& text : parts_.strategy.collectives().all_gather_bytes(encode_rank_timing(mine))) {
    all.push_back(decode_rank_timing(text));
  }
  const std::vector<Straggler> slow = stragglers_->update(all);
  std::vector<std::string> names;
  for (const Straggler& s : slow) names.push_back(fmt::format("rank {} ({})", s.rank, s.phase));
  const std::string note = names.empty() ? "" : "slow: " + join(names, ", ");
  // Named when it starts and while it goes on every tenth check, so a long run's log shows it
  // without a line per check; said again when it ends.
  for (const Straggler& s : slow) {
    if (s.windows == kStragglerPatience || s.windows % 10 == 0) {
      parts_.console.warn(
          fmt::format("Straggler at step {}: {}. The other processes wait for it in every gradient "
                      "all-reduce. HINT: check that host's load, GPU clocks and data storage.",
                      progress_.global_step, describe(s)));
    }
  }
  if (note.empty() && !straggler_note_.empty()) {
    parts_.console.info(fmt::format("No straggler at step {} (was {}).", progress_.global_step, straggler_note_));
  }
  straggler_note_ = note;
  if (bar_) bar_->set_note(note);
}

void FitLoop::at_epoch_end() {
  stop_.agree(config_.topology.world_size == 1 ? local_collectives() : parts_.strategy.collectives());
}

void FitLoop::sanity_check() {
  if (!data_.counts.has_validation) return;
  // Lightning's num_sanity_val_steps counts batches per loader.
  std::vector<std::optional<int64_t>> n = data_.counts.num_val_batches;
  bool any = false;
  for (std::optional<int64_t>& batches : n) {
    if (config_.num_sanity_val_steps != -1) {
      batches = std::min(config_.num_sanity_val_steps, batches.value_or(config_.num_sanity_val_steps));
    }
    any = any || !batches || *batches > 0;
  }
  if (!any) return;
  // The sanity check must not change the run: keep the RNG stream as it was.
  auto generator = at::detail::getDefaultCPUGenerator();
  const torch::Tensor rng = generator.get_state();
  ResultCollection throwaway(/*training=*/false);
  for (DataLoader& loader : data_.val) loader.set_epoch(0);
  dispatch([](Callback& c, const CallbackContext& ctx, CallbackServices& s) { return c.on_sanity_check_start(ctx, s); },
           {.sanity_checking = true});
  EvaluationLoop(parts_.strategy, parts_.precision, config_.epoch.device, eval_bar_.get(), this, &parts_.profiler)
      .run(data_.module, data_.val, n, EvalStage::kSanityCheck, throwaway);
  dispatch([](Callback& c, const CallbackContext& ctx, CallbackServices& s) { return c.on_sanity_check_end(ctx, s); },
           {.sanity_checking = true});
  generator.set_state(rng);
}

void FitLoop::check_stream_layout(const std::string& source) {
  const std::string layout = data_.train.stream_layout();
  const bool inside_epoch = !progress_.epoch_done && progress_.batches_done > 0;
  VOLT_CHECK(!inside_epoch || progress_.train_stream_layout.empty() || progress_.train_stream_layout == layout,
             "{} stopped {} batches into epoch {} of a stream dealt as \"{}\", but this run deals it as \"{}\": the "
             "same position would hold other examples. HINT: resume with the same processes, num_workers and batch "
             "size (and the same shards), or from a checkpoint taken at the end of an epoch.",
             source, progress_.batches_done, progress_.epoch, progress_.train_stream_layout,
             layout.empty() ? "map-style data" : layout);
  progress_.train_stream_layout = layout;
}

void FitLoop::reload_dataloaders_if_due() {
  const int64_t every = config_.reload_dataloaders_every_n_epochs;
  if (every == 0 || !data_.reload) return;
  // The epochs that are multiples of `every`. A resumed run asks once more at its start (its
  // loaders were asked for before the checkpoint was read), showing the hooks the epoch at which
  // an uninterrupted run asked for the loaders it would be using now: so it gets the same ones.
  const bool due = progress_.epoch % every == 0 || !past_first_epoch_;
  past_first_epoch_ = true;
  if (!due || progress_.epoch == loaders_epoch_) return;
  const int64_t epoch = progress_.epoch;
  progress_.epoch = epoch - epoch % every;
  try {
    data_.counts = data_.reload();
  } catch (...) {
    progress_.epoch = epoch;
    throw;
  }
  progress_.epoch = epoch;
  loaders_epoch_ = epoch;
  check_stream_layout(resumed_from_.empty() ? "The run" : resumed_from_);
}

void FitLoop::restore(const LoadedCheckpoint& checkpoint) {
  progress_ = checkpoints_.restore(checkpoint);
  check_stream_layout(checkpoint.path);
  if (progress_.epoch_done) {
    ++progress_.epoch;
    progress_.batches_done = 0;
    progress_.epoch_done = false;
  }
  resumed_from_ = checkpoint.path;
  parts_.console.info(fmt::format("Restored training state from {}: {}", checkpoint.path, fit_position(progress_)));
  // What the failure cost: the step the failed attempt had reached, which its rank 0 recorded.
  if (config_.restart_attempt > 0 && config_.snapshots.enabled()) {
    const std::string marker = progress_marker_path(config_.checkpoints.hpc_checkpoint_dir);
    if (const std::optional<int64_t> reached = read_progress_marker(marker);
        reached && *reached >= progress_.global_step) {
      parts_.console.info(fmt::format("Restart {}: the failed attempt had reached step {}; {} step{} lost.",
                                      config_.restart_attempt, *reached, *reached - progress_.global_step,
                                      *reached - progress_.global_step == 1 ? "" : "s"));
    }
  }
}

FitResult FitLoop::run() {
  const auto start = std::chrono::steady_clock::now();
  LightningModule& module = data_.module;
  FitResult result;
  result.resumed_from = resumed_from_;
  try {
    if (config_.enable_model_summary) {
      parts_.console.info(summarize(module, static_cast<int>(config_.model_summary_max_depth)).to_string());
    }

    dispatch([](Callback& c, const CallbackContext& ctx, CallbackServices& s) { return c.on_fit_start(ctx, s); }, {});
    module.on_fit_start();
    sanity_check();
    snapshot_checked_step_ = progress_.global_step;  // a resumed fit's first step is not due again
    snapshot_clock_ = std::chrono::steady_clock::now();
    snapshot_clock_step_ = progress_.global_step;
    if (config_.topology.is_global_zero()) {
      remove_interrupted_writes();
      if (config_.snapshots.enabled())
        progress_marker_.emplace(progress_marker_path(config_.checkpoints.hpc_checkpoint_dir));
    }
    dispatch([](Callback& c, const CallbackContext& ctx, CallbackServices& s) { return c.on_train_start(ctx, s); }, {});
    module.on_train_start();
    while (!stop_.should_stop()) {
      if (config_.max_epochs >= 0 && progress_.epoch >= config_.max_epochs) {
        stop_.stop_at_limit(StopReason::kMaxEpochs);
        break;
      }
      if (config_.epoch.max_steps >= 0 && progress_.global_step >= config_.epoch.max_steps) {
        stop_.stop_at_limit(StopReason::kMaxSteps);
        break;
      }
      reload_dataloaders_if_due();
      epoch_loop_.run(progress_, stop_, *this, data_.counts.num_train_batches, data_.counts.val_interval);
      if (!progress_.epoch_done) break;  // interrupted or cut short by max_steps inside the epoch
      ++progress_.epoch;
      progress_.batches_done = 0;
      progress_.epoch_done = false;
    }
    // Settle a stop proposed during the last step (and the reduction still in flight) the same
    // way on every process before deciding what to save.
    at_epoch_end();
    result.snapshots = finish_snapshots();
    // A requeue asked for at the very last step comes too late to matter: the run is complete,
    // and a restarted job would only load the checkpoint to find nothing left to do.
    const bool steps_done = config_.epoch.max_steps >= 0 && progress_.global_step >= config_.epoch.max_steps;
    const bool epochs_done = config_.max_epochs >= 0 && progress_.epoch >= config_.max_epochs;
    if (stop_.code() == StopCode::kRequeue && (steps_done || epochs_done)) {
      stop_.finish_at(steps_done ? StopReason::kMaxSteps : StopReason::kMaxEpochs);
    }
    // SLURM is ending this run: save where it stands, at the step every rank stopped at.
    const bool save_hpc = stop_.code() == StopCode::kRequeue ||
                          (stop_.code() == StopCode::kTerminate && config_.requeue.checkpoint_on_sigterm);
    if (save_hpc) {
      const Profiler::Scope timed(parts_.profiler, Action::kCheckpointSave);
      result.hpc_checkpoint_path = checkpoints_.save_hpc();
      parts_.console.info(fmt::format("Saved HPC checkpoint {} ({})", result.hpc_checkpoint_path, stop_.message()));
    }
    // A Timer saves its checkpoint here, and ModelCheckpoint(save_last) its last.ckpt when the fit
    // stopped after its last save: through the same save path as every other checkpoint.
    prepare_metric_states(/*train_batch_end=*/false);
    checkpoints_.begin_train_end();
    dispatch([](Callback& c, const CallbackContext& ctx, CallbackServices& s) { return c.on_train_end(ctx, s); }, {});
    // Said after the dispatch, which committed sharded saves, and once the writes in the background
    // are done: a resume from these files starts here.
    checkpoints_.complete_sharded_write();
    checkpoints_.wait_for_writes();
    for (const std::string& path : checkpoints_.end_train_end())
      parts_.console.info(fmt::format("Saved {} at {}", path, fit_position(progress_)));
    module.on_train_end();
    dispatch(
        [](Callback& c, const CallbackContext& ctx, CallbackServices& s) {
          c.on_fit_end(ctx, s);
          return Decision::proceed();
        },
        {});
    module.on_fit_end();
    const std::string status = stop_.reason() == StopReason::kInterrupted ? "interrupted"
                               : stop_.reason() == StopReason::kRequeued  ? "requeued"
                                                                          : "success";
    parts_.metrics.finalize(status);
  } catch (const std::exception& error) {
    internal::notify_exception(parts_.callbacks, context({}), error, *this);
    // Loggers learn how the run ended even when it throws.
    parts_.metrics.finalize_failed();
    throw;
  } catch (...) {
    parts_.metrics.finalize_failed();
    throw;
  }

  result.reason = stop_.reason();
  result.message = stop_.message();
  result.epochs_completed = progress_.epoch;
  result.global_step = progress_.global_step;
  result.metrics = parts_.metrics.callback_metrics();
  result.log_dir = parts_.metrics.log_dir();
  if (const ModelCheckpoint* checkpoint = first_model_checkpoint(parts_.callbacks)) {
    result.best_model_path = checkpoint->best_model_path();
    result.best_model_score = checkpoint->best_model_score();
    result.last_model_path = checkpoint->last_model_path();
  }
  if (result.last_model_path.empty()) result.last_model_path = checkpoints_.last_saved();
  // Files are complete before any rank reads one, and every rank names rank 0's files.
  Collectives& collectives = parts_.strategy.collectives();
  collectives.barrier();
  if (config_.topology.is_global_zero()) mark_finished(result.reason);
  result.best_model_path = collectives.broadcast_string(result.best_model_path);
  result.last_model_path = collectives.broadcast_string(result.last_model_path);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace volt
