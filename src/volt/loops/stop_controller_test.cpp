#include "volt/loops/stop_controller.h"

#include <gtest/gtest.h>

#include <array>
#include <functional>
#include <vector>

namespace volt {
namespace {

TEST(StopController, ACallbackStopIsDecidedAtOnceOnOneProcess) {
  StopController stop;
  stop.propose_callback_stop(/*epoch=*/0, /*global_step=*/10, "val/loss stopped improving");
  EXPECT_FALSE(stop.should_stop()) << "a proposal is not a decision";
  stop.agree([](int code) { return code; });
  EXPECT_TRUE(stop.should_stop());
  EXPECT_EQ(stop.code(), StopCode::kCallback);
  EXPECT_EQ(stop.reason(), StopReason::kCallback);
  EXPECT_EQ(stop.message(), "val/loss stopped improving");
}

TEST(StopController, MinEpochsHoldsOffCallbacksButNotSignals) {
  StopController stop(/*min_epochs=*/3);
  stop.propose_callback_stop(/*epoch=*/1, /*global_step=*/20, "early");
  stop.agree([](int code) { return code; });
  EXPECT_FALSE(stop.should_stop());
  stop.propose_interrupt(StopCode::kInterrupt, "received signal 2");
  stop.agree([](int code) { return code; });
  EXPECT_TRUE(stop.should_stop());
  EXPECT_EQ(stop.reason(), StopReason::kInterrupted);
}

TEST(StopController, MinStepsHoldsOffCallbacksUntilThatManyStepsAreTaken) {
  StopController stop(/*min_epochs=*/0, /*min_steps=*/100);
  stop.propose_callback_stop(/*epoch=*/3, /*global_step=*/99, "patience exhausted");
  stop.agree([](int code) { return code; });
  EXPECT_FALSE(stop.should_stop()) << "one step short of min_steps";
  stop.propose_callback_stop(/*epoch=*/3, /*global_step=*/100, "patience exhausted");
  stop.agree([](int code) { return code; });
  EXPECT_TRUE(stop.should_stop());
  EXPECT_EQ(stop.reason(), StopReason::kCallback);
  EXPECT_EQ(stop.message(), "patience exhausted");
}

TEST(StopController, MinEpochsAndMinStepsMustBothBeReached) {
  StopController steps_short(/*min_epochs=*/2, /*min_steps=*/50);
  steps_short.propose_callback_stop(/*epoch=*/4, /*global_step=*/49, "stop");
  steps_short.agree([](int code) { return code; });
  EXPECT_FALSE(steps_short.should_stop()) << "epochs reached, steps not";
  StopController epochs_short(/*min_epochs=*/2, /*min_steps=*/50);
  epochs_short.propose_callback_stop(/*epoch=*/0, /*global_step=*/500, "stop");
  epochs_short.agree([](int code) { return code; });
  EXPECT_FALSE(epochs_short.should_stop()) << "steps reached, epochs not";
  epochs_short.propose_interrupt(StopCode::kTerminate, "received signal 15");
  epochs_short.agree([](int code) { return code; });
  EXPECT_TRUE(epochs_short.should_stop()) << "signals are not held off";
}

TEST(StopController, TheStrongestProposalAcrossProcessesWinsWithItsOwnWords) {
  StopController rank0, rank1;
  rank0.propose_callback_stop(0, 5, "patience exhausted");
  rank1.propose_interrupt(StopCode::kRequeue, "received SIGUSR1, SLURM's requeue signal");
  const int max = std::max(static_cast<int>(StopCode::kCallback), static_cast<int>(StopCode::kRequeue));
  rank0.agree([max](int) { return max; });
  rank1.agree([max](int) { return max; });
  EXPECT_EQ(rank0.code(), StopCode::kRequeue);
  EXPECT_EQ(rank1.code(), StopCode::kRequeue);
  EXPECT_EQ(rank0.reason(), StopReason::kRequeued);
  EXPECT_EQ(rank0.message(), "another process received SLURM's requeue signal");
  EXPECT_EQ(rank1.message(), "received SIGUSR1, SLURM's requeue signal");
}

TEST(StopController, AsyncAgreementActsOneStepLaterOnEveryProcess) {
  // Two processes; rank 1 receives SIGTERM during step 3. Each step boundary starts a reduction
  // (a collective: both inputs of a step are in before its result is read, at the next boundary).
  StopController ranks[2];
  int stopped_at[2] = {-1, -1};
  std::vector<std::array<int, 2>> inputs;  // per step, per rank
  for (int step = 0; step < 10 && (stopped_at[0] < 0 || stopped_at[1] < 0); ++step) {
    if (step == 3) ranks[1].propose_interrupt(StopCode::kTerminate, "received signal 15");
    inputs.push_back({0, 0});
    for (int r = 0; r < 2; ++r) {
      ranks[r].agree_async([&inputs, r, step](int code) {
        inputs[step][r] = code;
        return std::function<int()>([&inputs, step] { return std::max(inputs[step][0], inputs[step][1]); });
      });
    }
    for (int r = 0; r < 2; ++r)
      if (stopped_at[r] < 0 && ranks[r].should_stop()) stopped_at[r] = step;
  }
  EXPECT_EQ(stopped_at[0], stopped_at[1]) << "every process stops at the same step";
  EXPECT_EQ(stopped_at[0], 4) << "one step after the proposal, not at once and not never";
  EXPECT_EQ(ranks[0].reason(), StopReason::kInterrupted);
  EXPECT_EQ(ranks[0].message(), "another process received SIGTERM");
  EXPECT_EQ(ranks[1].message(), "received signal 15");
}

TEST(StopController, ABlockingAgreementAlsoSettlesTheReductionInFlight) {
  StopController stop;
  stop.propose_interrupt(StopCode::kInterrupt, "received signal 2");
  int started = 0;
  stop.agree_async([&started](int code) {
    ++started;
    return std::function<int()>([code] { return code; });
  });
  EXPECT_FALSE(stop.should_stop()) << "the async result is read at the next boundary";
  int blocking_calls = 0;
  stop.agree([&blocking_calls](int code) {
    ++blocking_calls;
    return code;
  });
  EXPECT_TRUE(stop.should_stop());
  EXPECT_EQ(started, 1);
  EXPECT_EQ(blocking_calls, 1);
}

TEST(StopController, ALimitStopsAtOnceAndACallbackCannotRenameIt) {
  StopController stop;
  stop.stop_at_limit(StopReason::kMaxSteps);
  EXPECT_TRUE(stop.should_stop());
  stop.propose_callback_stop(0, 5, "late");
  stop.agree([](int code) { return code; });
  EXPECT_EQ(stop.reason(), StopReason::kMaxSteps);
  EXPECT_EQ(stop.code(), StopCode::kNone);
}

TEST(StopController, ARequeueAtTheLastStepBecomesANormalFinish) {
  StopController stop;
  stop.propose_interrupt(StopCode::kRequeue, "received SIGUSR1");
  stop.agree([](int code) { return code; });
  ASSERT_EQ(stop.code(), StopCode::kRequeue);
  stop.finish_at(StopReason::kMaxEpochs);
  EXPECT_TRUE(stop.should_stop());
  EXPECT_EQ(stop.code(), StopCode::kNone) << "no HPC checkpoint, no requeue";
  EXPECT_EQ(stop.reason(), StopReason::kMaxEpochs);
  // The end-of-fit callbacks agree once more; the requeue proposal must not come back.
  stop.agree([](int code) { return code; });
  EXPECT_EQ(stop.code(), StopCode::kNone);
  EXPECT_EQ(stop.reason(), StopReason::kMaxEpochs);
}

}  // namespace
}  // namespace volt
