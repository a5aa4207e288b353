// Which LibTorch Volt is compiled against. Volt builds against Debian's LibTorch 1.13 (CPU) and
// upstream LibTorch 2.x (CUDA); where an API differs, the area that uses it keeps the difference
// in its own compatibility header (distributed/c10d_compat.h, optim/optimizer_compat.h,
// precision/autocast_compat.h, base/autograd_compat.h), which tests these macros.
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

namespace volt::compat {

/// The LibTorch version Volt was compiled against, e.g. "1.13.1".
inline const char* torch_version() { return TORCH_VERSION; }

}  // namespace volt::compat
