#include "volt/loops/automatic_optimization_loop.h"

#include <torch/torch.h>

#include "volt/callbacks/callback.h"
#include "volt/core/error.h"
#include "volt/loops/step_feed.h"
#include "volt/metrics/metric.h"
#include "volt/module/lightning_module.h"
#include "volt/optim/lr_scheduler.h"
#include "volt/precision/precision_plugin.h"
#include "volt/profiler/profiler.h"
#include "volt/strategies/strategy.h"

namespace volt {

AutomaticOptimizationLoop::AutomaticOptimizationLoop(StepParts parts,
                                                     const std::map<std::string, double>& callback_metrics,
                                                     std::optional<double> gradient_clip_val,
                                                     GradientClipAlgorithm gradient_clip_algorithm)
    : parts_(parts),
      callback_metrics_(callback_metrics),
      gradient_clip_val_(gradient_clip_val),
      gradient_clip_algorithm_(gradient_clip_algorithm) {}

torch::Tensor AutomaticOptimizationLoop::run(const Batch& batch, int64_t index, const StepInput& input,
                                             int64_t accumulate, const std::function<bool()>& last,
                                             FitProgress& progress, CallbackDispatcher& callbacks) {
  torch::Tensor loss;
  {
    // Its metric updates would count the replayed examples twice.
    std::optional<internal::DiscardMetricUpdates> discard;
    if (input.joined) discard.emplace();
    const Profiler::Scope forward(parts_.profiler, Action::kForward);
    loss = parts_.training_step(batch, index);
    check_loss(loss);
  }
  // last() first: it may wait for the count of processes with data, which must arrive before
  // the backward pass whether or not the window ends here.
  const bool ends_pass = last();
  const bool steps = (index + 1) % accumulate == 0 || ends_pass;
  // Only the backward pass that precedes an optimizer step communicates (PyTorch's no_sync).
  // A joined step's gradients are exact zeros (not the loss times 0, which is NaN where the
  // replayed loss overflows), so they add nothing to the others' average.
  const torch::Tensor weighted = input.joined        ? parts_.zero_loss()
                                 : input.weight != 1 ? loss * (input.weight / static_cast<double>(accumulate))
                                 : accumulate == 1   ? loss
                                                     : loss / static_cast<double>(accumulate);
  parts_.backward(weighted, steps, /*hooks=*/!input.joined, &callbacks);
  if (steps) {
    const Profiler::Scope timed(parts_.profiler, Action::kOptimizerStep);
    optimizer_step(progress, callbacks);
  }
  return loss;
}

void AutomaticOptimizationLoop::check_loss(const torch::Tensor& loss) const {
  VOLT_CHECK(loss.defined() && loss.numel() == 1 && loss.requires_grad(),
             "{}::training_step must return a scalar loss that requires grad; got {}. HINT: return the loss "
             "computed from the model's outputs, not a detached value or a number.",
             parts_.module.name(),
             loss.defined() ? fmt::format("shape {} requires_grad={}", c10::str(loss.sizes()), loss.requires_grad())
                            : std::string("an undefined tensor"));
}

void AutomaticOptimizationLoop::optimizer_step(FitProgress& progress, CallbackDispatcher& callbacks) {
  const OptimizerConfig& optimization = parts_.optimization;
  LightningModule& module = parts_.module;
  // Lightning clips each optimizer's gradients apart (their norm is the optimizer's own), through
  // the module's hook, which may clip differently.
  const auto apply_clip = [&] {
    for (const auto& optimizer : optimization.optimizers)
      module.configure_gradient_clipping(*optimizer, gradient_clip_val_, gradient_clip_algorithm_);
  };
  // The plugin unscales (16-mixed) before `clip` and may skip the step on inf/NaN gradients; the
  // step still counts, as in Lightning, so schedules and checkpoints do not drift.
  parts_.precision.optimizer_step(optimization.optimizers, apply_clip,
                                  [&](size_t i) { parts_.before_optimizer_step(i, &callbacks); });
  // fsdp all-gathers the updated shards: every process holds the whole model before zero_grad.
  parts_.strategy.after_optimizer_step();
  for (const auto& optimizer : optimization.optimizers) {
    callbacks.dispatch([&optimizer](Callback& c, const CallbackContext& ctx,
                                    CallbackServices& s) { return c.on_before_zero_grad(ctx, s, *optimizer); },
                       {});
    module.on_before_zero_grad(*optimizer);
    optimizer->zero_grad();
  }
  ++progress.global_step;
  step_schedulers(Interval::kStep, progress.global_step);
}

void AutomaticOptimizationLoop::step_schedulers(Interval interval, int64_t count) {
  for (const auto& config : parts_.optimization.schedulers) {
    if (config.interval != interval || count % config.frequency != 0) continue;
    std::optional<double> metric;
    if (config.scheduler->needs_metric()) {
      metric = internal::monitored_value(&callback_metrics_, config.monitor, config.scheduler->name());
    }
    parts_.module.lr_scheduler_step(*config.scheduler, metric);
  }
}

}  // namespace volt
