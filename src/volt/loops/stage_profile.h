// The end of a profiled stage: the simple profiler's report, every process side by side under
// ddp, printed by global rank 0 and written to a file per process.
#pragma once

#include <string>

namespace volt {

class Console;
class Profiler;
class Strategy;

/// Ends `profiler`'s stage. With a profiler asked for (profiler="simple" or "pytorch"), on every
/// process (a collective when there are several): gathers each process's statistics, prints the
/// stage's table, the step breakdown and the processes side by side through `console` (global
/// rank 0's), and writes this process's report to `<dir>/profile-<stage>-rank<N>.txt`. Returns
/// that file's path ("" without a profiler).
std::string finish_stage_profile(Profiler& profiler, Strategy& strategy, Console& console, const std::string& dir);

/// `<dir>/<prefix>-<stage>-rank<rank><suffix>`: where a stage's profile and trace files go.
std::string stage_profile_path(const std::string& dir, const std::string& prefix, const std::string& stage,
                               int64_t rank, const std::string& suffix);

}  // namespace volt
