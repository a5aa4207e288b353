#include "volt/loops/training_epoch_loop.h"

#include <torch/torch.h>

#include "volt/callbacks/callback.h"
#include "volt/core/error.h"
#include "volt/loops/evaluation_loop.h"
#include "volt/loops/metric_router.h"
#include "volt/loops/step_feed.h"
#include "volt/loops/stop_controller.h"
#include "volt/metrics/metric.h"
#include "volt/optim/lr_scheduler.h"
#include "volt/precision/precision_plugin.h"
#include "volt/profiler/profiler.h"
#include "volt/progress/progress_bar.h"
#include "volt/strategies/strategy.h"
#include "volt/trainer/run_plan.h"

namespace volt {

namespace {

// The module's manual optimization is this loop's for a scope (also when a step throws).
class ManualScope {
 public:
  ManualScope(LightningModule& module, ManualOptimization* loop) : module_(module) {
    internal::ModuleAccess::set_manual_optimization(module, loop);
  }
  ~ManualScope() { internal::ModuleAccess::set_manual_optimization(module_, nullptr); }
  ManualScope(const ManualScope&) = delete;
  ManualScope& operator=(const ManualScope&) = delete;

 private:
  LightningModule& module_;
};

}  // namespace

TrainingEpochLoop::TrainingEpochLoop(const RunPlan& plan, Strategy& strategy, PrecisionPlugin& precision,
                                     MetricRouter& metrics, LightningModule& module, DataLoader& train,
                                     const OptimizerConfig& optimization, ProgressBar* bar, Profiler& profiler)
    : plan_(plan),
      strategy_(strategy),
      precision_(precision),
      metrics_(metrics),
      module_(module),
      train_(train),
      optimization_(optimization),
      bar_(bar),
      profiler_(profiler),
      manual_(!module.automatic_optimization()),
      clips_(optimization.optimizers.size()),
      results_(/*training=*/true, [&strategy](double value, Reduce op) { return strategy.reduce(value, op); }) {
  if (!manual_) return;
  // Lightning refuses the same: under manual optimization the module decides when to step.
  VOLT_CHECK(plan.accumulate_grad_batches == 1,
             "{} optimizes manually (automatic_optimization() is false), but accumulate_grad_batches={}. HINT: "
             "accumulate in training_step (step the optimizer every k batches) and leave accumulate_grad_batches at 1.",
             module.name(), plan.accumulate_grad_batches);
  VOLT_CHECK(!plan.gradient_clip_val,
             "{} optimizes manually (automatic_optimization() is false), but gradient_clip_val={} asks the Trainer to "
             "clip. HINT: call clip_gradients(optimizer, value) before optimizer.step() in training_step, and unset "
             "gradient_clip_val.",
             module.name(), plan.gradient_clip_val.value_or(0.0));
  VOLT_CHECK(
      plan.strategy != StrategyKind::kDp && plan.strategy != StrategyKind::kDdp2,
      "{} optimizes manually (automatic_optimization() is false), which strategy '{}' cannot run: it splits each "
      "batch over replicas on threads, whose backward passes and steps would interleave. HINT: use "
      "strategy='ddp' (one process per device).",
      module.name(), to_string(plan.strategy));
}

void TrainingEpochLoop::run(FitProgress& progress, StopController& stop, EpochHooks& hooks,
                            std::optional<int64_t> num_batches, std::optional<int64_t> val_interval) {
  bool validate_at_end = false;
  bool complete = false;
  progress_ = &progress;
  hooks_ = &hooks;
  const ManualScope manual_scope(module_, manual_ ? this : nullptr);
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
    VOLT_CHECK(!manual_ || accumulate == 1,
               "{} optimizes manually (automatic_optimization() is false), but a callback schedules "
               "accumulate_grad_batches={} for epoch {}. HINT: accumulate in training_step and remove the "
               "GradientAccumulationScheduler.",
               module_.name(), accumulate, progress.epoch);
    const bool validates = hooks.validates_in_epoch(progress.epoch);
    // The loader's workers make the rest of the epoch's batches ahead of the steps; a stop
    // before the end drops what they made.
    const int64_t first = num_batches ? std::min(progress.batches_done, *num_batches) : progress.batches_done;
    StepFeed feed(train_, first, num_batches, strategy_.topology().world_size, count_across(strategy_));
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
        return prepare_batch(module_, input.batch, plan_.root_device(), precision_, /*dataloader_idx=*/0);
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
      input_ = &input;
      torch::Tensor loss;
      {
        // Its metric updates would count the replayed examples twice.
        std::optional<internal::DiscardMetricUpdates> discard;
        if (input.joined) discard.emplace();
        Profiler::Scope forward(profiler_, Action::kForward);
        inner_seconds_ = 0;
        loss = training_step(batch, i);
        // Under manual optimization training_step ran the backward passes and steps, timed apart.
        forward.exclude(inner_seconds_);
      }
      input_ = nullptr;
      const bool last = feed.last();
      const bool steps = (i + 1) % accumulate == 0 || last;
      if (!manual_) {
        // Only the backward pass that precedes an optimizer step communicates (PyTorch's no_sync).
        // A joined step's gradients are exact zeros (not the loss times 0, which is NaN where the
        // replayed loss overflows), so they add nothing to the others' average.
        const torch::Tensor weighted = input.joined        ? zero_loss()
                                       : input.weight != 1 ? loss * (input.weight / static_cast<double>(accumulate))
                                       : accumulate == 1   ? loss
                                                           : loss / static_cast<double>(accumulate);
        backward_with_hooks(weighted, steps, /*hooks=*/!input.joined);
        if (steps) {
          const Profiler::Scope timed(profiler_, Action::kOptimizerStep);
          optimizer_step(progress);
        }
      }
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
                              progress.total_batches % plan_.log_every_n_steps == 0);
        show_progress(progress.batches_done, /*force=*/false);
      }
      end_hooks.emplace(profiler_, Action::kHooks);
      hooks.prepare_metric_states(/*train_batch_end=*/true);
      hooks.dispatch(
          [](Callback& c, const CallbackContext& ctx, CallbackServices& s) { return c.on_train_batch_end(ctx, s); },
          HookPoint{.batch = &batch, .batch_idx = i, .outputs = &loss});
      if (plan_.max_steps >= 0 && progress.global_step >= plan_.max_steps) stop.stop_at_limit(StopReason::kMaxSteps);
      hooks.at_step_boundary();
      end_hooks.reset();
      step.reset();
      profiler_.step_done();
      if (plan_.straggler_every_n_steps && progress.total_batches % *plan_.straggler_every_n_steps == 0) {
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

torch::Tensor TrainingEpochLoop::zero_loss() const {
  // Every trained parameter gets a gradient of exactly 0, so the gradient synchronizer sees the
  // same parameters ready as on the processes that trained. The module's parameters, not the
  // optimizers': under fsdp those are pieces outside the graph.
  torch::Tensor sum;
  for (const torch::Tensor& p : module_.parameters()) {
    if (!p.requires_grad()) continue;
    const torch::Tensor term = p.sum() * 0.0;
    sum = sum.defined() ? sum + term : term;
  }
  return sum;
}

torch::Tensor TrainingEpochLoop::training_step(const Batch& batch, int64_t index) {
  strategy_.before_forward(module_);
  const torch::Tensor loss = [&] {
    const AutocastGuard autocast = precision_.forward_context();
    return strategy_.training_step(module_, batch, index);
  }();
  // Under manual optimization the step backpropagated already; what it returns is only passed on
  // to on_train_batch_end (Lightning allows None).
  if (manual_) return loss;
  VOLT_CHECK(loss.defined() && loss.numel() == 1 && loss.requires_grad(),
             "{}::training_step must return a scalar loss that requires grad; got {}. HINT: return the loss "
             "computed from the model's outputs, not a detached value or a number.",
             module_.name(),
             loss.defined() ? fmt::format("shape {} requires_grad={}", c10::str(loss.sizes()), loss.requires_grad())
                            : std::string("an undefined tensor"));
  return loss;
}

void TrainingEpochLoop::backward(const torch::Tensor& loss) {
  VOLT_CHECK(loss.defined() && loss.numel() == 1 && loss.requires_grad(),
             "{}::manual_backward needs a scalar loss that requires grad; got {}. HINT: pass the loss computed from "
             "the model's outputs (after toggle_optimizer, from the toggled optimizer's parameters).",
             module_.name(),
             loss.defined() ? fmt::format("shape {} requires_grad={}", c10::str(loss.sizes()), loss.requires_grad())
                            : std::string("an undefined tensor"));
  // As an automatic step: a process whose stream ran dry contributes exact zeros, the others
  // their loss scaled so that the average is over the processes with data.
  const bool joined = input_ != nullptr && input_->joined;
  const double weight = input_ != nullptr ? input_->weight : 1.0;
  const torch::Tensor weighted = joined ? zero_loss() : weight != 1 ? loss * weight : loss;
  backward_with_hooks(weighted, /*synchronize=*/true, /*hooks=*/!joined);
}

void TrainingEpochLoop::backward_with_hooks(const torch::Tensor& loss, bool synchronize, bool hooks) {
  const auto start = Profiler::Clock::now();
  if (hooks) {
    const Profiler::Scope timed(profiler_, Action::kHooks);
    dispatch([&loss](Callback& c, const CallbackContext& ctx, CallbackServices& s) {
      return c.on_before_backward(ctx, s, loss);
    });
    module_.on_before_backward(loss);
  }
  {
    Profiler::Scope pass(profiler_, Action::kBackward);
    strategy_.before_backward(loss, synchronize);
    precision_.backward(loss);
    // fsdp reduce-scatters here, so the hooks below see the gradients the optimizers will use.
    strategy_.after_backward(synchronize);
    if (synchronize && strategy_.topology().world_size > 1) {
      const double wait = strategy_.gradient_sync_wait();
      pass.exclude(wait);
      profiler_.record(Action::kGradSync, wait);
    }
  }
  if (hooks) {
    const Profiler::Scope timed(profiler_, Action::kHooks);
    dispatch([](Callback& c, const CallbackContext& ctx, CallbackServices& s) { return c.on_after_backward(ctx, s); });
    module_.on_after_backward();
  }
  inner_seconds_ += std::chrono::duration<double>(Profiler::Clock::now() - start).count();
}

void TrainingEpochLoop::before_optimizer_step(size_t index) {
  torch::optim::Optimizer& optimizer = *optimization_.optimizers[index];
  dispatch([&optimizer, index](Callback& c, const CallbackContext& ctx, CallbackServices& s) {
    return c.on_before_optimizer_step(ctx, s, optimizer, index);
  });
  module_.on_before_optimizer_step(optimizer, index);
}

void TrainingEpochLoop::dispatch(const CallbackHook& hook) {
  if (hooks_ != nullptr) hooks_->dispatch(hook, {});
}

void TrainingEpochLoop::step(size_t index) {
  VOLT_INTERNAL_ASSERT(progress_ != nullptr && index < optimization_.optimizers.size(), "manual step {} of {}", index,
                       optimization_.optimizers.size());
  const std::shared_ptr<torch::optim::Optimizer>& optimizer = optimization_.optimizers[index];
  const auto apply_clip = [&] {
    if (!clips_[index]) return;
    module_.clip_gradients(*optimizer, clips_[index]->value, clips_[index]->algorithm);
    clips_[index].reset();
  };
  const Profiler::Scope timed(profiler_, Action::kOptimizerStep);
  precision_.optimizer_step({optimizer}, apply_clip, [&](size_t) { before_optimizer_step(index); });
  strategy_.after_optimizer_step();
  inner_seconds_ += timed.elapsed();
  ++progress_->global_step;
}

void TrainingEpochLoop::clip_gradients(size_t index, double value, GradientClipAlgorithm algorithm) {
  VOLT_INTERNAL_ASSERT(index < clips_.size(), "clip for optimizer {} of {}", index, clips_.size());
  if (value > 0.0) clips_[index] = Clip{value, algorithm};
}

void TrainingEpochLoop::optimizer_step(FitProgress& progress) {
  // Lightning clips each optimizer's gradients apart (their norm is the optimizer's own), through
  // the module's hook, which may clip differently.
  const auto apply_clip = [this] {
    for (const auto& optimizer : optimization_.optimizers)
      module_.configure_gradient_clipping(*optimizer, plan_.gradient_clip_val, plan_.gradient_clip_algorithm);
  };
  // The plugin unscales (16-mixed) before `clip` and may skip the step on inf/NaN gradients; the
  // step still counts, as in Lightning, so schedules and checkpoints do not drift.
  precision_.optimizer_step(optimization_.optimizers, apply_clip, [this](size_t i) { before_optimizer_step(i); });
  // fsdp all-gathers the updated shards: every process holds the whole model before zero_grad.
  strategy_.after_optimizer_step();
  for (const auto& optimizer : optimization_.optimizers) {
    dispatch([&optimizer](Callback& c, const CallbackContext& ctx, CallbackServices& s) {
      return c.on_before_zero_grad(ctx, s, *optimizer);
    });
    module_.on_before_zero_grad(*optimizer);
    optimizer->zero_grad();
  }
  ++progress.global_step;
  step_schedulers(Interval::kStep, progress.global_step);
}

void TrainingEpochLoop::step_schedulers(Interval interval, int64_t count) {
  for (const auto& config : optimization_.schedulers) {
    if (config.interval != interval || count % config.frequency != 0) continue;
    std::optional<double> metric;
    if (config.scheduler->needs_metric()) {
      metric = internal::monitored_value(&metrics_.callback_metrics(), config.monitor, config.scheduler->name());
    }
    module_.lr_scheduler_step(*config.scheduler, metric);
  }
}

void TrainingEpochLoop::finish_epoch(FitProgress& progress, EpochHooks& hooks, bool complete, bool validate_at_end) {
  std::map<std::string, double> val_bar;
  if (validate_at_end) val_bar = hooks.validate_end_of_epoch();
  {
    const MetricSinkScope sink(module_, &results_);
    module_.on_train_epoch_end();
  }
  results_.sync_epoch([this](torch::Tensor& t, Reduce op) { strategy_.reduce(t, op); }, &strategy_.collectives());
  metrics_.publish_epoch(results_, progress.epoch, progress.global_step);
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
  if (complete && !manual_) step_schedulers(Interval::kEpoch, progress.epoch + 1);
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
