// Problems found in one input, reported together: a user fixing a job file, a sweep or a
// checkpoint wants to see every mismatch at once, not one per run.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace volt {

/// What is wrong with one input, one sentence per problem.
using Problems = std::vector<std::string>;

/// "<what> has N problem(s):" followed by one "\n  - <problem>" line per problem.
std::string describe_problems(std::string_view what, const Problems& problems);

/// Throws volt::Error with describe_problems(what, problems) when there are any.
void throw_if_problems(std::string_view what, const Problems& problems);

}  // namespace volt
