// SLURM hostlist expressions: "node[01-04,7]", "a,b", "rack1-[2,5]", "r[1-2]-n[1-3]".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace volt::slurm {

/// The most hosts an expression may expand to; larger ones are rejected as malformed rather
/// than exhausting memory. 65536 hosts is more than any one job spans; SLURM's hostlist code
/// allows ranges of 1M, which with long names took the fuzz test past its 1 GiB budget.
inline constexpr std::size_t kMaxHosts = 1 << 16;

/// Expands a SLURM hostlist into host names, in order, like `scontrol show hostnames`.
///
/// Commas at the top level separate items; inside brackets they separate ranges. A range keeps
/// the zero padding of its lower bound (`[08-10]` gives 08, 09, 10). Several bracket groups in
/// one item expand as a cartesian product in SLURM's order: the last group fastest, then the
/// first, the second, ... Empty items ("a,,b", "a,") are skipped, as SLURM does. Throws
/// volt::Error naming the expression, the position and what was expected for malformed input
/// (unbalanced or nested brackets, empty ranges, a reversed range, non-digits in a range, too
/// many hosts, no host at all).
std::vector<std::string> expand_hostlist(std::string_view expression);

/// Expands SLURM's compressed per-node counts (SLURM_TASKS_PER_NODE, SLURM_STEP_TASKS_PER_NODE):
/// "2(x3),1" gives {2, 2, 2, 1}. Throws volt::Error naming the text for anything else.
std::vector<int64_t> expand_tasks_per_node(std::string_view text);

/// The first host of a hostlist without expanding the rest (the main address of a job).
std::string first_host(std::string_view expression);

}  // namespace volt::slurm
