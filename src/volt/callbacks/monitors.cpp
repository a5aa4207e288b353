#include "volt/callbacks/monitors.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

#include "volt/core/error.h"
#include "volt/module/lightning_module.h"

// Set by CMake for a LibTorch built with CUDA (scripts/build-cuda.sh), whose caching allocator
// keeps the memory statistics; Debian's CPU LibTorch ships that header without what it includes.
#ifdef VOLT_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace volt {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

ThroughputMonitor::ThroughputMonitor(ThroughputMonitorOptions options, Clock clock)
    : options_(std::move(options)), clock_(std::move(clock)) {
  VOLT_CHECK(options_.window_size >= 2 && options_.log_every_n_batches >= 1,
             "ThroughputMonitor got window_size={} and log_every_n_batches={}; a rate needs a window of at least 2 "
             "batches and an interval of at least 1. HINT: e.g. window_size=100, log_every_n_batches=50.",
             options_.window_size, options_.log_every_n_batches);
}

Decision ThroughputMonitor::on_train_epoch_start(const CallbackContext&, CallbackServices&) {
  window_.clear();
  return {};
}

Decision ThroughputMonitor::on_train_batch_end(const CallbackContext& context, CallbackServices& services) {
  const int64_t samples = context.batch == nullptr ? 0
                          : options_.batch_size    ? options_.batch_size(*context.batch)
                                                   : context.batch->size();
  window_.push_back(Mark{clock_(), samples});
  while (static_cast<int64_t>(window_.size()) > options_.window_size) window_.pop_front();
  if (++batches_ % options_.log_every_n_batches != 0 || window_.size() < 2) return {};
  // The first mark only starts the clock: its batch ran before the window.
  const double seconds = seconds_between(window_.front().time, window_.back().time);
  if (seconds <= 0.0) return {};
  int64_t window_samples = 0;
  for (size_t i = 1; i < window_.size(); ++i) window_samples += window_[i].samples;
  const double batches_per_sec = static_cast<double>(window_.size() - 1) / seconds;
  const double samples_per_sec = static_cast<double>(window_samples) / seconds;
  const auto world = static_cast<double>(context.module != nullptr ? context.module->world_size() : 1);
  std::map<std::string, double> metrics = {{"train/device/batches_per_sec", batches_per_sec},
                                           {"train/device/samples_per_sec", samples_per_sec},
                                           {"train/batches_per_sec", batches_per_sec * world},
                                           {"train/samples_per_sec", samples_per_sec * world}};
  if (options_.flops_per_example) {
    metrics["train/device/flops_per_sec"] = samples_per_sec * *options_.flops_per_example;
    metrics["train/flops_per_sec"] = samples_per_sec * world * *options_.flops_per_example;
  }
  services.log_metrics(metrics);
  return {};
}

ProcessStats read_process_stats() {
  ProcessStats stats;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    // "VmRSS:     123456 kB"
    int64_t* field = line.rfind("VmRSS:", 0) == 0   ? &stats.rss_bytes
                     : line.rfind("VmHWM:", 0) == 0 ? &stats.peak_rss_bytes
                                                    : nullptr;
    if (field != nullptr) *field = std::strtoll(line.c_str() + 6, nullptr, 10) * 1024;
  }
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) == 0) {
    stats.cpu_seconds = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                        static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
  }
  return stats;
}

DeviceStatsMonitor::DeviceStatsMonitor(DeviceStatsMonitorOptions options, Clock clock,
                                       std::function<ProcessStats()> stats)
    : options_(options), clock_(std::move(clock)), stats_(std::move(stats)) {
  VOLT_CHECK(options_.log_every_n_batches >= 1,
             "DeviceStatsMonitor got log_every_n_batches={}; it must be at least 1. HINT: e.g. 50.",
             options_.log_every_n_batches);
}

Decision DeviceStatsMonitor::on_train_epoch_start(const CallbackContext&, CallbackServices&) {
  // The CPU share is measured from here: the time between epochs (validation) is not training's.
  last_.emplace(clock_(), stats_().cpu_seconds);
  return {};
}

Decision DeviceStatsMonitor::on_train_batch_end(const CallbackContext& context, CallbackServices& services) {
  if (++batches_ % options_.log_every_n_batches != 0) return {};
  const ProcessStats now = stats_();
  const auto time = clock_();
  std::map<std::string, double> metrics = {
      {"device_stats/rss_mb", static_cast<double>(now.rss_bytes) / kMiB},
      {"device_stats/peak_rss_mb", static_cast<double>(now.peak_rss_bytes) / kMiB},
  };
  if (last_ && seconds_between(last_->first, time) > 0.0) {
    metrics["device_stats/cpu_percent"] =
        100.0 * (now.cpu_seconds - last_->second) / seconds_between(last_->first, time);
  }
  last_.emplace(time, now.cpu_seconds);
#ifdef VOLT_TORCH_CUDA
  if (context.module != nullptr && context.module->device().is_cuda()) {
    const auto device = context.module->device().index();
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
    const size_t aggregate = 0;  // StatType::AGGREGATE, whose namespace differs between LibTorch versions
    metrics["device_stats/cuda/allocated_mb"] = static_cast<double>(stats.allocated_bytes[aggregate].current) / kMiB;
    metrics["device_stats/cuda/reserved_mb"] = static_cast<double>(stats.reserved_bytes[aggregate].current) / kMiB;
    metrics["device_stats/cuda/peak_allocated_mb"] = static_cast<double>(stats.allocated_bytes[aggregate].peak) / kMiB;
  }
#else
  (void)context;
#endif
  services.log_metrics(metrics);
  return {};
}

}  // namespace volt
