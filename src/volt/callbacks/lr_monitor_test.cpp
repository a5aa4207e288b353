#include "volt/callbacks/lr_monitor.h"

#include <gtest/gtest.h>

#include "volt/callbacks/testing_services.h"

namespace volt {
namespace {

/// An Adam stepped by a step-interval scheduler, an SGD by an epoch-interval one, and an RMSprop
/// without a scheduler, at global step `step`.
CallbackContext with_lrs(int64_t step = 0) {
  CallbackContext context;
  context.global_step = step;
  context.learning_rates = {
      {"lr-Adam", 0.01, Interval::kStep}, {"lr-SGD/pg2", 0.5, Interval::kEpoch}, {"lr-RMSprop", 0.2, std::nullopt}};
  return context;
}

using Logged = std::vector<std::map<std::string, double>>;

TEST(LearningRateMonitor, ByDefaultLogsEachLearningRateAtItsSchedulersInterval) {
  LearningRateMonitor monitor;
  EXPECT_FALSE(monitor.logging_interval().has_value());
  monitor.setup({.log_every_n_steps = 1});
  testing::RecordingServices services;
  monitor.on_train_epoch_start(with_lrs(0), services);
  monitor.on_train_batch_end(with_lrs(1), services);
  monitor.on_train_batch_end(with_lrs(2), services);
  // Lightning's logging_interval=None: the step scheduler's rate after every step, the epoch
  // scheduler's at the epoch start, the unscheduled one at both.
  EXPECT_EQ(services.logged, (Logged{{{"lr-SGD/pg2", 0.5}, {"lr-RMSprop", 0.2}},
                                     {{"lr-Adam", 0.01}, {"lr-RMSprop", 0.2}},
                                     {{"lr-Adam", 0.01}, {"lr-RMSprop", 0.2}}}));
}

TEST(LearningRateMonitor, StepLoggingFollowsLogEveryNStepsOncePerStep) {
  LearningRateMonitor monitor;
  monitor.setup({.log_every_n_steps = 2});
  testing::RecordingServices services;
  // Two batches accumulate into each step: steps 1, 1, 2, 2, 3, 3, 4, 4.
  for (int64_t step : {1, 1, 2, 2, 3, 3, 4, 4}) monitor.on_train_batch_end(with_lrs(step), services);
  EXPECT_EQ(services.logged.size(), 2u) << "steps 2 and 4";
}

TEST(LearningRateMonitor, EpochIntervalLogsEveryLearningRateAtEachEpochStartOnly) {
  LearningRateMonitor monitor(Interval::kEpoch);
  monitor.setup({.log_every_n_steps = 1});
  testing::RecordingServices services;
  monitor.on_train_batch_end(with_lrs(1), services);
  EXPECT_TRUE(services.logged.empty());
  monitor.on_train_epoch_start(with_lrs(1), services);
  EXPECT_EQ(services.logged, (Logged{{{"lr-Adam", 0.01}, {"lr-SGD/pg2", 0.5}, {"lr-RMSprop", 0.2}}}));
}

TEST(LearningRateMonitor, StepIntervalLogsEveryLearningRateAfterSteps) {
  LearningRateMonitor monitor(Interval::kStep);
  monitor.setup({.log_every_n_steps = 1});
  testing::RecordingServices services;
  monitor.on_train_epoch_start(with_lrs(0), services);
  EXPECT_TRUE(services.logged.empty());
  monitor.on_train_batch_end(with_lrs(1), services);
  monitor.on_train_batch_end(with_lrs(2), services);
  ASSERT_EQ(services.logged.size(), 2u);
  EXPECT_EQ(services.logged[0].size(), 3u);
}

}  // namespace
}  // namespace volt
