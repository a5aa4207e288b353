// The one place where differences between LibTorch versions are handled.
//
// Volt builds against Debian's LibTorch 1.13 (CPU) and upstream LibTorch 2.x (CUDA). Code outside
// this header uses only the names defined here when an API differs between the two.
#pragma once

#include <torch/version.h>

/// True when building against LibTorch 2.0 or newer.
#define VOLT_TORCH_2 (TORCH_VERSION_MAJOR >= 2)

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

}  // namespace volt::compat
