// Sweep parameters written on the command line: `--param lr=log_uniform:1e-4:1e-1`.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "volt/slurm/sweep.h"

namespace volt::tool {

/// Parses one `--param` spec, NAME=KIND:ARGS, into a SweepParameter:
///
///   lr=choice:0.1,0.01            one of the comma-separated values (kept as written)
///   layers=int_range:2:8:2        2, 4, 6, 8 (the step defaults to 1: int_range:2:8)
///   dropout=float_range:0:0.5:0.1 0, 0.1, ..., 0.5
///   momentum=uniform:0.8:0.99     a float drawn uniformly (random search only)
///   lr=log_uniform:1e-4:1e-1      a float whose log is drawn uniformly (random search only)
///
/// Throws volt::Error quoting the spec, what was expected and a HINT. Ranges are checked
/// further by slurm::validate_sweep (low < high, step > 0, ...).
slurm::SweepParameter parse_param_spec(std::string_view spec);

/// The `--param` specs in a params file: one per line; blank lines and lines starting with '#'
/// are skipped, so a sweep can live in a file beside the job file.
std::vector<std::string> param_specs_from_text(const std::string& text);

}  // namespace volt::tool
