#include "volt/environments/requeue.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "volt/core/error.h"
#include "volt/core/testing.h"

namespace volt {
namespace {

Env::Vars batch_job() {
  return {{"SLURM_JOB_ID", "4242"}, {"SLURM_JOB_NAME", "train"}, {"SLURM_NTASKS", "1"}, {"SLURM_PROCID", "0"}};
}

TEST(RequeuePolicy, ASlurmBatchJobRequeuesItselfOnSigusr1ByDefault) {
  const RequeuePolicy policy = resolve_requeue_policy(Env(batch_job()), true, SIGUSR1, true);
  EXPECT_TRUE(policy.enabled);
  EXPECT_EQ(policy.signal, SIGUSR1);
  EXPECT_EQ(policy.job_id, "4242");
  EXPECT_TRUE(policy.checkpoint_on_sigterm);
  EXPECT_EQ(policy.disabled_reason, "");
}

TEST(RequeuePolicy, AnArrayTaskRequeuesItsOwnTaskNotTheWholeArray) {
  auto vars = batch_job();
  vars["SLURM_ARRAY_JOB_ID"] = "4200";
  vars["SLURM_ARRAY_TASK_ID"] = "7";
  EXPECT_EQ(resolve_requeue_policy(Env(vars), true, SIGUSR1, true).job_id, "4200_7");
}

TEST(RequeuePolicy, NothingIsRequeuedOutsideSlurm) {
  const RequeuePolicy policy = resolve_requeue_policy(Env(Env::Vars{{"HOME", "/root"}}), true, SIGUSR1, true);
  EXPECT_FALSE(policy.enabled);
  EXPECT_FALSE(policy.checkpoint_on_sigterm);
  EXPECT_EQ(policy.disabled_reason, "not a SLURM job");
}

TEST(RequeuePolicy, NothingIsRequeuedInInteractiveAllocations) {
  for (const char* name : {"bash", "interactive"}) {
    auto vars = batch_job();
    vars["SLURM_JOB_NAME"] = name;
    const RequeuePolicy policy = resolve_requeue_policy(Env(vars), true, SIGUSR1, true);
    EXPECT_FALSE(policy.enabled) << name;
    EXPECT_FALSE(policy.checkpoint_on_sigterm) << name;
    EXPECT_EQ(policy.disabled_reason, "interactive SLURM allocation");
  }
}

TEST(RequeuePolicy, TurningAutoRequeueOffKeepsTheSigtermCheckpoint) {
  const RequeuePolicy policy = resolve_requeue_policy(Env(batch_job()), false, SIGUSR1, true);
  EXPECT_FALSE(policy.enabled);
  EXPECT_EQ(policy.disabled_reason, "auto_requeue=false");
  EXPECT_TRUE(policy.checkpoint_on_sigterm);
  EXPECT_FALSE(resolve_requeue_policy(Env(batch_job()), true, SIGUSR1, false).checkpoint_on_sigterm);
}

TEST(RequeueSignal, NamesTheSignalsAJobRequeuesOrStopsOn) {
  EXPECT_EQ(signal_name(SIGUSR2), "SIGUSR2");
  EXPECT_EQ(signal_name(SIGTERM), "SIGTERM");
  EXPECT_EQ(signal_name(SIGKILL), "signal " + std::to_string(SIGKILL));
}

/// Puts a fake `scontrol` first on PATH for one test.
class FakeScontrol : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("volt-scontrol-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    old_path_ = getenv("PATH");
    setenv("PATH", (dir_.string() + ":" + old_path_).c_str(), 1);
  }
  void TearDown() override {
    setenv("PATH", old_path_.c_str(), 1);
    std::filesystem::remove_all(dir_);
  }
  void write_scontrol(const std::string& body) {
    const auto path = dir_ / "scontrol";
    std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
    std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  }
  std::filesystem::path dir_;
  std::string old_path_;
};

TEST_F(FakeScontrol, RequeueRunsScontrolWithTheJobId) {
  write_scontrol("echo \"$@\" > " + (dir_ / "args").string());
  const RequeueOutcome outcome = requeue_slurm_job("4200_7");
  EXPECT_TRUE(outcome.ok) << outcome.output;
  EXPECT_EQ(outcome.command, "scontrol requeue 4200_7");
  std::ifstream args(dir_ / "args");
  std::string line;
  std::getline(args, line);
  EXPECT_EQ(line, "requeue 4200_7");
}

TEST_F(FakeScontrol, AFailedRequeueReportsScontrolsOwnWords) {
  write_scontrol("echo 'scontrol: error: Requested operation is presently disabled for job 13' >&2; exit 1");
  const RequeueOutcome outcome = requeue_slurm_job("13");
  EXPECT_FALSE(outcome.ok);
  EXPECT_EQ(outcome.output, "scontrol: error: Requested operation is presently disabled for job 13");
}

TEST_F(FakeScontrol, AScontrolThatHangsIsKilledAtTheDeadline) {
  write_scontrol("exec sleep 30");
  const auto start = std::chrono::steady_clock::now();
  const RequeueOutcome outcome = requeue_slurm_job("13", std::chrono::seconds(1));
  EXPECT_FALSE(outcome.ok);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_NE(outcome.output.find("no answer within 1 s"), std::string::npos) << outcome.output;
}

}  // namespace
}  // namespace volt
