// run_main for programs that link LibTorch: volt::options' exit codes, with LibTorch's c10::Error
// reported as an internal error by its message, without the C++ backtrace LibTorch appends.
#pragma once

#include <functional>

#include "volt/options/run_main.h"

namespace volt {

/// Runs `body` and maps what it throws to an exit code with a one-paragraph message on stderr:
/// 0 or body's result on success, kExitBadInput (1) for volt::Error, kExitUsage (2) for a
/// command line that does not parse, kExitInternalError (70) for internal errors, LibTorch's
/// errors and other exceptions. See volt/options/run_main.h.
///
/// Example:
/// ```
/// int main(int argc, char** argv) {
///   return volt::run_main([&] { /* parse flags, build the Trainer, fit */ return 0; });
/// }
/// ```
int run_main(const std::function<int()>& body);

}  // namespace volt
