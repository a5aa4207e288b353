// What this build can run of the precision modes (the Precision enum itself, its names and
// aliases are volt::options', in volt/options/option_enums.h).
#pragma once

#include <c10/core/DeviceType.h>

#include <optional>
#include <string>
#include <vector>

#include "volt/options/option_enums.h"

namespace volt {

/// The modes this LibTorch can run on `device` (CPU 1.13: no float16 autocast or matmul).
std::vector<Precision> supported_precisions(c10::DeviceType device);

/// Throws volt::Error when this LibTorch cannot run `precision` on `device`; the message lists
/// what is supported and a HINT naming the nearest supported mode (16-mixed -> bf16-mixed).
void check_precision_supported(Precision precision, c10::DeviceType device);

/// For a LibTorch error that says an operation has no kernel for a half-precision dtype
/// ("\"mse_cpu\" not implemented for 'BFloat16'"), what to do about it: a HINT naming the dtype,
/// the way to run that piece outside autocast (AutocastStateGuard) or in float32, and where the
/// known gaps are listed (docs/precision.md). nullopt for any other message. run_main appends it
/// to the error it prints.
std::optional<std::string> missing_kernel_hint(const std::string& message);

}  // namespace volt
