// Whether a monitored metric should go down or up: one enum for every component that watches a
// metric (EarlyStopping, ModelCheckpoint, ReduceLROnPlateau), so "min"/"max" parse alike.
#pragma once

#include <string_view>

namespace volt {

/// Whether a monitored metric should go down ("min", a loss) or up ("max", an accuracy).
enum class Mode { kMin, kMax };
/// "min" or "max".
const char* to_string(Mode mode);
/// Parses "min"/"max"; throws volt::Error naming the accepted values.
Mode parse_mode(std::string_view text);

}  // namespace volt
