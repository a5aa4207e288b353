#include "volt/precision/grad_scaler.h"

#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "volt/base/state_dict.h"
#include "volt/core/error.h"

namespace volt {

namespace {

/// Non-finite check and unscale of one device's gradients: ATen's fused kernel on CUDA; on CPU
/// (no kernel in 1.13) the same semantics: every gradient is multiplied by inv_scale, and
/// found_inf becomes 1 when any element is inf or NaN.
void check_and_unscale(std::vector<torch::Tensor>& grads, torch::Tensor& found_inf, const torch::Tensor& inv_scale) {
  if (found_inf.is_cuda()) {
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
    return;
  }
  for (auto& grad : grads) {
    if (!torch::isfinite(grad).all().item<bool>()) found_inf.fill_(1.0);
    grad.mul_(inv_scale);
  }
}

/// _amp_update_scale_'s rule: backoff and a reset tracker after inf/NaN; otherwise count the
/// step and grow (when the grown scale is finite) after growth_interval of them.
void update_scale(torch::Tensor& scale, torch::Tensor& growth_tracker, const torch::Tensor& found_inf,
                  const GradScalerOptions& o) {
  if (scale.is_cuda()) {
    at::_amp_update_scale_(scale, growth_tracker, found_inf, o.growth_factor, o.backoff_factor, o.growth_interval);
    return;
  }
  const float current = scale.item<float>();
  if (found_inf.item<float>() > 0) {
    scale.fill_(static_cast<float>(current * o.backoff_factor));
    growth_tracker.zero_();
    return;
  }
  const int64_t successful = growth_tracker.item<int32_t>() + 1;
  if (successful < o.growth_interval) {
    growth_tracker.fill_(successful);
    return;
  }
  const auto grown = static_cast<float>(current * o.growth_factor);
  if (std::isfinite(grown)) scale.fill_(grown);
  growth_tracker.zero_();
}

double number(const c10::impl::GenericDict& state, const char* key) {
  const auto it = state.find(key);
  VOLT_CHECK(it != state.end(),
             "GradScaler state has no '{}'. HINT: pass a GradScaler.state_dict(), which holds "
             "scale, growth_factor, backoff_factor, growth_interval and _growth_tracker.",
             key);
  const c10::IValue& value = it->value();
  if (value.isDouble()) return value.toDouble();
  if (value.isInt()) return static_cast<double>(value.toInt());
  if (value.isTensor() && value.toTensor().numel() == 1) return value.toTensor().item<double>();
  throw Error(fmt::format("GradScaler state '{}' is a {}, not a number. HINT: pass a GradScaler.state_dict().", key,
                          value.tagKind()));
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options) : options_(options) {
  VOLT_CHECK(
      options_.init_scale > 0 && std::isfinite(options_.init_scale),
      "GradScaler init_scale={} must be a positive finite number. HINT: the default is 65536 (2^16), as in PyTorch.",
      options_.init_scale);
  VOLT_CHECK(options_.growth_factor > 1.0,
             "GradScaler growth_factor={} must be > 1.0. HINT: the default is 2.0, which doubles the scale after "
             "growth_interval finite steps.",
             options_.growth_factor);
  VOLT_CHECK(options_.backoff_factor > 0.0 && options_.backoff_factor < 1.0,
             "GradScaler backoff_factor={} must be in (0.0, 1.0). HINT: the default is 0.5, which halves the scale "
             "after a step with inf/NaN gradients.",
             options_.backoff_factor);
  VOLT_CHECK(options_.growth_interval > 0,
             "GradScaler growth_interval={} must be > 0. HINT: it counts finite steps before the scale grows; the "
             "default is 2000.",
             options_.growth_interval);
  scale_ = torch::full({1}, options_.init_scale, torch::kFloat32);
  growth_tracker_ = torch::zeros({1}, torch::kInt32);
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) {
  if (scale_.device() != loss.device()) {
    scale_ = scale_.to(loss.device());
    growth_tracker_ = growth_tracker_.to(loss.device());
  }
  // scale_ has one dimension, so it takes part in type promotion: a float16 loss is scaled in
  // float32 (as in PyTorch), where 65536 does not overflow.
  return loss * scale_;
}

GradScaler::OptimizerState& GradScaler::state_of(const torch::optim::Optimizer& optimizer) {
  return per_optimizer_[&optimizer];
}

bool GradScaler::any_found(const OptimizerState& state) {
  for (const auto& found : state.found_inf) {
    if (found.item<float>() > 0) return true;
  }
  return false;
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  OptimizerState& state = state_of(optimizer);
  VOLT_CHECK(!state.unscaled,
             "GradScaler::unscale_ was already called for this optimizer since the last update(). "
             "HINT: unscale once per step, before clipping; step() unscales only when unscale_ did not.");
  VOLT_CHECK(!state.stepped,
             "GradScaler::unscale_ is called after step() for this optimizer. HINT: call update() "
             "to finish the iteration first.");
  // In double, as PyTorch does, so the reciprocal of a large scale stays exact.
  const torch::Tensor inv_scale = scale_.to(torch::kDouble).reciprocal().to(torch::kFloat32);
  // The fused kernel takes one device's tensors (dp holds replicas' gradients on several).
  std::vector<std::pair<c10::Device, std::vector<torch::Tensor>>> by_device;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& param : group.params()) {
      const torch::Tensor& grad = param.grad();
      if (!grad.defined()) continue;
      VOLT_CHECK(grad.scalar_type() != torch::kHalf,
                 "GradScaler cannot unscale float16 gradients: their parameters are float16. HINT: '16-mixed' keeps "
                 "parameters in float32; '16-true' trains without a scaler.");
      auto it =
          std::find_if(by_device.begin(), by_device.end(), [&](const auto& d) { return d.first == grad.device(); });
      if (it == by_device.end()) it = by_device.insert(by_device.end(), {grad.device(), {}});
      it->second.push_back(grad);
    }
  }
  for (auto& [device, grads] : by_device) {
    torch::Tensor found = torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
    check_and_unscale(grads, found, inv_scale.to(device));
    state.found_inf.push_back(found);
  }
  if (sync_) {
    // Also a process whose shard holds no gradient takes part: the reduction is a collective.
    torch::Tensor any = torch::zeros({1}, torch::kFloat32);
    for (const torch::Tensor& found : state.found_inf) any.add_(found.cpu());
    sync_(any);
    state.found_inf = {any.to(scale_.device())};
  }
  state.unscaled = true;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  VOLT_CHECK(!state_of(optimizer).stepped,
             "GradScaler::step was already called for this optimizer since the last "
             "update(). HINT: call update() once per iteration, after the steps.");
  if (!state_of(optimizer).unscaled) unscale_(optimizer);
  OptimizerState& state = state_of(optimizer);
  state.stepped = true;
  if (any_found(state)) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  VOLT_CHECK(!per_optimizer_.empty(),
             "GradScaler::update found no inf/NaN checks of this iteration. HINT: call "
             "step(optimizer) (or unscale_) before update().");
  torch::Tensor found = torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat32).device(scale_.device()));
  for (const auto& [optimizer, state] : per_optimizer_) {
    for (const auto& f : state.found_inf) found.add_(f.to(scale_.device()));
  }
  update_scale(scale_, growth_tracker_, found, options_);
  per_optimizer_.clear();
}

double GradScaler::get_scale() const { return scale_.item<double>(); }

int64_t GradScaler::growth_tracker() const { return growth_tracker_.item<int64_t>(); }

c10::impl::GenericDict GradScaler::state_dict() const {
  c10::impl::GenericDict state = make_state_dict();
  state.insert("scale", get_scale());
  state.insert("growth_factor", options_.growth_factor);
  state.insert("backoff_factor", options_.backoff_factor);
  state.insert("growth_interval", options_.growth_interval);
  state.insert("_growth_tracker", growth_tracker());
  return state;
}

void GradScaler::load_state_dict(const c10::impl::GenericDict& state) {
  GradScalerOptions options;
  options.init_scale = options_.init_scale;
  options.growth_factor = number(state, "growth_factor");
  options.backoff_factor = number(state, "backoff_factor");
  options.growth_interval = static_cast<int64_t>(number(state, "growth_interval"));
  const double scale = number(state, "scale");
  const auto tracker = static_cast<int64_t>(number(state, "_growth_tracker"));
  VOLT_CHECK(scale > 0 && std::isfinite(scale),
             "GradScaler state scale={} must be a positive finite number. HINT: the saved scaler state is damaged; "
             "load a checkpoint saved by a working GradScaler.",
             scale);
  options_ = options;
  scale_.fill_(scale);
  growth_tracker_.fill_(tracker);
  per_optimizer_.clear();
}

}  // namespace volt
