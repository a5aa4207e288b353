#include "volt/profiler/straggler.h"

#include <gtest/gtest.h>

#include "volt/core/testing.h"

namespace volt {
namespace {

/// A process whose step is `busy` seconds of work plus `wait`, all of the work in `slow_phase`'s
/// share where it is the slow one.
RankTiming timing(int64_t rank, double forward, double wait = 0.0, double data = 0.001) {
  RankTiming t;
  t.rank = rank;
  t.host = "node" + std::to_string(rank);
  t.steps = 50;
  t.data = data;
  t.forward = forward;
  t.backward = 0.004;
  t.optimizer = 0.001;
  t.wait = wait;
  t.step = t.data + t.forward + t.backward + t.optimizer + t.wait;
  return t;
}

TEST(StragglerDetector, NamesNoneWhenAllAreEqual) {
  StragglerDetector detector(0.2, 2);
  for (int check = 0; check < 5; ++check) {
    // Equal work, a little noise, and whoever is slightly faster waits a little.
    EXPECT_TRUE(detector.update({timing(0, 0.0030, 0.0002), timing(1, 0.0031), timing(2, 0.0030, 0.0001)}).empty());
  }
}

TEST(StragglerDetector, NamesTheSlowRankAndPhaseAfterPatienceChecks) {
  StragglerDetector detector(0.2, 2);
  // Rank 1's forward takes 3x; the others wait for it in the all-reduce, so their steps are as long.
  const std::vector<RankTiming> ranks = {timing(0, 0.003, 0.006), timing(1, 0.009), timing(2, 0.003, 0.006)};
  EXPECT_TRUE(detector.update(ranks).empty()) << "one slow check is not yet persistent";
  const std::vector<Straggler> named = detector.update(ranks);
  ASSERT_EQ(named.size(), 1u);
  EXPECT_EQ(named[0].rank, 1);
  EXPECT_EQ(named[0].host, "node1");
  EXPECT_EQ(named[0].phase, "forward");
  EXPECT_NEAR(named[0].phase_ratio, 3.0, 1e-9);
  EXPECT_NEAR(named[0].ratio, 0.015 / 0.009, 1e-9);
  EXPECT_EQ(named[0].windows, 2);
  const std::string text = describe(named[0]);
  EXPECT_NE(text.find("rank 1 on node1"), std::string::npos) << text;
  EXPECT_NE(text.find("forward"), std::string::npos) << text;
  // Recovered: named no more, and the count starts again.
  EXPECT_TRUE(detector.update({timing(0, 0.003), timing(1, 0.003), timing(2, 0.003)}).empty());
  EXPECT_TRUE(detector.update(ranks).empty());
}

TEST(StragglerDetector, TheThresholdDecidesWhetherARankThirtyPercentSlowerIsNamedAfterTwoChecksInARow) {
  // Busy times 0.010 s, 0.013 s, 0.010 s: rank 1 is 1.3x the others' median.
  const std::vector<RankTiming> ranks = {timing(0, 0.004, 0.003), timing(1, 0.007), timing(2, 0.004, 0.003)};
  for (const double threshold : {0.2, 0.5}) {
    // Patience 2, as the Trainer's (two checks in a row).
    StragglerDetector detector(threshold, 2);
    EXPECT_TRUE(detector.update(ranks).empty()) << "threshold " << threshold << ": one check is not persistent";
    const std::vector<Straggler> named = detector.update(ranks);
    if (threshold > 0.3) {
      EXPECT_TRUE(named.empty()) << "30% slower is within a threshold of " << threshold;
      continue;
    }
    ASSERT_EQ(named.size(), 1u);
    EXPECT_EQ(named[0].rank, 1);
    EXPECT_NEAR(named[0].ratio, 1.3, 1e-9);
    EXPECT_EQ(named[0].windows, 2);
  }
  // Two slow checks that are not in a row name nobody.
  StragglerDetector detector(0.2, 2);
  EXPECT_TRUE(detector.update(ranks).empty());
  EXPECT_TRUE(detector.update({timing(0, 0.004), timing(1, 0.004), timing(2, 0.004)}).empty());
  EXPECT_TRUE(detector.update(ranks).empty());
}

TEST(StragglerDetector, ComparesTwoProcessesWithEachOther) {
  // With two processes the median of both would hide a 1.3x straggler under a 20% threshold.
  StragglerDetector detector(0.2, 1);
  const std::vector<Straggler> named = detector.update({timing(0, 0.003, 0.0, /*data=*/0.004), timing(1, 0.003)});
  ASSERT_EQ(named.size(), 1u);
  EXPECT_EQ(named[0].rank, 0);
  EXPECT_EQ(named[0].phase, "data");
}

TEST(StragglerDetector, SkipsAWindowWithoutStepsAndOneProcess) {
  StragglerDetector detector(0.2, 1);
  RankTiming idle = timing(1, 0.009);
  idle.steps = 0;
  EXPECT_TRUE(detector.update({timing(0, 0.003), idle}).empty());
  EXPECT_TRUE(detector.update({timing(0, 0.003)}).empty());
}

TEST(StragglerDetector, RefusesANonsenseThreshold) {
  const std::string message = testing::error_message([] { StragglerDetector(0.0, 1); });
  EXPECT_NE(message.find("threshold=0"), std::string::npos) << message;
}

TEST(RankTiming, IsMadeFromAWindowAndSurvivesTheExchange) {
  ProfileStats window;
  window[Action::kTrainStep] = {4, 0.040, 0.01, 0.01};
  window[Action::kGradSync] = {4, 0.008, 0.002, 0.002};
  window[Action::kDataFetch] = {4, 0.004, 0.001, 0.001};
  window[Action::kTransfer] = {4, 0.004, 0.001, 0.001};
  window[Action::kForward] = {4, 0.012, 0.003, 0.003};
  const RankTiming t = rank_timing(window, 3, "gpu-node-12");
  EXPECT_EQ(t.steps, 4);
  EXPECT_DOUBLE_EQ(t.step, 0.010);
  EXPECT_DOUBLE_EQ(t.wait, 0.002);
  EXPECT_DOUBLE_EQ(t.data, 0.002);
  EXPECT_DOUBLE_EQ(t.busy(), 0.008);
  const RankTiming back = decode_rank_timing(encode_rank_timing(t));
  EXPECT_EQ(back.rank, 3);
  EXPECT_EQ(back.host, "gpu-node-12");
  EXPECT_DOUBLE_EQ(back.forward, t.forward);
  EXPECT_NE(testing::error_message([] { decode_rank_timing("zero"); }).find("HINT:"), std::string::npos);
}

}  // namespace
}  // namespace volt
