// What this build can run of the precision modes (the Precision enum itself, its names and
// aliases are volt::options', in volt/options/option_enums.h).
#pragma once

#include <c10/core/DeviceType.h>

#include <string>
#include <vector>

#include "volt/options/option_enums.h"

namespace volt {

/// The modes this LibTorch can run on `device` (CPU 1.13: no float16 autocast or matmul).
std::vector<Precision> supported_precisions(c10::DeviceType device);

/// Throws volt::Error when this LibTorch cannot run `precision` on `device`; the message lists
/// what is supported and a HINT naming the nearest supported mode (16-mixed -> bf16-mixed).
void check_precision_supported(Precision precision, c10::DeviceType device);

}  // namespace volt
