// The numeric precision of a run: Lightning's precision names and what this build can run.
#pragma once

#include <c10/core/DeviceType.h>

#include <string>
#include <vector>

namespace volt {

/// The numeric precision of parameters and computation (Lightning's `precision=`).
enum class Precision {
  k32True,     ///< "32-true": float32 everywhere (the default)
  k64True,     ///< "64-true": the module and floating inputs in float64
  k16Mixed,    ///< "16-mixed": float32 weights, float16 autocast, dynamic loss scaling
  kBf16Mixed,  ///< "bf16-mixed": float32 weights, bfloat16 autocast, no loss scaling
  k16True,     ///< "16-true": the module and floating inputs in float16
  kBf16True,   ///< "bf16-true": the module and floating inputs in bfloat16
};

/// "32-true", "64-true", "16-mixed", "bf16-mixed", "16-true" or "bf16-true".
const char* to_string(Precision precision);

/// Parses a precision name or one of Lightning's short aliases: 32, 64, 16 (16-mixed) and
/// "bf16" (bf16-mixed); case and surrounding spaces are ignored. Throws volt::Error listing
/// every name. Whether this build can run the mode is check_precision_supported's question.
Precision parse_precision(const std::string& text);

/// True for the autocast modes (16-mixed, bf16-mixed).
bool is_mixed(Precision precision);

/// The modes this LibTorch can run on `device` (CPU 1.13: no float16 autocast or matmul).
std::vector<Precision> supported_precisions(c10::DeviceType device);

/// Throws volt::Error when this LibTorch cannot run `precision` on `device`; the message lists
/// what is supported and a HINT naming the nearest supported mode (16-mixed -> bf16-mixed).
void check_precision_supported(Precision precision, c10::DeviceType device);

}  // namespace volt
