#include "volt/loops/stop_controller.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <vector>

#include "volt/base/testing_collectives.h"

namespace volt {
namespace {

// Rank `rank` of two processes that agree in lockstep on one thread: the k-th reduction started
// by either rank reads inputs[k] of both, so its result is known once both ranks started it.
class LockstepRank : public Collectives {
 public:
  using Collectives::all_reduce;
  LockstepRank(std::vector<std::array<int, 2>>& inputs, int rank) : inputs_(inputs), rank_(rank) {}
  int64_t world_size() const override { return 2; }
  int64_t rank() const override { return rank_; }
  void all_reduce(torch::Tensor&, Reduce) override { ADD_FAILURE() << "the controller reduces numbers"; }
  std::vector<torch::Tensor> all_gather(const torch::Tensor& t) override { return {t, t}; }
  double all_reduce(double value, Reduce op) override {
    ++blocking;
    return all_reduce_async(value, op).wait();
  }
  ReduceWork all_reduce_async(double value, Reduce op) override {
    EXPECT_EQ(op, Reduce::kMax);
    const size_t k = started++;
    inputs_.resize(std::max(inputs_.size(), k + 1), {0, 0});
    inputs_[k][rank_] = static_cast<int>(value);
    std::vector<std::array<int, 2>>& inputs = inputs_;
    return ReduceWork([&inputs, k] { return static_cast<double>(std::max(inputs[k][0], inputs[k][1])); });
  }
  size_t started = 0;
  int blocking = 0;

 private:
  std::vector<std::array<int, 2>>& inputs_;
  int rank_;
};

TEST(StopController, ACallbackStopIsDecidedAtOnceOnOneProcess) {
  StopController stop;
  stop.propose_callback_stop(/*epoch=*/0, /*global_step=*/10, "val/loss stopped improving");
  EXPECT_FALSE(stop.should_stop()) << "a proposal is not a decision";
  stop.agree(local_collectives());
  EXPECT_TRUE(stop.should_stop());
  EXPECT_EQ(stop.code(), StopCode::kCallback);
  EXPECT_EQ(stop.reason(), StopReason::kCallback);
  EXPECT_EQ(stop.message(), "val/loss stopped improving");
}

TEST(StopController, MinEpochsHoldsOffCallbacksButNotSignals) {
  StopController stop(/*min_epochs=*/3);
  stop.propose_callback_stop(/*epoch=*/1, /*global_step=*/20, "early");
  stop.agree(local_collectives());
  EXPECT_FALSE(stop.should_stop());
  stop.propose_interrupt(StopCode::kInterrupt, "received signal 2");
  stop.agree(local_collectives());
  EXPECT_TRUE(stop.should_stop());
  EXPECT_EQ(stop.reason(), StopReason::kInterrupted);
}

TEST(StopController, MinStepsHoldsOffCallbacksUntilThatManyStepsAreTaken) {
  StopController stop(/*min_epochs=*/0, /*min_steps=*/100);
  stop.propose_callback_stop(/*epoch=*/3, /*global_step=*/99, "patience exhausted");
  stop.agree(local_collectives());
  EXPECT_FALSE(stop.should_stop()) << "one step short of min_steps";
  stop.propose_callback_stop(/*epoch=*/3, /*global_step=*/100, "patience exhausted");
  stop.agree(local_collectives());
  EXPECT_TRUE(stop.should_stop());
  EXPECT_EQ(stop.reason(), StopReason::kCallback);
  EXPECT_EQ(stop.message(), "patience exhausted");
}

TEST(StopController, MinEpochsAndMinStepsMustBothBeReached) {
  StopController steps_short(/*min_epochs=*/2, /*min_steps=*/50);
  steps_short.propose_callback_stop(/*epoch=*/4, /*global_step=*/49, "stop");
  steps_short.agree(local_collectives());
  EXPECT_FALSE(steps_short.should_stop()) << "epochs reached, steps not";
  StopController epochs_short(/*min_epochs=*/2, /*min_steps=*/50);
  epochs_short.propose_callback_stop(/*epoch=*/0, /*global_step=*/500, "stop");
  epochs_short.agree(local_collectives());
  EXPECT_FALSE(epochs_short.should_stop()) << "steps reached, epochs not";
  epochs_short.propose_interrupt(StopCode::kTerminate, "received signal 15");
  epochs_short.agree(local_collectives());
  EXPECT_TRUE(epochs_short.should_stop()) << "signals are not held off";
}

TEST(StopController, TheStrongestProposalAcrossProcessesWinsWithItsOwnWords) {
  StopController ranks[2];
  ranks[0].propose_callback_stop(0, 5, "patience exhausted");
  ranks[1].propose_interrupt(StopCode::kRequeue, "received SIGUSR1, SLURM's requeue signal");
  testing::run_ranks(2, [&ranks](int64_t rank, Collectives& collectives) { ranks[rank].agree(collectives); });
  EXPECT_EQ(ranks[0].code(), StopCode::kRequeue);
  EXPECT_EQ(ranks[1].code(), StopCode::kRequeue);
  EXPECT_EQ(ranks[0].reason(), StopReason::kRequeued);
  EXPECT_EQ(ranks[0].message(), "another process received SLURM's requeue signal");
  EXPECT_EQ(ranks[1].message(), "received SIGUSR1, SLURM's requeue signal");
}

TEST(StopController, AsyncAgreementActsOneStepLaterOnEveryProcess) {
  // Two processes; rank 1 receives SIGTERM during step 3. Each step boundary starts a reduction
  // (a collective: both inputs of a step are in before its result is read, at the next boundary).
  StopController ranks[2];
  std::vector<std::array<int, 2>> inputs;  // per step, per rank
  LockstepRank groups[2] = {LockstepRank(inputs, 0), LockstepRank(inputs, 1)};
  int stopped_at[2] = {-1, -1};
  for (int step = 0; step < 10 && (stopped_at[0] < 0 || stopped_at[1] < 0); ++step) {
    if (step == 3) ranks[1].propose_interrupt(StopCode::kTerminate, "received signal 15");
    for (int r = 0; r < 2; ++r) ranks[r].agree_async(groups[r]);
    for (int r = 0; r < 2; ++r)
      if (stopped_at[r] < 0 && ranks[r].should_stop()) stopped_at[r] = step;
  }
  EXPECT_EQ(stopped_at[0], stopped_at[1]) << "every process stops at the same step";
  EXPECT_EQ(stopped_at[0], 4) << "one step after the proposal, not at once and not never";
  EXPECT_EQ(groups[0].blocking, 0) << "no step waited for an agreement";
  EXPECT_EQ(ranks[0].reason(), StopReason::kInterrupted);
  EXPECT_EQ(ranks[0].message(), "another process received SIGTERM");
  EXPECT_EQ(ranks[1].message(), "received signal 15");
}

TEST(StopController, ABlockingAgreementAlsoSettlesTheReductionInFlight) {
  // One rank whose peer proposes nothing: inputs[k][1] stays 0.
  StopController stop;
  std::vector<std::array<int, 2>> inputs;
  LockstepRank group(inputs, 0);
  stop.propose_interrupt(StopCode::kInterrupt, "received signal 2");
  stop.agree_async(group);
  EXPECT_FALSE(stop.should_stop()) << "the async result is read at the next boundary";
  stop.agree(group);
  EXPECT_TRUE(stop.should_stop());
  EXPECT_EQ(group.started, 2u);  // the one in flight, then the blocking one
  EXPECT_EQ(group.blocking, 1);
}

TEST(StopController, ALimitStopsAtOnceAndACallbackCannotRenameIt) {
  StopController stop;
  stop.stop_at_limit(StopReason::kMaxSteps);
  EXPECT_TRUE(stop.should_stop());
  stop.propose_callback_stop(0, 5, "late");
  stop.agree(local_collectives());
  EXPECT_EQ(stop.reason(), StopReason::kMaxSteps);
  EXPECT_EQ(stop.code(), StopCode::kNone);
}

TEST(StopController, ARequeueAtTheLastStepBecomesANormalFinish) {
  StopController stop;
  stop.propose_interrupt(StopCode::kRequeue, "received SIGUSR1");
  stop.agree(local_collectives());
  ASSERT_EQ(stop.code(), StopCode::kRequeue);
  stop.finish_at(StopReason::kMaxEpochs);
  EXPECT_TRUE(stop.should_stop());
  EXPECT_EQ(stop.code(), StopCode::kNone) << "no HPC checkpoint, no requeue";
  EXPECT_EQ(stop.reason(), StopReason::kMaxEpochs);
  // The end-of-fit callbacks agree once more; the requeue proposal must not come back.
  stop.agree(local_collectives());
  EXPECT_EQ(stop.code(), StopCode::kNone);
  EXPECT_EQ(stop.reason(), StopReason::kMaxEpochs);
}

TEST(FitResult, ASupervisorsReportsSayTheWorkersRanTheFit) {
  FitResult result;
  result.reason = StopReason::kMaxEpochs;
  result.epochs_completed = 3;
  result.global_step = 30;
  EXPECT_EQ(result.brief_report().rfind("stopped: max_epochs after 3 epochs (30 steps)", 0), 0u);
  // A supervisor's result holds none of the workers' training: no zeros that read as a fit.
  FitResult supervisor;
  supervisor.supervised = true;
  supervisor.restarts = 1;
  supervisor.seconds = 12.3;
  const std::string said = "supervised: the worker processes ran the fit, with 1 restart, in 12.3 s";
  EXPECT_EQ(supervisor.brief_report().rfind(said, 0), 0u) << supervisor.brief_report();
  EXPECT_EQ(supervisor.full_report().rfind("Fit summary\n  " + said, 0), 0u) << supervisor.full_report();
  EXPECT_EQ(supervisor.full_report().find("global step"), std::string::npos);
}

}  // namespace
}  // namespace volt
