// One batch under automatic optimization (Lightning's _AutomaticOptimization): the Trainer
// backpropagates training_step's loss and, at the end of each accumulation window, steps every
// optimizer and the step-interval schedulers.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "volt/base/interval.h"
#include "volt/checkpoint/checkpoint_state.h"
#include "volt/loops/step_parts.h"
#include "volt/options/option_enums.h"

namespace volt {

struct StepInput;

/// Trains one batch of a module whose automatic_optimization() is true, for the epoch loop.
///
/// Lightning's order (docs/hooks.md): training_step (under autocast), on_before_backward,
/// backward (scaled by 1/accumulate_grad_batches), on_after_backward, and at the accumulation
/// boundary the optimizer step: unscale, configure_gradient_clipping, on_before_optimizer_step,
/// step or skip, on_before_zero_grad, zero_grad, step-interval schedulers through
/// lr_scheduler_step.
class AutomaticOptimizationLoop {
 public:
  /// Trains with `parts`; `callback_metrics` (borrowed) holds the values a scheduler that needs
  /// one (ReduceLROnPlateau) monitors; `gradient_clip_val` and `gradient_clip_algorithm` are
  /// what the module's configure_gradient_clipping gets (unset: no clipping by default).
  AutomaticOptimizationLoop(StepParts parts, const std::map<std::string, double>& callback_metrics,
                            std::optional<double> gradient_clip_val, GradientClipAlgorithm gradient_clip_algorithm);

  /// Trains batch `index` (`batch`, prepared from `input`, whose weight scales the loss and
  /// which, when joined, backpropagates exact zeros without hooks): training_step, its loss
  /// checked, and its backward pass, which synchronizes gradients only when an optimizer step
  /// follows, at the end of every `accumulate` batches or at the pass's `last()` (called once,
  /// after training_step: it may wait for the processes' count of data). The step counts in
  /// `progress.global_step`; `callbacks` hear every hook. Returns training_step's loss.
  torch::Tensor run(const Batch& batch, int64_t index, const StepInput& input, int64_t accumulate,
                    const std::function<bool()>& last, FitProgress& progress, CallbackDispatcher& callbacks);

  /// Steps the schedulers of `interval` whose frequency divides `count` (the global step for
  /// kStep, the number of epochs done for kEpoch), through the module's lr_scheduler_step.
  void step_schedulers(Interval interval, int64_t count);

 private:
  void check_loss(const torch::Tensor& loss) const;
  void optimizer_step(FitProgress& progress, CallbackDispatcher& callbacks);

  StepParts parts_;
  const std::map<std::string, double>& callback_metrics_;
  std::optional<double> gradient_clip_val_;
  GradientClipAlgorithm gradient_clip_algorithm_;
};

}  // namespace volt
