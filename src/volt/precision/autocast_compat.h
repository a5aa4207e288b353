// Where autocast's API differs between LibTorch 1.13 and 2.4+ (device-generic functions there,
// CPU/CUDA-named ones here). Private to volt::precision (and its tests).
#pragma once

#include <ATen/autocast_mode.h>

#include "volt/base/torch_version.h"

namespace volt::compat {

/// Whether autocast is on for `device` (CPU or CUDA) in this thread.
inline bool autocast_enabled(c10::DeviceType device) {
#if VOLT_TORCH_CPU_FLOAT16
  return at::autocast::is_autocast_enabled(device);
#else
  return device == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
#endif
}

/// Turns autocast on or off for `device` (CPU or CUDA) in this thread.
inline void set_autocast_enabled(c10::DeviceType device, bool enabled) {
#if VOLT_TORCH_CPU_FLOAT16
  at::autocast::set_autocast_enabled(device, enabled);
#else
  if (device == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(enabled);
  } else {
    at::autocast::set_enabled(enabled);
  }
#endif
}

/// The dtype autocast casts to on `device` (CPU or CUDA).
inline at::ScalarType autocast_dtype(c10::DeviceType device) {
#if VOLT_TORCH_CPU_FLOAT16
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                        : at::autocast::get_autocast_gpu_dtype();
#endif
}

/// Sets the dtype autocast casts to on `device` (CPU or CUDA).
inline void set_autocast_dtype(c10::DeviceType device, at::ScalarType dtype) {
#if VOLT_TORCH_CPU_FLOAT16
  at::autocast::set_autocast_dtype(device, dtype);
#else
  if (device == c10::DeviceType::CPU) {
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
#endif
}

}  // namespace volt::compat
