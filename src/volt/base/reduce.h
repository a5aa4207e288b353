// How several values become one: the vocabulary that the module's logged metrics and the
// process group's collectives share, so that volt::distributed does not need volt::module.
#pragma once

#include <string>

namespace volt {

/// How values logged on several steps (or held by several processes) become one value.
enum class Reduce { kMean, kSum, kMax, kMin };

/// The name of `reduce` ("mean", "sum", "max", "min").
const char* to_string(Reduce reduce);
/// Parses a Reduce name; throws volt::Error listing the accepted names.
Reduce parse_reduce(const std::string& text);

}  // namespace volt
