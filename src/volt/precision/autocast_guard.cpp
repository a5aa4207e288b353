#include "volt/precision/autocast_guard.h"

#include "volt/precision/autocast_compat.h"

namespace volt {

AutocastGuard::AutocastGuard(c10::DeviceType device, c10::ScalarType dtype)
    : active_(true),
      device_(device),
      previous_enabled_(compat::autocast_enabled(device)),
      previous_dtype_(compat::autocast_dtype(device)) {
  compat::set_autocast_dtype(device, dtype);
  compat::set_autocast_enabled(device, true);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  // torch.autocast.__exit__: the cache of cast weights lives until the outermost scope ends.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  compat::set_autocast_enabled(device_, previous_enabled_);
  compat::set_autocast_dtype(device_, previous_dtype_);
}

namespace {

void apply(const AutocastState& state) {
  compat::set_autocast_dtype(c10::DeviceType::CPU, state.cpu_dtype);
  compat::set_autocast_enabled(c10::DeviceType::CPU, state.cpu_enabled);
  compat::set_autocast_dtype(c10::DeviceType::CUDA, state.cuda_dtype);
  compat::set_autocast_enabled(c10::DeviceType::CUDA, state.cuda_enabled);
}

}  // namespace

AutocastState AutocastState::current() {
  return AutocastState{.cpu_enabled = compat::autocast_enabled(c10::DeviceType::CPU),
                       .cpu_dtype = compat::autocast_dtype(c10::DeviceType::CPU),
                       .cuda_enabled = compat::autocast_enabled(c10::DeviceType::CUDA),
                       .cuda_dtype = compat::autocast_dtype(c10::DeviceType::CUDA)};
}

AutocastStateGuard::AutocastStateGuard(const AutocastState& state)
    : previous_(AutocastState::current()), nested_(state.cpu_enabled || state.cuda_enabled) {
  apply(state);
  // As AutocastGuard: a scope that turns autocast on counts as one, so its cast weights are
  // dropped when the outermost scope ends instead of outliving the next optimizer step.
  if (nested_) at::autocast::increment_nesting();
}

AutocastStateGuard::~AutocastStateGuard() {
  if (nested_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  apply(previous_);
}

}  // namespace volt
