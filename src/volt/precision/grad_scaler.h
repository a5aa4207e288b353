// Dynamic loss scaling for float16 training, with torch.cuda.amp.GradScaler's semantics.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

namespace volt {

/// How a GradScaler starts and adapts; PyTorch's defaults.
///
/// Example: `volt::GradScaler scaler({.init_scale = 1024, .growth_interval = 100});`
struct GradScalerOptions {
  /// The first loss scale.
  double init_scale = 65536.0;
  /// The scale is multiplied by this after `growth_interval` steps without inf/NaN gradients.
  double growth_factor = 2.0;
  /// The scale is multiplied by this after a step with inf/NaN gradients (which is skipped).
  double backoff_factor = 0.5;
  /// Consecutive finite steps before the scale grows.
  int64_t growth_interval = 2000;
};

/// Scales the loss so float16 gradients do not underflow, unscales the gradients before they
/// are clipped or used, skips optimizer steps whose gradients hold inf/NaN, and adapts the
/// scale: torch.cuda.amp.GradScaler, per iteration
///   scaler.scale(loss).backward(); scaler.unscale_(opt); clip; scaler.step(opt); scaler.update();
/// CUDA tensors use ATen's fused AMP kernels (_amp_foreach_non_finite_check_and_unscale_,
/// _amp_update_scale_); CPU tensors, which have no such kernels in LibTorch 1.13, use plain
/// tensor ops with the same semantics.
class GradScaler {
 public:
  /// A scaler with `options`; throws volt::Error when they are out of range.
  explicit GradScaler(GradScalerOptions options = {});

  /// `loss` multiplied by the current scale (moves the scale to the loss's device once).
  torch::Tensor scale(const torch::Tensor& loss);
  /// Divides `optimizer`'s gradients by the scale in place and records whether any is inf/NaN.
  /// At most once per optimizer between update() calls; throws volt::Error on a second call.
  void unscale_(torch::optim::Optimizer& optimizer);
  /// Steps `optimizer` (unscaling first unless unscale_ ran) unless its gradients held inf/NaN;
  /// returns true when it stepped.
  bool step(torch::optim::Optimizer& optimizer);
  /// Makes every process agree on inf/NaN when each holds only a shard of the gradients (fsdp; PyTorch's
  /// ShardedGradScaler): unscale_ passes `sync` the optimizer's inf/NaN flag (a float32 [1] CPU tensor, > 0:
  /// seen) to reduce with max across the processes, so all of them skip the same steps. A collective: every
  /// process must unscale the same optimizers in the same order. Unset (the default): local only.
  void set_found_inf_sync(std::function<void(torch::Tensor&)> sync) { sync_ = std::move(sync); }
  /// Adapts the scale from this iteration's inf/NaN checks (backoff, or growth after
  /// growth_interval finite steps) and forgets them; once per iteration, after step().
  void update();

  /// The current scale.
  double get_scale() const;
  /// Finite steps since the scale last changed.
  int64_t growth_tracker() const;
  /// The options in effect (load_state_dict replaces them).
  const GradScalerOptions& options() const { return options_; }

  /// PyTorch's GradScaler.state_dict(): {scale, growth_factor, backoff_factor, growth_interval,
  /// _growth_tracker} as plain numbers.
  c10::impl::GenericDict state_dict() const;
  /// Restores a state_dict() (ours or PyTorch's); throws volt::Error naming a missing or
  /// mistyped key.
  void load_state_dict(const c10::impl::GenericDict& state);

 private:
  /// Where an optimizer is in the current iteration.
  struct OptimizerState {
    bool unscaled = false;
    bool stepped = false;
    std::vector<torch::Tensor> found_inf;  // one float per gradient device; > 0: inf/NaN seen
  };
  OptimizerState& state_of(const torch::optim::Optimizer& optimizer);
  static bool any_found(const OptimizerState& state);

  GradScalerOptions options_;
  torch::Tensor scale_;           // float32 [1], on the loss's device
  torch::Tensor growth_tracker_;  // int32 [1], beside scale_
  std::map<const torch::optim::Optimizer*, OptimizerState> per_optimizer_;
  std::function<void(torch::Tensor&)> sync_;  // see set_found_inf_sync
};

}  // namespace volt
