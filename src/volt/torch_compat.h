// The one place where differences between LibTorch versions are handled.
//
// Volt builds against Debian's LibTorch 1.13 (CPU) and upstream LibTorch 2.x (CUDA). Code outside
// this header uses only the names defined here when an API differs between the two.
#pragma once

#include <torch/version.h>

/// True when building against LibTorch 2.0 or newer.
#define VOLT_TORCH_2 (TORCH_VERSION_MAJOR >= 2)

namespace volt::compat {

/// The LibTorch version Volt was compiled against, e.g. "1.13.1".
inline const char* torch_version() { return TORCH_VERSION; }

}  // namespace volt::compat
