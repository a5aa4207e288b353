// Manual optimization (Lightning's automatic_optimization = False): training_step calls
// manual_backward, steps its optimizers itself, and the Trainer's training loop supplies the
// backward and step that respect precision, ddp and uneven streams.
#pragma once

#include <cstddef>

#include "volt/options/option_enums.h"

namespace torch {
class Tensor;
namespace optim {
class Optimizer;
}  // namespace optim
}  // namespace torch

namespace volt {

struct OptimizerConfig;

/// What a module under manual optimization calls on the training loop; the loop installs one
/// while it trains such a module.
class ManualOptimization {
 public:
  virtual ~ManualOptimization() = default;
  /// The optimizers and schedulers configure_optimizers returned.
  virtual const OptimizerConfig& optimization() const = 0;
  /// Backpropagates `loss` as the Trainer does after training_step: through the precision
  /// plugin (16-mixed scales it) and ddp's gradient synchronization, weighted like an automatic
  /// step on a process whose stream ran dry (its gradients are exact zeros).
  virtual void backward(const torch::Tensor& loss) = 0;
  /// Steps optimizer `index`: 16-mixed unscales first and skips a step with inf/NaN gradients,
  /// a clip asked for by clip_gradients applies, on_before_optimizer_step runs, and the step
  /// counts towards global_step (each optimizer's step counts, as in Lightning).
  virtual void step(size_t index) = 0;
  /// Clips optimizer `index`'s gradients to `value` when it next steps (after 16-mixed unscales
  /// them, so the value means the true gradients).
  virtual void clip_gradients(size_t index, double value, GradientClipAlgorithm algorithm) = 0;
};

/// One of the module's optimizers as manual optimization uses it (Lightning's
/// LightningOptimizer): step() goes through the Trainer, zero_grad() and optimizer() are the
/// optimizer's own.
class LightningOptimizer {
 public:
  /// Optimizer `index` of `loop`'s optimization.
  LightningOptimizer(ManualOptimization& loop, size_t index) : loop_(&loop), index_(index) {}
  /// Steps it through the Trainer (ManualOptimization::step).
  void step() { loop_->step(index_); }
  /// Zeroes its parameters' gradients.
  void zero_grad();
  /// The LibTorch optimizer (its param_groups, options and state).
  torch::optim::Optimizer& optimizer() const;
  /// Its position among configure_optimizers' optimizers.
  size_t index() const { return index_; }

 private:
  ManualOptimization* loop_;
  size_t index_;
};

}  // namespace volt
