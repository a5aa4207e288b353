// The one place where differences between LibTorch versions are handled.
//
// Volt builds against Debian's LibTorch 1.13 (CPU) and upstream LibTorch 2.x (CUDA). Code outside
// this header uses only the names defined here when an API differs between the two.
#pragma once

#include <torch/version.h>

/// True when building against LibTorch 2.0 or newer.
#define VOLT_TORCH_2 (TORCH_VERSION_MAJOR >= 2)
/// True when building against LibTorch `major`.`minor` or newer.
#define VOLT_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
/// LibTorch 2.4 made autocast's API device-generic (the CUDA/CPU-named functions are deprecated)
/// and has float16 autocast and matrix kernels on CPU; 1.13 has neither.
#define VOLT_TORCH_CPU_FLOAT16 VOLT_TORCH_AT_LEAST(2, 4)

#include <ATen/autocast_mode.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

namespace volt::compat {

/// The LibTorch version Volt was compiled against, e.g. "1.13.1".
inline const char* torch_version() { return TORCH_VERSION; }

/// A c10d process group running Gloo. LibTorch 1.x: ProcessGroupGloo is itself a ProcessGroup;
/// 2.x: it is a Backend that a ProcessGroup wraps.
inline c10::intrusive_ptr<c10d::ProcessGroup> make_gloo_group(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    const c10::intrusive_ptr<c10d::ProcessGroupGloo::Options>& options) {
#if VOLT_TORCH_2
  auto backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size,
                                                        c10::make_intrusive<c10d::ProcessGroup::Options>("gloo", options->timeout));
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, backend);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  return group;
#else
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
#endif
}

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
