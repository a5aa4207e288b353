#include "volt/callbacks/gradient_accumulation_scheduler.h"

#include <gtest/gtest.h>

#include "volt/core/error.h"

namespace volt {
namespace {

using Schedule = std::map<int64_t, int64_t>;

TEST(GradientAccumulationScheduler, EachEpochTakesTheFactorOfTheLastKeyAtOrBeforeIt) {
  const GradientAccumulationScheduler scheduler({{0, 8}, {4, 4}, {8, 1}});
  const std::vector<int64_t> expected{8, 8, 8, 8, 4, 4, 4, 4, 1, 1, 1};
  for (int64_t epoch = 0; epoch < static_cast<int64_t>(expected.size()); ++epoch) {
    EXPECT_EQ(scheduler.accumulate_grad_batches(epoch), expected[static_cast<size_t>(epoch)]) << epoch;
  }
}

TEST(GradientAccumulationScheduler, EpochsBeforeTheFirstKeyAccumulateOne) {
  const GradientAccumulationScheduler scheduler(Schedule{{2, 3}});
  EXPECT_EQ(scheduler.accumulate_grad_batches(0), 1);
  EXPECT_EQ(scheduler.accumulate_grad_batches(1), 1);
  EXPECT_EQ(scheduler.accumulate_grad_batches(2), 3);
  EXPECT_EQ(scheduler.accumulate_grad_batches(100), 3);
}

TEST(GradientAccumulationScheduler, RefusesAnEmptyScheduleNegativeEpochsAndFactorsBelowOne) {
  EXPECT_THROW((void)GradientAccumulationScheduler(Schedule{}), Error);
  EXPECT_THROW((void)GradientAccumulationScheduler(Schedule{{-1, 2}}), Error);
  try {
    (void)GradientAccumulationScheduler(Schedule{{0, 0}});
    FAIL() << "a factor of 0 was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("HINT:"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace volt
