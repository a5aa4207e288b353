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

/// This thread's autocast settings for CPU and CUDA. The default value is autocast off on both.
struct AutocastState {
  /// Whether CPU autocast is on, and the dtype it casts to.
  bool cpu_enabled = false;
  c10::ScalarType cpu_dtype = c10::ScalarType::BFloat16;
  /// Whether CUDA autocast is on, and the dtype it casts to.
  bool cuda_enabled = false;
  c10::ScalarType cuda_dtype = c10::ScalarType::Half;
  /// The calling thread's settings.
  static AutocastState current();
};

/// Applies an AutocastState while alive and restores the thread's previous settings after.
/// Activation checkpointing recomputes a forward pass during backward, on the autograd engine's
/// thread, under the autocast its first run had; and `AutocastStateGuard off{AutocastState{}}`
/// runs a piece of code outside autocast (an operation autocast's dtype lacks).
class AutocastStateGuard {
 public:
  /// Applies `state`.
  explicit AutocastStateGuard(const AutocastState& state);
  /// Restores what was there before.
  ~AutocastStateGuard();
  AutocastStateGuard(const AutocastStateGuard&) = delete;
  AutocastStateGuard& operator=(const AutocastStateGuard&) = delete;

 private:
  AutocastState previous_;
  bool nested_;  // counted in autocast's nesting (state turns autocast on)
};

}  // namespace volt
