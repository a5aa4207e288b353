// The `volt` command line: `volt slurm render|submit`, `volt sweep render|submit|run-trial|status`,
// `volt new <dir>` and `volt plot <log dir>`.
//
// The parsing and the work are in small, unit-tested pieces (job_flags, trainer_shape,
// rank_table, param_spec, sweep_jobs, sweep_status, process, project_template, metrics_csv,
// plot); this file wires them to CLI11 subcommands and turns errors into messages and exit codes.
#pragma once

namespace volt::tool {

/// Runs `volt` with `argv` and returns its exit code: 0 on success (and for --help), 1 for bad
/// input or a failed SLURM command, each reported on stderr with a HINT.
int run_volt_tool(int argc, const char* const* argv);

}  // namespace volt::tool
