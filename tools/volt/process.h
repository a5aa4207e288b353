// Running the SLURM commands (sbatch, squeue, scontrol) and the trial program.
#pragma once

#include <string>
#include <vector>

namespace volt::tool {

/// What a finished child process printed and how it ended.
struct ProcessResult {
  /// The exit status; 128 + N when signal N killed it.
  int exit_code = 0;
  /// Everything it wrote to stdout.
  std::string out;
  /// Everything it wrote to stderr.
  std::string err;
};

/// Runs `argv` (argv[0] found on PATH, as a shell would) without a shell, waits for it and
/// returns its output. Throws volt::Error naming the program and the reason when it cannot be
/// started (e.g. no such program on PATH).
ProcessResult run_process(const std::vector<std::string>& argv);

/// Replaces this process with `argv` (execvp, so argv[0] is found on PATH). Returns only on
/// failure, by throwing volt::Error naming the program and the reason.
[[noreturn]] void exec_process(const std::vector<std::string>& argv);

/// The absolute path of the running executable (/proc/self/exe), or `fallback` when it cannot
/// be read.
std::string self_executable(const std::string& fallback);

}  // namespace volt::tool
