// The parts of one training step that automatic and manual optimization share: training_step
// under autocast, a backward pass between its hooks, a replayed step's zero loss and
// on_before_optimizer_step.
#pragma once

#include <cstddef>
#include <cstdint>

namespace torch {
class Tensor;
}  // namespace torch

namespace volt {

class CallbackDispatcher;
class LightningModule;
class PrecisionPlugin;
class Profiler;
class Strategy;
struct Batch;
struct OptimizerConfig;

/// What the optimization loops run a batch with, all borrowed (the epoch loop's), and the steps
/// both of them take with it. Copies share what they borrow.
struct StepParts {
  /// Runs the step (before_forward, training_step) and the backward pass with its gradient sync.
  Strategy& strategy;
  /// Gives training_step its autocast, backpropagates (16-mixed scales the loss) and steps.
  PrecisionPlugin& precision;
  /// The module trained.
  LightningModule& module;
  /// The optimizers and schedulers configure_optimizers returned.
  const OptimizerConfig& optimization;
  /// Times each part of the step (Action's kStepParts).
  Profiler& profiler;

  /// The module's training_step on `batch` through the strategy, under the precision's autocast.
  torch::Tensor training_step(const Batch& batch, int64_t index) const;
  /// The backward pass of `loss` (gradient sync waits when `synchronize`, timed as kGradSync),
  /// between on_before_backward and on_after_backward of `callbacks` (nullptr: none) and of the
  /// module, which run only when `hooks` (false on a replayed batch, whose loss is not the
  /// module's). Returns the seconds it took, hooks included.
  double backward(const torch::Tensor& loss, bool synchronize, bool hooks, CallbackDispatcher* callbacks) const;
  /// A loss whose backward pass gives every trained parameter a gradient of exactly 0: a process
  /// whose stream ran dry backpropagates it so that its gradient sync matches the others'.
  torch::Tensor zero_loss() const;
  /// on_before_optimizer_step of `callbacks` (nullptr: none), then of the module, for optimizer
  /// `index`.
  void before_optimizer_step(size_t index, CallbackDispatcher* callbacks) const;
};

}  // namespace volt
