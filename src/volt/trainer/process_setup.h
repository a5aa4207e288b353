// Per-process settings a run needs before its first tensor operation.
#pragma once

#include <atomic>

#include "volt/trainer/run_plan.h"

namespace volt::internal {

/// Applies the plan's threads, allocator tuning, seed and determinism to this process.
void configure_process(const RunPlan& plan);

/// Pins glibc malloc's mmap and trim thresholds so LibTorch's per-step buffers are reused
/// instead of being returned to the OS and faulted back in every step. Idempotent.
void tune_allocator();

/// Catches SIGINT and SIGTERM while alive: the first one only sets a flag that the training
/// loop polls at batch boundaries (a clean stop with loggers flushed); a second one gets the
/// default action. Restores the previous handlers on destruction.
class StopSignalGuard {
 public:
  StopSignalGuard();
  ~StopSignalGuard();
  StopSignalGuard(const StopSignalGuard&) = delete;
  StopSignalGuard& operator=(const StopSignalGuard&) = delete;
  /// The signal received, or 0.
  static int received();
};

}  // namespace volt::internal
