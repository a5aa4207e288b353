// A program's main, with Volt's exit codes: the same for every program built with Volt and for
// the `volt` tool. No LibTorch: LibTorch's own errors are added by volt::cli's run_main
// (volt/cli/run_main.h), which programs that link LibTorch call.
#pragma once

#include <exception>
#include <functional>
#include <optional>
#include <string>

namespace volt {

/// The exit code of bad input (a volt::Error: options, files, the environment), reported with its HINT.
inline constexpr int kExitBadInput = 1;
/// The exit code of a command line that does not parse (an unknown flag, a missing value).
inline constexpr int kExitUsage = 2;
/// The exit code of a bug or an unexpected failure (BSD's EX_SOFTWARE).
inline constexpr int kExitInternalError = 70;

/// The message of an exception that is neither Volt's nor CLI11's, or nullopt when the
/// describer does not know its type (run_main then prints `what()`).
using ForeignErrorDescriber = std::function<std::optional<std::string>(const std::exception& error)>;

/// Runs `body` and maps what it throws to an exit code with a one-paragraph message on stderr:
/// body's own result on success; kExitBadInput for volt::Error; for a CLI::ParseError that
/// escapes `body`, 0 when it means success (--print-config) and kExitUsage otherwise;
/// kExitInternalError for volt::InternalError and anything else, described by
/// `describe_foreign` when it knows the type.
///
/// Example (a program without LibTorch; with it, call volt::cli's `run_main(body)`):
/// ```
/// int main(int argc, char** argv) {
///   return volt::run_main([&] { return work(argc, argv); }, {});
/// }
/// ```
int run_main(const std::function<int()>& body, const ForeignErrorDescriber& describe_foreign);

}  // namespace volt
