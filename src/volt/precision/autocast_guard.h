// Autocast for a scope, as Python's `with torch.autocast(device_type, dtype):`.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace volt {

/// Turns LibTorch's autocast on for one device type while it lives and restores the previous
/// state after; a default-constructed guard does nothing (the -true precisions).
///
/// Example:
/// ```
/// {
///   volt::AutocastGuard autocast(c10::DeviceType::CPU, at::kBFloat16);
///   auto y = linear(x);  // bfloat16
/// }
/// ```
class AutocastGuard {
 public:
  /// A guard that changes nothing.
  AutocastGuard() = default;
  /// Enables autocast to `dtype` for tensors on `device` (CPU: bfloat16; CUDA: float16 or bfloat16).
  AutocastGuard(c10::DeviceType device, c10::ScalarType dtype);
  /// Restores the previous state; the outermost guard also drops autocast's cache of cast
  /// weights, which would otherwise hold copies from before the next optimizer step.
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

  /// True when this guard turned autocast on.
  bool active() const { return active_; }

 private:
  bool active_ = false;
  c10::DeviceType device_ = c10::DeviceType::CPU;
  bool previous_enabled_ = false;
  c10::ScalarType previous_dtype_ = c10::ScalarType::Undefined;
};

}  // namespace volt
