#include "volt/core/problems.h"

#include <fmt/format.h>

#include "volt/core/error.h"

namespace volt {

std::string describe_problems(std::string_view what, const Problems& problems) {
  std::string message = fmt::format("{} has {} problem{}:", what, problems.size(), problems.size() == 1 ? "" : "s");
  for (const auto& problem : problems) message += "\n  - " + problem;
  return message;
}

void throw_if_problems(std::string_view what, const Problems& problems) {
  if (!problems.empty()) throw Error(describe_problems(what, problems));
}

}  // namespace volt
