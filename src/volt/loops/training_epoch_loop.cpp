#include "volt/loops/training_epoch_loop.h"

#include <torch/torch.h>

#include "volt/callbacks/callback.h"
#include "volt/core/error.h"
#include "volt/loops/evaluation_loop.h"
#include "volt/loops/metric_router.h"
#include "volt/loops/step_feed.h"
#include "volt/loops/stop_controller.h"
#include "volt/metrics/metric.h"
#include "volt/precision/precision_plugin.h"
#include "volt/profiler/profiler.h"
#include "volt/progress/progress_bar.h"
#include "volt/strategies/strategy.h"

namespace volt {

TrainingEpochLoop::TrainingEpochLoop(const TrainingEpochConfig& config, Strategy& strategy, PrecisionPlugin& precision,
                                     MetricRouter& metrics, LightningModule& module, DataLoader& train,
                                     const OptimizerConfig& optimization, ProgressBar* bar, Profiler& profiler)
    : config_(config),
      strategy_(strategy),
      precision_(precision),
      metrics_(metrics),
      module_(module),
      train_(train),
      bar_(bar),
      profiler_(profiler),
      results_(/*training=*/true, &strategy.collectives()) {
  const StepParts parts{strategy, precision, module, optimization, profiler};
  if (module.automatic_optimization()) {
    automatic_.emplace(parts, metrics.callback_metrics(), config.gradient_clip_val, config.gradient_clip_algorithm);
  } else {
    manual_.emplace(parts, config.accumulate_grad_batches, config.gradient_clip_val, config.strategy);
  }
}

void TrainingEpochLoop::run(FitProgress& progress, StopController& stop, EpochHooks& hooks,
                            std::optional<int64_t> num_batches, std::optional<int64_t> val_interval) {
  bool validate_at_end = false;
  bool complete = false;
  if (manual_) manual_->start_epoch(progress, hooks);
  const ManualOptimizationScope manual_scope(module_, manual_ ? &*manual_ : nullptr);
  {
    // Reset and install the sink before the hook: Lightning lets on_train_epoch_start log.
    results_.reset();
    const MetricSinkScope sink(module_, &results_);
    train_.set_epoch(progress.epoch);
    hooks.dispatch(
        [](Callback& c, const CallbackContext& ctx, CallbackServices& s) { return c.on_train_epoch_start(ctx, s); },
        {});
    module_.on_train_epoch_start();
    // A hook may have frozen or unfrozen layers (BackboneFinetuning): ddp re-arms its gradient
    // synchronization over what trains now, before the epoch's first backward.
    strategy_.sync_trainable_parameters(module_);
    if (bar_) {
      bar_->start(fmt::format("Epoch {}", progress.epoch), static_cast<int>(progress.epoch), num_batches.value_or(-1));
    }

    const int64_t accumulate = hooks.accumulate_grad_batches(progress.epoch);
    if (manual_) manual_->check_accumulation(accumulate, progress.epoch);
    const bool validates = hooks.validates_in_epoch(progress.epoch);
    // The loader's workers make the rest of the epoch's batches ahead of the steps; a stop
    // before the end drops what they made.
    const int64_t first = num_batches ? std::min(progress.batches_done, *num_batches) : progress.batches_done;
    StepFeed feed(train_, first, num_batches, strategy_.collectives());
    // Resumed from a checkpoint taken at the end of a batch whose validation had not run yet: run
    // it first, as Lightning's restarting epoch loop does.
    if (progress.validation_pending) {
      if (!feed.has_step()) {
        validate_at_end = true;
      } else {
        hooks.validate_mid_epoch();
      }
    }
    while (!stop.should_stop() && feed.has_step()) {
      // The step's parts (docs/profiling.md); validation after it is timed on its own.
      std::optional<Profiler::Scope> step(std::in_place, profiler_, Action::kTrainStep);
      const int64_t i = progress.batches_done;
      const StepInput input = [&] {
        const Profiler::Scope fetch(profiler_, Action::kDataFetch);
        return feed.take();
      }();
      const Batch batch = [&] {
        const Profiler::Scope transfer(profiler_, Action::kTransfer);
        return prepare_batch(module_, input.batch, config_.device, precision_, /*dataloader_idx=*/0);
      }();
      if (!input.joined) {
        const Profiler::Scope timed(profiler_, Action::kHooks);
        hooks.dispatch(
            [](Callback& c, const CallbackContext& ctx, CallbackServices& s) { return c.on_train_batch_start(ctx, s); },
            HookPoint{.batch = &batch, .batch_idx = i});
        module_.on_train_batch_start(batch, i);
      }
      // A process whose stream ran dry steps along on its replay batch: it logs nothing new.
      std::optional<ResultCollection> kept;
      if (input.joined) kept = results_;
      results_.set_batch_size(batch.size());
      // The automatic loop asks whether the pass ends after training_step, before the backward
      // pass; asked again below, last() answers the same without waiting.
      const auto last_of_pass = [&feed] { return feed.last(); };
      const torch::Tensor loss = manual_ ? manual_->run(batch, i, input)
                                         : automatic_->run(batch, i, input, accumulate, last_of_pass, progress, hooks);
      const bool last = feed.last();
      std::optional<Profiler::Scope> end_hooks(std::in_place, profiler_, Action::kHooks);
      if (!input.joined) module_.on_train_batch_end(loss, batch, i);
      if (kept) {
        kept->keep_metrics_from(results_);
        results_ = std::move(*kept);
      }
      ++progress.batches_done;
      ++progress.total_batches;
      // Checkpoints taken by the callbacks below precede this batch's validation, if one is due.
      const bool validation_due = validates && (val_interval ? (i + 1) % *val_interval == 0 : last);
      progress.validation_pending = validation_due;
      end_hooks.reset();

      {
        const Profiler::Scope timed(profiler_, Action::kLogging);
        metrics_.publish_step(results_, progress.epoch, progress.global_step,
                              progress.total_batches % config_.log_every_n_steps == 0);
        show_progress(progress.batches_done, /*force=*/false);
      }
      end_hooks.emplace(profiler_, Action::kHooks);
      hooks.prepare_metric_states(/*train_batch_end=*/true);
      hooks.dispatch(
          [](Callback& c, const CallbackContext& ctx, CallbackServices& s) { return c.on_train_batch_end(ctx, s); },
          HookPoint{.batch = &batch, .batch_idx = i, .outputs = &loss});
      if (config_.max_steps >= 0 && progress.global_step >= config_.max_steps)
        stop.stop_at_limit(StopReason::kMaxSteps);
      hooks.at_step_boundary();
      end_hooks.reset();
      step.reset();
      profiler_.step_done();
      if (config_.straggler_every_n_steps && progress.total_batches % *config_.straggler_every_n_steps == 0) {
        hooks.check_stragglers();
      }
      // Mid-epoch validation (val_check_interval < 1 epoch); the end-of-epoch one is below.
      if (validation_due) {
        if (last || stop.should_stop()) {
          validate_at_end = true;
        } else {
          hooks.validate_mid_epoch();
        }
      }
    }
    complete = feed.finished() || (num_batches && progress.batches_done >= *num_batches);
  }
  const bool interrupted = stop.reason() == StopReason::kInterrupted || stop.reason() == StopReason::kRequeued;
  if (!complete && interrupted) return;
  if (complete && progress.batches_done == 0 && hooks.validates_in_epoch(progress.epoch)) validate_at_end = true;
  finish_epoch(progress, hooks, complete, validate_at_end);
}

void TrainingEpochLoop::finish_epoch(FitProgress& progress, EpochHooks& hooks, bool complete, bool validate_at_end) {
  std::map<std::string, double> val_bar;
  if (validate_at_end) val_bar = hooks.validate_end_of_epoch();
  {
    const MetricSinkScope sink(module_, &results_);
    module_.on_train_epoch_end();
  }
  // An epoch cut short (max_steps, a callback's stop) reports its values so far, as Lightning
  // does, but a resume continues inside it: the metrics' states go back to where the epoch stood
  // once reported, so that the checkpoints saved from here (last.ckpt at the stop) resume them
  // and the resumed epoch reports what an uninterrupted one does.
  std::vector<StateDict> unfinished;
  if (!complete) {
    for (const auto& [name, metric] : module_.registered_metrics()) unfinished.push_back(metric->state_dict());
  }
  results_.sync_epoch(strategy_.collectives());
  metrics_.publish_epoch(results_, progress.epoch, progress.global_step);
  for (size_t m = 0; m < unfinished.size(); ++m) module_.registered_metrics()[m].second->load_state_dict(unfinished[m]);
  bar_metrics_ = results_.epoch_metrics(MetricTarget::kProgBar);
  bar_metrics_.insert(val_bar.begin(), val_bar.end());
  show_progress(progress.batches_done, /*force=*/true);
  if (bar_) {
    auto shown = results_.step_metrics(MetricTarget::kProgBar);
    shown.insert(bar_metrics_.begin(), bar_metrics_.end());
    bar_->finish(shown);
  }
  // An epoch cut short by max_steps or a stop is not complete: a resume continues inside it.
  // Under manual optimization the module steps its schedulers itself, as in Lightning.
  if (complete && automatic_) automatic_->step_schedulers(Interval::kEpoch, progress.epoch + 1);
  progress.epoch_done = complete;
  // Callbacks see (and checkpoints record) the epoch with all its end-of-epoch work done, so
  // a resume from one of these checkpoints starts cleanly at the next epoch.
  if (validate_at_end) {
    hooks.prepare_metric_states(/*train_batch_end=*/false);
    hooks.dispatch(
        [](Callback& c, const CallbackContext& ctx, CallbackServices& s) { return c.on_validation_end(ctx, s); }, {});
  }
  hooks.prepare_metric_states(/*train_batch_end=*/false);
  hooks.dispatch(
      [](Callback& c, const CallbackContext& ctx, CallbackServices& s) { return c.on_train_epoch_end(ctx, s); }, {});
  hooks.at_epoch_end();
  metrics_.save();
}

void TrainingEpochLoop::show_progress(int64_t done, bool force) {
  if (!bar_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - last_bar_update_ <= std::chrono::milliseconds(100)) return;
  last_bar_update_ = now;
  auto shown = results_.step_metrics(MetricTarget::kProgBar);
  shown.insert(bar_metrics_.begin(), bar_metrics_.end());
  bar_->update(done, shown);
}

}  // namespace volt
