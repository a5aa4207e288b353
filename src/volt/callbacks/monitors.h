// Where the time and memory go while training: ThroughputMonitor and DeviceStatsMonitor.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>

#include "volt/callbacks/callback.h"

namespace volt {

/// Options of ThroughputMonitor.
struct ThroughputMonitorOptions {
  /// Training batches between two logs (Lightning's log_every_n_steps default).
  int64_t log_every_n_batches = 50;
  /// Batches the rates are averaged over: a sliding window, restarted at each epoch's start (so
  /// validation and epoch boundaries do not count as training time).
  int64_t window_size = 100;
  /// Examples in a batch; unset: Batch::size().
  std::function<int64_t(const Batch&)> batch_size;
  /// FLOPs of one example's forward and backward, when the module knows them; unset: no FLOPs/s.
  std::optional<double> flops_per_example;
};

/// Lightning's ThroughputMonitor: logs this process's and the run's training throughput every
/// log_every_n_batches batches, measured between the ends of consecutive batches (so data
/// loading, the step and the optimizer all count):
///   train/device/batches_per_sec, train/device/samples_per_sec (this process),
///   train/batches_per_sec, train/samples_per_sec (times the world size, as Lightning does),
///   train/device/flops_per_sec and train/flops_per_sec with flops_per_example.
/// It keeps no state in checkpoints: a resumed run measures afresh.
class ThroughputMonitor : public Callback {
 public:
  /// The time source; tests pass a fake one.
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  /// Throws volt::Error with a HINT for a window below 2 or an interval below 1.
  explicit ThroughputMonitor(ThroughputMonitorOptions options = {}, Clock clock = std::chrono::steady_clock::now);

  std::string state_key() const override { return "ThroughputMonitor"; }
  Decision on_train_epoch_start(const CallbackContext& context, CallbackServices& services) override;
  Decision on_train_batch_end(const CallbackContext& context, CallbackServices& services) override;

 private:
  struct Mark {
    std::chrono::steady_clock::time_point time;
    int64_t samples = 0;
  };
  ThroughputMonitorOptions options_;
  Clock clock_;
  std::deque<Mark> window_;
  int64_t batches_ = 0;
};

/// What DeviceStatsMonitor reads about this process.
struct ProcessStats {
  /// Resident memory now, bytes.
  int64_t rss_bytes = 0;
  /// The largest resident memory so far (the kernel's high-water mark, which writing 5 to
  /// /proc/self/clear_refs resets), bytes.
  int64_t peak_rss_bytes = 0;
  /// CPU time used so far (user and system, all threads), seconds.
  double cpu_seconds = 0.0;
};

/// This process's stats from /proc/self/status (VmRSS, VmHWM) and getrusage (CPU time).
ProcessStats read_process_stats();

/// Options of DeviceStatsMonitor.
struct DeviceStatsMonitorOptions {
  /// Training batches between two logs.
  int64_t log_every_n_batches = 50;
};

/// Lightning's DeviceStatsMonitor for a C++ process: every log_every_n_batches training batches
/// it logs this process's device_stats/rss_mb, device_stats/peak_rss_mb and
/// device_stats/cpu_percent (CPU time over wall time since the previous log, in percent of one
/// core: 2 busy threads read 200), and on CUDA builds, for the CUDA device the module is on,
/// device_stats/cuda/allocated_mb, reserved_mb and peak_allocated_mb from LibTorch's caching
/// allocator.
class DeviceStatsMonitor : public Callback {
 public:
  /// The time and stats sources; tests pass fake ones.
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  /// Throws volt::Error with a HINT for an interval below 1.
  explicit DeviceStatsMonitor(DeviceStatsMonitorOptions options = {}, Clock clock = std::chrono::steady_clock::now,
                              std::function<ProcessStats()> stats = read_process_stats);

  std::string state_key() const override { return "DeviceStatsMonitor"; }
  Decision on_train_epoch_start(const CallbackContext& context, CallbackServices& services) override;
  Decision on_train_batch_end(const CallbackContext& context, CallbackServices& services) override;

 private:
  DeviceStatsMonitorOptions options_;
  Clock clock_;
  std::function<ProcessStats()> stats_;
  std::optional<std::pair<std::chrono::steady_clock::time_point, double>> last_;  // (time, cpu seconds)
  int64_t batches_ = 0;
};

}  // namespace volt
