#include "volt/slurm/problems.h"

#include "volt/core/error.h"

namespace volt::slurm::internal {

void throw_if_problems(std::string_view what, const std::vector<std::string>& problems) {
  if (problems.empty()) return;
  std::string message = fmt::format("{} has {} problem{}:", what, problems.size(), problems.size() == 1 ? "" : "s");
  for (const auto& problem : problems) message += "\n  - " + problem;
  throw Error(message);
}

}  // namespace volt::slurm::internal
