#include "volt/precision/precision.h"

#include <fmt/format.h>

#include <algorithm>

#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/torch_compat.h"

namespace volt {

namespace {

constexpr Precision kAllPrecisions[] = {Precision::k32True,    Precision::k64True, Precision::k16Mixed,
                                        Precision::kBf16Mixed, Precision::k16True, Precision::kBf16True};

/// "'32-true' (alias 32)" and so on, for messages.
std::string with_alias(Precision precision) {
  switch (precision) {
    case Precision::k32True:
      return "'32-true' (alias 32)";
    case Precision::k64True:
      return "'64-true' (alias 64)";
    case Precision::k16Mixed:
      return "'16-mixed' (alias 16)";
    case Precision::kBf16Mixed:
      return "'bf16-mixed' (alias bf16)";
    case Precision::k16True:
      return "'16-true'";
    case Precision::kBf16True:
      return "'bf16-true'";
  }
  return "?";
}

std::string list(const std::vector<Precision>& precisions) {
  std::vector<std::string> names;
  for (Precision p : precisions) names.push_back(with_alias(p));
  return join(names, ", ");
}

}  // namespace

const char* to_string(Precision precision) {
  switch (precision) {
    case Precision::k32True:
      return "32-true";
    case Precision::k64True:
      return "64-true";
    case Precision::k16Mixed:
      return "16-mixed";
    case Precision::kBf16Mixed:
      return "bf16-mixed";
    case Precision::k16True:
      return "16-true";
    case Precision::kBf16True:
      return "bf16-true";
  }
  return "?";
}

Precision parse_precision(const std::string& text) {
  const std::string t = to_lower(trim(text));
  // Lightning's aliases: the bare numbers of Lightning 1.x ("16" meant native AMP).
  if (t == "32") return Precision::k32True;
  if (t == "64") return Precision::k64True;
  if (t == "16") return Precision::k16Mixed;
  if (t == "bf16") return Precision::kBf16Mixed;
  for (Precision p : kAllPrecisions) {
    if (t == to_string(p)) return p;
  }
  throw Error(
      fmt::format("precision='{}' is not a precision; expected one of {}. HINT: '32-true' is the default; "
                  "'bf16-mixed' is mixed precision on CPU.",
                  text, list({std::begin(kAllPrecisions), std::end(kAllPrecisions)})));
}

bool is_mixed(Precision precision) { return precision == Precision::k16Mixed || precision == Precision::kBf16Mixed; }

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
                  precision == Precision::k16Mixed ? "autocast" : "matrix kernels", list(supported), to_string(nearest),
                  to_string(precision)));
}

}  // namespace volt
