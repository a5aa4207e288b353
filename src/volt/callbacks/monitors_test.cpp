#include "volt/callbacks/monitors.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "volt/callbacks/testing_services.h"
#include "volt/core/error.h"
#include "volt/data/batch.h"

namespace volt {
namespace {

using std::chrono::milliseconds;
using TimePoint = std::chrono::steady_clock::time_point;

CallbackContext with_batch(const Batch& batch) {
  CallbackContext context;
  context.batch = &batch;
  return context;
}

TEST(ThroughputMonitor, LogsTheRatesOfTheWindowEveryNBatches) {
  testing::ManualClock clock;
  ThroughputMonitor monitor({.log_every_n_batches = 4, .window_size = 3, .flops_per_example = 1000.0}, clock.clock());
  testing::RecordingServices services;
  Batch batch;
  batch.data = torch::zeros({8, 2});
  monitor.on_train_epoch_start({}, services);
  // 100 ms per batch, then one slow batch of 300 ms at the end of the window.
  for (const int64_t ms : {100, 100, 100, 300}) {
    clock.now += milliseconds(ms);
    monitor.on_train_batch_end(with_batch(batch), services);
  }
  ASSERT_EQ(services.logged.size(), 1U);
  const auto& m = services.logged[0];
  // The window holds the last 3 batch ends: 2 batches of 8 in 0.4 s.
  EXPECT_DOUBLE_EQ(m.at("train/device/batches_per_sec"), 5.0);
  EXPECT_DOUBLE_EQ(m.at("train/device/samples_per_sec"), 40.0);
  EXPECT_DOUBLE_EQ(m.at("train/samples_per_sec"), 40.0);  // one process
  EXPECT_DOUBLE_EQ(m.at("train/device/flops_per_sec"), 40000.0);
  // Nothing more until the 8th batch.
  for (int i = 0; i < 3; ++i) {
    clock.now += milliseconds(50);
    monitor.on_train_batch_end(with_batch(batch), services);
  }
  EXPECT_EQ(services.logged.size(), 1U);
}

TEST(ThroughputMonitor, AnEpochStartRestartsTheWindowAndABatchSizeFunctionCountsSamples) {
  testing::ManualClock clock;
  ThroughputMonitor monitor(
      {.log_every_n_batches = 2, .window_size = 10, .batch_size = [](const Batch&) { return int64_t{3}; }},
      clock.clock());
  testing::RecordingServices services;
  Batch batch;
  batch.data = torch::zeros({8, 2});
  monitor.on_train_batch_end(with_batch(batch), services);
  // Validation between the epochs takes 10 s: it is not training time.
  clock.now += std::chrono::seconds(10);
  monitor.on_train_epoch_start({}, services);
  monitor.on_train_batch_end(with_batch(batch), services);  // the 2nd batch: one mark, no rate yet
  EXPECT_TRUE(services.logged.empty());
  clock.now += milliseconds(500);
  monitor.on_train_batch_end(with_batch(batch), services);
  clock.now += milliseconds(500);
  monitor.on_train_batch_end(with_batch(batch), services);
  ASSERT_EQ(services.logged.size(), 1U);
  EXPECT_DOUBLE_EQ(services.logged[0].at("train/device/batches_per_sec"), 2.0);
  EXPECT_DOUBLE_EQ(services.logged[0].at("train/device/samples_per_sec"), 6.0);
  EXPECT_EQ(services.logged[0].count("train/flops_per_sec"), 0U);
}

TEST(ThroughputMonitor, RefusesAWindowThatCannotHoldARate) {
  EXPECT_THROW(ThroughputMonitor({.window_size = 1}), Error);
  EXPECT_THROW(ThroughputMonitor({.log_every_n_batches = 0}), Error);
}

TEST(DeviceStatsMonitor, LogsMemoryAndTheCpuShareSinceTheLastLog) {
  testing::ManualClock clock;
  ProcessStats stats{.rss_bytes = 64 << 20, .peak_rss_bytes = 96 << 20, .cpu_seconds = 10.0};
  DeviceStatsMonitor monitor({.log_every_n_batches = 2}, clock.clock(), [&stats] { return stats; });
  testing::RecordingServices services;
  monitor.on_train_epoch_start({}, services);
  clock.now += std::chrono::seconds(1);
  stats.cpu_seconds = 11.5;  // 1.5 s of CPU in 2 s of wall time: 75% of one core
  monitor.on_train_batch_end({}, services);
  EXPECT_TRUE(services.logged.empty());
  clock.now += std::chrono::seconds(1);
  monitor.on_train_batch_end({}, services);
  ASSERT_EQ(services.logged.size(), 1U);
  const auto& m = services.logged[0];
  EXPECT_DOUBLE_EQ(m.at("device_stats/rss_mb"), 64.0);
  EXPECT_DOUBLE_EQ(m.at("device_stats/peak_rss_mb"), 96.0);
  EXPECT_DOUBLE_EQ(m.at("device_stats/cpu_percent"), 75.0);
}

TEST(DeviceStatsMonitor, ReadsThisProcesssRealStats) {
  // A busy loop uses CPU time; the resident set holds at least the 64 MiB touched here.
  std::vector<char> touched(64 << 20, 1);
  const ProcessStats stats = read_process_stats();
  EXPECT_GE(stats.rss_bytes, static_cast<int64_t>(touched.size()));
  EXPECT_GE(stats.peak_rss_bytes, stats.rss_bytes / 2);
  volatile double sink = 0;
  for (int i = 0; i < 20'000'000; ++i) sink = sink + i * 0.5;
  EXPECT_GT(read_process_stats().cpu_seconds, stats.cpu_seconds);
}

}  // namespace
}  // namespace volt
