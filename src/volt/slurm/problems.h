// How volt::slurm reports several input problems at once (private to this library).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace volt::slurm::internal {

/// Throws volt::Error listing every problem, one per line, when there are any.
///
/// The validators collect all problems instead of stopping at the first, so one failed
/// submission names everything to fix.
void throw_if_problems(std::string_view what, const std::vector<std::string>& problems);

}  // namespace volt::slurm::internal
