// One batch under manual optimization (Lightning's _ManualOptimization): training_step runs the
// backward passes and optimizer steps itself, through the ManualOptimization this loop gives the
// module, which respects precision, ddp and uneven streams as an automatic step does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "volt/checkpoint/checkpoint_state.h"
#include "volt/loops/step_parts.h"
#include "volt/module/manual_optimization.h"
#include "volt/options/option_enums.h"
#include "volt/options/run_layout.h"

namespace volt {

struct StepInput;

/// Trains one batch of a module whose automatic_optimization() is false, for the epoch loop,
/// and is the ManualOptimization the module's manual_backward, optimizers() and
/// clip_gradients reach while the epoch loop installs it (ManualOptimizationScope). It steps no
/// optimizer or scheduler of its own.
class ManualOptimizationLoop : public ManualOptimization {
 public:
  /// Trains with `parts`. Throws volt::Error, as Lightning does, when the plan asks the Trainer
  /// to do what the module now decides: accumulate (`accumulate_grad_batches` > 1) or clip
  /// (`gradient_clip_val` set), or for a `strategy` that splits batches over threads (dp, ddp2).
  ManualOptimizationLoop(StepParts parts, int64_t accumulate_grad_batches, std::optional<double> gradient_clip_val,
                         StrategyKind strategy);

  /// From now on the manual steps count in `progress.global_step` and `callbacks` hear the hooks
  /// of the backward passes and steps (both borrowed).
  void start_epoch(FitProgress& progress, CallbackDispatcher& callbacks);
  /// Throws volt::Error when a callback (GradientAccumulationScheduler) schedules `accumulate`
  /// > 1 batches per step for epoch `epoch`: accumulating is the module's business here.
  void check_accumulation(int64_t accumulate, int64_t epoch) const;

  /// Trains batch `index` (`batch`, prepared from `input`, whose weight scales each backward
  /// pass; a joined one backpropagates exact zeros without hooks): training_step, in which the
  /// module backpropagates and steps. The forward time excludes those, timed apart. Returns what
  /// training_step returned, only passed on to on_train_batch_end (Lightning allows None).
  torch::Tensor run(const Batch& batch, int64_t index, const StepInput& input);

  // ManualOptimization: what the module calls from training_step.
  const OptimizerConfig& optimization() const override { return parts_.optimization; }
  void backward(const torch::Tensor& loss) override;
  void step(size_t index) override;
  void clip_gradients(size_t index, double value, GradientClipAlgorithm algorithm) override;

 private:
  struct Clip {
    double value;
    GradientClipAlgorithm algorithm;
  };

  StepParts parts_;
  // Seconds of backward passes and optimizer steps run inside the current training_step:
  // "forward" is training_step less these.
  double inner_seconds_ = 0;
  FitProgress* progress_ = nullptr;          // since start_epoch: where steps count
  CallbackDispatcher* callbacks_ = nullptr;  // since start_epoch: the hooks of backward passes and steps
  const StepInput* input_ = nullptr;         // during run(): its weight, for backward
  std::vector<std::optional<Clip>> clips_;   // per optimizer: the clip its next step applies
};

/// Installs `loop` (nullptr: none) as `module`'s manual optimization for a scope, and clears it
/// at the end, also when a step throws, so the module never points at a finished loop.
class ManualOptimizationScope {
 public:
  /// Gives `module` `loop` until the scope ends.
  ManualOptimizationScope(LightningModule& module, ManualOptimization* loop);
  ~ManualOptimizationScope();
  ManualOptimizationScope(const ManualOptimizationScope&) = delete;
  ManualOptimizationScope& operator=(const ManualOptimizationScope&) = delete;

 private:
  LightningModule& module_;
};

}  // namespace volt
