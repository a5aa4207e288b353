#include "volt/slurm/job_check.h"

#include <gtest/gtest.h>

namespace volt::slurm {
namespace {

using Problems = std::vector<std::string>;

/// A two-node, four-GPU job and the Trainer it fits.
JobSpec fitting_job() {
  JobSpec spec;
  spec.nodes = 2;
  spec.ntasks_per_node = 4;
  spec.gpus_per_node = 4;
  spec.time = "04:00:00";
  spec.command = {"./train"};
  return spec;
}

const TrainerShape kShape{4, 2, true, true};

TEST(TrainerShape, DefaultsArePinned) {
  const TrainerShape shape;
  EXPECT_EQ(shape.devices, 1);
  EXPECT_EQ(shape.num_nodes, 1);
  EXPECT_FALSE(shape.uses_gpus);
  EXPECT_TRUE(shape.auto_requeue);
  EXPECT_EQ(shape.requeue_signal, "USR1");
  EXPECT_FALSE(shape.processes_per_node.has_value());
  EXPECT_EQ(shape.strategy, "");
}

TEST(JobCheck, AFittingJobHasNoProblems) {
  EXPECT_EQ(check_job_against_trainer(fitting_job(), kShape), Problems{});
  // The default JobSpec fits the default (CPU, one process) Trainer once it has a time limit.
  JobSpec spec;
  spec.time = "10";
  EXPECT_EQ(check_job_against_trainer(spec, TrainerShape{}), Problems{});
}

TEST(JobCheck, NodesMustMatchNumNodes) {
  JobSpec spec = fitting_job();
  spec.nodes = 1;
  EXPECT_EQ(
      check_job_against_trainer(spec, kShape),
      Problems{
          "the job asks for --nodes=1 but the Trainer runs num_nodes=2. HINT: set nodes=2 (volt slurm: --nodes) or "
          "num_nodes=1."});
}

TEST(JobCheck, TasksPerNodeMustMatchDevices) {
  JobSpec spec = fitting_job();
  spec.ntasks_per_node = 2;
  EXPECT_EQ(check_job_against_trainer(spec, kShape),
            Problems{"the job asks for --ntasks-per-node=2 but the Trainer runs devices=4 per node. HINT: set "
                     "ntasks_per_node=4 (volt slurm: --ntasks-per-node) or devices=2."});
}

TEST(JobCheck, OneProcessPerNodeDrivesTheNodesDevicesUnderDdp2) {
  TrainerShape shape{2, 2, true, true};
  shape.processes_per_node = 1;
  shape.strategy = "ddp2";
  JobSpec spec = fitting_job();
  spec.ntasks_per_node = 1;
  spec.gpus_per_node = 2;
  EXPECT_EQ(check_job_against_trainer(spec, shape), Problems{});
  spec.ntasks_per_node = 2;
  EXPECT_EQ(
      check_job_against_trainer(spec, shape),
      Problems{"the job asks for --ntasks-per-node=2 but the Trainer runs 1 process per node (strategy=ddp2), "
               "which drives the node's devices=2. HINT: set ntasks_per_node=1 (volt slurm: --ntasks-per-node)."});
}

TEST(JobCheck, GpusPerNodeMustCoverDevicesWhenTheTrainerUsesGpus) {
  JobSpec spec = fitting_job();
  spec.gpus_per_node = 2;
  EXPECT_EQ(check_job_against_trainer(spec, kShape),
            Problems{"the job asks for 2 GPUs per node (--gres=gpu:2) but the Trainer uses devices=4 GPUs per node. "
                     "HINT: set gpus_per_node=4 (volt slurm: --gpus-per-node) or devices=2."});
  spec.gpus_per_node = 8;  // more than needed is allowed (a whole node)
  EXPECT_EQ(check_job_against_trainer(spec, kShape), Problems{});
}

TEST(JobCheck, GpusReservedForACpuTrainerAreAProblem) {
  TrainerShape shape = kShape;
  shape.uses_gpus = false;
  const Problems problems = check_job_against_trainer(fitting_job(), shape);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].rfind("the job reserves 4 GPUs per node but the Trainer runs on CPUs. HINT:", 0), 0u);
}

TEST(JobCheck, AutoRequeueNeedsASignal) {
  JobSpec spec = fitting_job();
  spec.signal = "";
  const Problems problems = check_job_against_trainer(spec, kShape);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].rfind("the Trainer requeues itself on SIGUSR1 (auto_requeue) but the job asks SLURM for no "
                              "signal",
                              0),
            0u);
  EXPECT_NE(problems[0].find("HINT: set signal=\"USR1\" and signal_lead_seconds=90"), std::string::npos);
  spec.signal = "USR1";
  spec.signal_lead_seconds = 0;
  EXPECT_EQ(check_job_against_trainer(spec, kShape), problems);
}

TEST(JobCheck, AutoRequeueNeedsTheSignalItListensFor) {
  JobSpec spec = fitting_job();
  spec.signal = "TERM";
  EXPECT_EQ(check_job_against_trainer(spec, kShape),
            Problems{"the job sends --signal=TERM@90 but the Trainer's auto_requeue listens for USR1. HINT: set "
                     "signal=\"USR1\"."});
}

TEST(JobCheck, SignalGoesToTheSrunStepsNotOnlyTheBatchShell) {
  JobSpec spec = fitting_job();
  spec.signal_to_batch_shell_only = true;
  const Problems problems = check_job_against_trainer(spec, kShape);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].rfind("the job sends --signal=B:USR1@90, which reaches only the batch shell", 0), 0u);
  EXPECT_NE(problems[0].find("HINT: set signal_to_batch_shell_only=false (volt slurm: leave out --signal-batch-only)."),
            std::string::npos);
}

TEST(JobCheck, AutoRequeueNeedsRequeueAllowed) {
  JobSpec spec = fitting_job();
  spec.requeue = false;
  const Problems problems = check_job_against_trainer(spec, kShape);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].rfind("the job sets requeue=false but the Trainer requeues it", 0), 0u);
  EXPECT_NE(problems[0].find("HINT: set requeue=true"), std::string::npos);
}

TEST(JobCheck, AutoRequeueNeedsATimeLimit) {
  JobSpec spec = fitting_job();
  spec.time = "";
  const Problems problems = check_job_against_trainer(spec, kShape);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].rfind("the job sets no --time but the Trainer's auto_requeue", 0), 0u);
  EXPECT_NE(problems[0].find("HINT: set time"), std::string::npos);
}

TEST(JobCheck, WithoutAutoRequeueTheSignalAndTimeAreFree) {
  JobSpec spec = fitting_job();
  spec.signal = "";
  spec.signal_to_batch_shell_only = true;
  spec.requeue = false;
  spec.time = "";
  TrainerShape shape = kShape;
  shape.auto_requeue = false;
  EXPECT_EQ(check_job_against_trainer(spec, shape), Problems{});
}

TEST(JobCheck, EveryMismatchIsReported) {
  JobSpec spec = fitting_job();
  spec.nodes = 3;
  spec.ntasks_per_node = 1;
  spec.requeue = false;
  EXPECT_EQ(check_job_against_trainer(spec, kShape).size(), 3u);
}

}  // namespace
}  // namespace volt::slurm
