#include "volt/callbacks/lr_monitor.h"

#include <gtest/gtest.h>

#include "volt/callbacks/testing_services.h"

namespace volt {
namespace {

CallbackContext with_lrs() {
  CallbackContext context;
  context.learning_rates = {{"lr-Adam", 0.01}, {"lr-SGD/pg2", 0.5}};
  return context;
}

TEST(LearningRateMonitor, LogsEveryEpochByDefault) {
  LearningRateMonitor monitor;
  testing::RecordingServices services;
  monitor.on_train_batch_end(with_lrs(), services);
  EXPECT_TRUE(services.logged.empty());
  monitor.on_train_epoch_start(with_lrs(), services);
  ASSERT_EQ(services.logged.size(), 1u);
  EXPECT_EQ(services.logged[0], (std::map<std::string, double>{{"lr-Adam", 0.01}, {"lr-SGD/pg2", 0.5}}));
}

TEST(LearningRateMonitor, StepIntervalLogsAfterEveryBatch) {
  LearningRateMonitor monitor(Interval::kStep);
  testing::RecordingServices services;
  monitor.on_train_epoch_start(with_lrs(), services);
  monitor.on_train_batch_end(with_lrs(), services);
  monitor.on_train_batch_end(with_lrs(), services);
  EXPECT_EQ(services.logged.size(), 2u);
}

}  // namespace
}  // namespace volt
