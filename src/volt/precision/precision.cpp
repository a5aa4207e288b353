#include "volt/precision/precision.h"

#include <fmt/format.h>

#include <algorithm>

#include "volt/base/torch_version.h"
#include "volt/core/error.h"
#include "volt/core/strings.h"

namespace volt {

namespace {

constexpr Precision kAllPrecisions[] = {Precision::k32True,    Precision::k64True, Precision::k16Mixed,
                                        Precision::kBf16Mixed, Precision::k16True, Precision::kBf16True};

}  // namespace

std::vector<Precision> supported_precisions(c10::DeviceType device) {
  if (device != c10::DeviceType::CPU || VOLT_TORCH_CPU_FLOAT16) {
    return {std::begin(kAllPrecisions), std::end(kAllPrecisions)};
  }
  return {Precision::k32True, Precision::k64True, Precision::kBf16Mixed, Precision::kBf16True};
}

void check_precision_supported(Precision precision, c10::DeviceType device) {
  const auto supported = supported_precisions(device);
  if (std::find(supported.begin(), supported.end(), precision) != supported.end()) return;
  const Precision nearest = precision == Precision::k16True ? Precision::kBf16True : Precision::kBf16Mixed;
  throw Error(
      fmt::format("precision='{}' cannot run on {} with this LibTorch ({}): it has no float16 {} for that "
                  "device. Supported here: {}. HINT: use precision='{}' (bfloat16 has float32's range, so it "
                  "needs no loss scaling), or a CUDA build of Volt for '{}'.",
                  to_string(precision), c10::DeviceTypeName(device, /*lower_case=*/true), compat::torch_version(),
                  precision == Precision::k16Mixed ? "autocast" : "matrix kernels", describe_precisions(supported),
                  to_string(nearest), to_string(precision)));
}

std::optional<std::string> missing_kernel_hint(const std::string& message) {
  for (const char* dtype : {"BFloat16", "Half"}) {
    if (message.find(fmt::format("not implemented for '{}'", dtype)) == std::string::npos) continue;
    return fmt::format(
        "HINT: this LibTorch has no {0} kernel for that operation; a {0} tensor reached it through a "
        "{1} precision or autocast. Run that piece in float32: cast its inputs with .to(torch::kFloat) "
        "inside a `volt::AutocastStateGuard off{{volt::AutocastState{{}}}};` scope (autocast off until the "
        "scope ends), or choose another --precision. docs/precision.md lists the known gaps of each LibTorch.",
        dtype, std::string(dtype) == "BFloat16" ? "bf16" : "16");
  }
  return std::nullopt;
}

}  // namespace volt
