#include "sweep_status.h"

#include <gtest/gtest.h>

namespace volt::tool {
namespace {

TEST(ParseSqueue, ReadsOneJobPerLineAndExpandsPendingRanges) {
  const auto states = parse_squeue("123_0 RUNNING\n123_[2-3%2] PENDING\n  \n99 COMPLETING\n");
  EXPECT_EQ(states.at("123_0"), "RUNNING");
  EXPECT_EQ(states.at("123_2"), "PENDING");
  EXPECT_EQ(states.at("123_3"), "PENDING");
  EXPECT_EQ(states.at("99"), "COMPLETING");
  EXPECT_EQ(states.count("123_1"), 0u);
}

TEST(ParseScontrolState, FindsJobState) {
  EXPECT_EQ(parse_scontrol_state("JobId=124 ArrayJobId=123 ArrayTaskId=1 JobName=lr JobState=COMPLETED "
                                 "Reason=None"),
            "COMPLETED");
  EXPECT_EQ(parse_scontrol_state("slurm_load_jobs error: Invalid job id specified"), std::nullopt);
}

TEST(TrialState, SqueueThenScontrolThenAccountingThenTheTrialDirectory) {
  EXPECT_EQ(trial_state("RUNNING", "COMPLETED", true), "RUNNING");
  EXPECT_EQ(trial_state(std::nullopt, "FAILED", true), "FAILED");
  // Forgotten by the controller, still in accounting: a failed trial with files is not "done".
  EXPECT_EQ(trial_state(std::nullopt, std::nullopt, true, "FAILED"), "FAILED");
  EXPECT_EQ(trial_state(std::nullopt, std::nullopt, true), "ended?");
  EXPECT_EQ(trial_state(std::nullopt, std::nullopt, false), "unknown");
}

TEST(TrialState, SacctsStateIsItsFirstWord) {
  EXPECT_EQ(parse_sacct_state("FAILED\n"), "FAILED");
  EXPECT_EQ(parse_sacct_state("CANCELLED by 0\n"), "CANCELLED");
  EXPECT_EQ(parse_sacct_state(""), std::nullopt);
}

TEST(RenderStatus, OneAlignedLinePerTrial) {
  const std::string table =
      render_status({{{0, {{"lr", "0.1"}}}, "123_0", "RUNNING"}, {{1, {{"lr", "0.01"}}}, "123_1", "done"}});
  EXPECT_EQ(table,
            "trial  job_id  state    values\n"
            "0      123_0   RUNNING  lr=0.1\n"
            "1      123_1   done     lr=0.01\n");
}

}  // namespace
}  // namespace volt::tool
