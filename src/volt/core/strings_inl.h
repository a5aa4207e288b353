// Template definitions for strings.h.
#pragma once

#include "volt/core/error.h"

namespace volt {

template <typename E, std::size_t N>
E parse_enum(std::string_view text, const E (&values)[N], const char* what) {
  const std::string wanted = to_lower(trim(text));
  std::vector<std::string> names;
  for (const E value : values) {
    const std::string name = to_string(value);
    if (name == wanted) return value;
    names.push_back(name);
  }
  throw Error(fmt::format("unknown {} '{}'; expected one of: {}.", what, text, join(names, ", ")));
}

}  // namespace volt
