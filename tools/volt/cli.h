// The `volt` command line: `volt slurm render|submit`, `volt sweep render|submit|run-trial|status`,
// `volt new <dir>`, `volt plot <log dir>` and `volt checkpoint ...` (which runs volt-checkpoint,
// beside this binary: reading checkpoints needs LibTorch, which this tool does not link).
//
// The parsing and the work are in small, unit-tested pieces (job_flags, trainer_shape,
// rank_table, param_spec, sweep_jobs, sweep_status, process, project_template, metrics_csv,
// plot); this file wires them to CLI11 subcommands and turns errors into messages and exit codes.
#pragma once

namespace volt::tool {

/// Runs `volt` with `argv` and returns its exit code, as volt::run_main maps them for every Volt
/// program: 0 on success (and for --help), kExitBadInput (1) for bad input or a failed SLURM
/// command, kExitUsage (2) for a command line that does not parse (an unknown flag, a missing
/// subcommand), kExitInternalError (70) for a bug; each reported on stderr with a HINT.
int run_volt_tool(int argc, const char* const* argv);

}  // namespace volt::tool
