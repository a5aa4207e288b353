// Restarts: which attempt of a run this process belongs to, and the faults a test injects into
// one attempt to prove that a restarted run recovers (docs/failures.md).
//
// Both are pure functions of an injected Env.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "volt/core/env.h"

namespace volt {

/// Which attempt of the run this is, 0 for the first: torchrun's TORCHELASTIC_RESTART_COUNT,
/// else VOLT_RESTART_COUNT (set by a batch script of `volt slurm render --max-restarts`). Throws
/// volt::Error naming the variable when it is not a count.
int64_t restart_attempt(const Env& env);

/// Where an injected fault strikes.
enum class FaultPoint {
  kStep,        ///< at the end of the step (after its snapshot, if one was due)
  kSnapshot,    ///< rank 0's writer thread, half-way through writing the snapshot of the step
  kValidation,  ///< at the start of the first validation after the step
  kRendezvous,  ///< before joining the process group (its step is not used): the others wait for it
};
/// "step", "snapshot", "validation", "rendezvous".
const char* to_string(FaultPoint point);

/// A process that kills itself with SIGKILL, as a crashed node or an OOM kill would end it.
struct FaultInjection {
  /// The global rank that dies.
  int64_t rank = 0;
  /// The global step at (or after) which it dies.
  int64_t step = 0;
  /// Where.
  FaultPoint at = FaultPoint::kStep;
};

/// The fault VOLT_INJECT_FAULT asks for in this attempt. The variable holds one fault or several
/// separated by ';', each comma-separated key=value pairs, e.g.
/// "rank=1,step=7;rank=0,at=rendezvous,attempt=1": rank (required), step (required but at
/// rendezvous), at (step, snapshot, validation or rendezvous; default step), attempt (the attempt
/// it strikes in, default 0, so that the restarted run goes on). Unset when none names
/// `attempt`. Throws volt::Error with a HINT when the text does not parse, when at=snapshot names
/// a rank other than 0 (the writer), or when two faults name the same attempt.
std::optional<FaultInjection> read_fault_injection(const Env& env, int64_t attempt);

/// Kills this process with SIGKILL, as an injected fault says it should die: no handler, no
/// flush, nothing written after it, as when a node dies or the kernel's OOM killer strikes.
[[noreturn]] void die_of_injected_fault();

}  // namespace volt
