#include "volt/loops/manual_optimization_loop.h"

#include <torch/torch.h>

#include "volt/core/error.h"
#include "volt/loops/step_feed.h"
#include "volt/metrics/metric.h"
#include "volt/module/lightning_module.h"
#include "volt/precision/precision_plugin.h"
#include "volt/profiler/profiler.h"
#include "volt/strategies/strategy.h"

namespace volt {

ManualOptimizationLoop::ManualOptimizationLoop(StepParts parts, int64_t accumulate_grad_batches,
                                               std::optional<double> gradient_clip_val, StrategyKind strategy)
    : parts_(parts), clips_(parts.optimization.optimizers.size()) {
  const LightningModule& module = parts.module;
  // Lightning refuses the same: under manual optimization the module decides when to step.
  VOLT_CHECK(accumulate_grad_batches == 1,
             "{} optimizes manually (automatic_optimization() is false), but accumulate_grad_batches={}. HINT: "
             "accumulate in training_step (step the optimizer every k batches) and leave accumulate_grad_batches at 1.",
             module.name(), accumulate_grad_batches);
  VOLT_CHECK(!gradient_clip_val,
             "{} optimizes manually (automatic_optimization() is false), but gradient_clip_val={} asks the Trainer to "
             "clip. HINT: call clip_gradients(optimizer, value) before optimizer.step() in training_step, and unset "
             "gradient_clip_val.",
             module.name(), gradient_clip_val.value_or(0.0));
  VOLT_CHECK(
      strategy != StrategyKind::kDp && strategy != StrategyKind::kDdp2,
      "{} optimizes manually (automatic_optimization() is false), which strategy '{}' cannot run: it splits each "
      "batch over replicas on threads, whose backward passes and steps would interleave. HINT: use "
      "strategy='ddp' (one process per device).",
      module.name(), to_string(strategy));
}

void ManualOptimizationLoop::start_epoch(FitProgress& progress, CallbackDispatcher& callbacks) {
  progress_ = &progress;
  callbacks_ = &callbacks;
}

void ManualOptimizationLoop::check_accumulation(int64_t accumulate, int64_t epoch) const {
  VOLT_CHECK(accumulate == 1,
             "{} optimizes manually (automatic_optimization() is false), but a callback schedules "
             "accumulate_grad_batches={} for epoch {}. HINT: accumulate in training_step and remove the "
             "GradientAccumulationScheduler.",
             parts_.module.name(), accumulate, epoch);
}

torch::Tensor ManualOptimizationLoop::run(const Batch& batch, int64_t index, const StepInput& input) {
  input_ = &input;
  torch::Tensor loss;
  {
    // Its metric updates would count the replayed examples twice.
    std::optional<internal::DiscardMetricUpdates> discard;
    if (input.joined) discard.emplace();
    Profiler::Scope forward(parts_.profiler, Action::kForward);
    inner_seconds_ = 0;
    loss = parts_.training_step(batch, index);
    // training_step ran the backward passes and steps, timed apart.
    forward.exclude(inner_seconds_);
  }
  input_ = nullptr;
  return loss;
}

void ManualOptimizationLoop::backward(const torch::Tensor& loss) {
  VOLT_CHECK(loss.defined() && loss.numel() == 1 && loss.requires_grad(),
             "{}::manual_backward needs a scalar loss that requires grad; got {}. HINT: pass the loss computed from "
             "the model's outputs (after toggle_optimizer, from the toggled optimizer's parameters).",
             parts_.module.name(),
             loss.defined() ? fmt::format("shape {} requires_grad={}", c10::str(loss.sizes()), loss.requires_grad())
                            : std::string("an undefined tensor"));
  // As an automatic step: a process whose stream ran dry contributes exact zeros, the others
  // their loss scaled so that the average is over the processes with data.
  const bool joined = input_ != nullptr && input_->joined;
  const double weight = input_ != nullptr ? input_->weight : 1.0;
  const torch::Tensor weighted = joined ? parts_.zero_loss() : weight != 1 ? loss * weight : loss;
  inner_seconds_ += parts_.backward(weighted, /*synchronize=*/true, /*hooks=*/!joined, callbacks_);
}

void ManualOptimizationLoop::step(size_t index) {
  const OptimizerConfig& optimization = parts_.optimization;
  VOLT_INTERNAL_ASSERT(progress_ != nullptr && index < optimization.optimizers.size(), "manual step {} of {}", index,
                       optimization.optimizers.size());
  const std::shared_ptr<torch::optim::Optimizer>& optimizer = optimization.optimizers[index];
  const auto apply_clip = [&] {
    if (!clips_[index]) return;
    parts_.module.clip_gradients(*optimizer, clips_[index]->value, clips_[index]->algorithm);
    clips_[index].reset();
  };
  const Profiler::Scope timed(parts_.profiler, Action::kOptimizerStep);
  parts_.precision.optimizer_step({optimizer}, apply_clip,
                                  [&](size_t) { parts_.before_optimizer_step(index, callbacks_); });
  parts_.strategy.after_optimizer_step();
  inner_seconds_ += timed.elapsed();
  ++progress_->global_step;
}

void ManualOptimizationLoop::clip_gradients(size_t index, double value, GradientClipAlgorithm algorithm) {
  VOLT_INTERNAL_ASSERT(index < clips_.size(), "clip for optimizer {} of {}", index, clips_.size());
  if (value > 0.0) clips_[index] = Clip{value, algorithm};
}

ManualOptimizationScope::ManualOptimizationScope(LightningModule& module, ManualOptimization* loop) : module_(module) {
  internal::ModuleAccess::set_manual_optimization(module, loop);
}

ManualOptimizationScope::~ManualOptimizationScope() {
  internal::ModuleAccess::set_manual_optimization(module_, nullptr);
}

}  // namespace volt
