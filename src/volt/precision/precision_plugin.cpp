#include "volt/precision/precision_plugin.h"

#include "volt/base/state_dict.h"

namespace volt {

namespace {

/// 32-true: the interface's defaults.
class FullPrecision : public PrecisionPlugin {
 public:
  Precision precision() const override { return Precision::k32True; }
};

/// 64-true, 16-true, bf16-true: module and floating inputs in one dtype, no autocast.
class CastPrecision : public PrecisionPlugin {
 public:
  CastPrecision(Precision precision, c10::ScalarType dtype) : precision_(precision), dtype_(dtype) {}
  Precision precision() const override { return precision_; }
  void convert_module(torch::nn::Module& module) const override { module.to(dtype_); }
  torch::Tensor convert_input(const torch::Tensor& input) const override {
    if (!input.defined() || !input.is_floating_point() || input.scalar_type() == dtype_) return input;
    return input.to(dtype_);
  }

 private:
  Precision precision_;
  c10::ScalarType dtype_;
};

/// 16-mixed and bf16-mixed: float32 weights, steps under autocast; 16-mixed scales the loss.
class MixedPrecision : public PrecisionPlugin {
 public:
  MixedPrecision(Precision precision, c10::DeviceType device, std::unique_ptr<GradScaler> scaler)
      : precision_(precision), device_(device), scaler_(std::move(scaler)) {}
  Precision precision() const override { return precision_; }
  AutocastGuard forward_context() const override {
    return AutocastGuard(device_, precision_ == Precision::k16Mixed ? at::kHalf : at::kBFloat16);
  }
  void backward(const torch::Tensor& loss) override {
    if (!scaler_) return PrecisionPlugin::backward(loss);
    scaler_->scale(loss).backward();
  }
  bool optimizer_step(const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers,
                      const std::function<void()>& clip_gradients,
                      const std::function<void(size_t)>& before_step) override {
    if (!scaler_) return PrecisionPlugin::optimizer_step(optimizers, clip_gradients, before_step);
    // Clipping thresholds are in true gradient units, so unscale first.
    for (const auto& optimizer : optimizers) scaler_->unscale_(*optimizer);
    clip_gradients();
    bool stepped = true;
    for (size_t i = 0; i < optimizers.size(); ++i) {
      before_step(i);
      stepped = scaler_->step(*optimizers[i]) && stepped;
    }
    scaler_->update();
    return stepped;
  }
  c10::impl::GenericDict state_dict() const override {
    return scaler_ ? scaler_->state_dict() : PrecisionPlugin::state_dict();
  }
  void load_state_dict(const c10::impl::GenericDict& state) override {
    if (scaler_) scaler_->load_state_dict(state);
  }
  GradScaler* scaler() override { return scaler_.get(); }

 private:
  Precision precision_;
  c10::DeviceType device_;
  std::unique_ptr<GradScaler> scaler_;
};

}  // namespace

bool PrecisionPlugin::optimizer_step(const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers,
                                     const std::function<void()>& clip_gradients,
                                     const std::function<void(size_t)>& before_step) {
  clip_gradients();
  for (size_t i = 0; i < optimizers.size(); ++i) {
    before_step(i);
    optimizers[i]->step();
  }
  return true;
}

c10::impl::GenericDict PrecisionPlugin::state_dict() const { return make_state_dict(); }

std::unique_ptr<PrecisionPlugin> make_precision_plugin(Precision precision, c10::DeviceType device,
                                                       GradScalerOptions scaler_options) {
  check_precision_supported(precision, device);
  switch (precision) {
    case Precision::k32True:
      return std::make_unique<FullPrecision>();
    case Precision::k64True:
      return std::make_unique<CastPrecision>(precision, at::kDouble);
    case Precision::k16True:
      return std::make_unique<CastPrecision>(precision, at::kHalf);
    case Precision::kBf16True:
      return std::make_unique<CastPrecision>(precision, at::kBFloat16);
    case Precision::k16Mixed:
      return std::make_unique<MixedPrecision>(precision, device, std::make_unique<GradScaler>(scaler_options));
    case Precision::kBf16Mixed:
      return std::make_unique<MixedPrecision>(precision, device, nullptr);
  }
  return std::make_unique<FullPrecision>();
}

}  // namespace volt
