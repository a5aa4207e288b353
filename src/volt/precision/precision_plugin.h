// What the loops call to run a module at a precision: Lightning's precision plugins.
#pragma once

#include <ATen/core/Dict.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <vector>

#include "volt/precision/autocast_guard.h"
#include "volt/precision/grad_scaler.h"
#include "volt/precision/precision.h"

namespace volt {

/// The checkpoint key of the loss scaler's state (Lightning's).
inline constexpr const char* kScalerCheckpointKey = "native_amp_scaling_state";

/// The precision-dependent steps of training and evaluation, called by the Trainer (and by
/// strategies that run the steps themselves, such as dp). One object per Trainer; make one with
/// make_precision_plugin. The defaults are 32-true's: nothing is cast, scaled or skipped.
///
/// Example (one training step):
/// ```
/// auto plugin = volt::make_precision_plugin(volt::Precision::kBf16Mixed, c10::DeviceType::CPU);
/// torch::Tensor loss;
/// { const volt::AutocastGuard autocast = plugin->forward_context(); loss = model.training_step(batch, i); }
/// plugin->backward(loss);
/// plugin->optimizer_step(optimizers, clip, [](size_t) {});
/// ```
class PrecisionPlugin {
 public:
  virtual ~PrecisionPlugin() = default;

  /// The mode this plugin runs.
  virtual Precision precision() const = 0;
  /// Casts the module's floating parameters and buffers (64-true, 16-true, bf16-true); once,
  /// before its optimizers are made.
  virtual void convert_module(torch::nn::Module& module) const {}
  /// A floating input tensor cast like the module; other tensors are returned unchanged.
  virtual torch::Tensor convert_input(const torch::Tensor& input) const { return input; }
  /// A guard to hold over each forward pass (training, validation, test and predict steps):
  /// autocast in the mixed modes, nothing otherwise. Backward runs outside it.
  virtual AutocastGuard forward_context() const { return {}; }
  /// Backpropagates `loss` (16-mixed: the scaled loss).
  virtual void backward(const torch::Tensor& loss) { loss.backward(); }
  /// One optimizer step: prepares the gradients (16-mixed: unscales them), calls
  /// `clip_gradients`, then for each optimizer `before_step(index)` and its step, unless the
  /// gradients hold inf/NaN (16-mixed skips the step and lowers the scale). Returns true when
  /// the optimizers stepped. Gradients are not zeroed here.
  virtual bool optimizer_step(const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers,
                              const std::function<void()>& clip_gradients,
                              const std::function<void(size_t)>& before_step);
  /// State to checkpoint under kScalerCheckpointKey; empty when the mode has none.
  virtual c10::impl::GenericDict state_dict() const;
  /// Restores state_dict() (ignored by modes without state).
  virtual void load_state_dict(const c10::impl::GenericDict& state) {}
  /// The loss scaler (16-mixed), else nullptr.
  virtual GradScaler* scaler() { return nullptr; }
};

/// The plugin for `precision` on `device`: 16-mixed scales the loss (GradScaler with
/// `scaler_options`), bf16-mixed only autocasts. Throws volt::Error (check_precision_supported)
/// when this LibTorch cannot run the mode on `device`.
std::unique_ptr<PrecisionPlugin> make_precision_plugin(Precision precision, c10::DeviceType device,
                                                       GradScalerOptions scaler_options = {});

}  // namespace volt
