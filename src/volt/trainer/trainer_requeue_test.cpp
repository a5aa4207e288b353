// SLURM auto-requeue through the Trainer: requeue signals mid-epoch, HPC checkpoints, SIGTERM,
// a failing scontrol, and no handler outside SLURM (with a fake scontrol on PATH).
#include <gtest/gtest.h>

#include "volt/trainer/trainer_testing.h"

namespace volt {
namespace {

using namespace volt::trainer_testing;  // NOLINT: the shared fixture and helpers
namespace fs = std::filesystem;

class RequeueTest : public TrainerTest {
 protected:
  void SetUp() override {
    TrainerTest::SetUp();
    fs::create_directories(bin_dir());
    write_scontrol("echo \"$@\" >> " + (root_ / "scontrol.log").string());
    old_path_ = getenv("PATH");
    setenv("PATH", (bin_dir().string() + ":" + old_path_).c_str(), 1);
    sigaction(SIGTERM, nullptr, &sigterm_before_);
  }
  void TearDown() override {
    setenv("PATH", old_path_.c_str(), 1);
    sigaction(SIGTERM, &sigterm_before_, nullptr);  // a requeue leaves SIGTERM ignored
    TrainerTest::TearDown();
  }
  fs::path bin_dir() const { return root_ / "bin"; }
  void write_scontrol(const std::string& body) const {
    std::ofstream(bin_dir() / "scontrol") << "#!/bin/sh\n" << body << "\n";
    fs::permissions(bin_dir() / "scontrol", fs::perms::owner_all);
  }
  /// What the fake scontrol was asked, one call per line.
  std::string scontrol_calls() const {
    std::ifstream in(root_ / "scontrol.log");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  static Env slurm_env(int restarts) {
    Env::Vars vars{{"SLURM_JOB_ID", "77"},          {"SLURM_ARRAY_JOB_ID", "70"}, {"SLURM_ARRAY_TASK_ID", "7"},
                   {"SLURM_JOB_NAME", "train"},     {"SLURM_NTASKS", "1"},        {"SLURM_PROCID", "0"},
                   {"SLURM_LOCALID", "0"},          {"SLURM_NODEID", "0"},        {"SLURM_NNODES", "1"},
                   {"SLURM_JOB_NODELIST", "node1"}, {"SLURM_STEP_ID", "0"}};
    if (restarts > 0) vars["SLURM_RESTART_COUNT"] = std::to_string(restarts);
    return Env(vars);
  }
  /// One run of the job: a fresh module and Trainer. Restarts draw other initial weights, which
  /// the HPC checkpoint must replace.
  FitResult run_job(TinyOptions module_options, TrainerOptions options, int restarts,
                    std::map<std::string, torch::Tensor>* parameters = nullptr, const std::string& ckpt = "") {
    auto module = make_module(module_options, /*init_seed=*/restarts == 0 ? 7 : 100 + restarts);
    Trainer trainer(quiet(std::move(options)), slurm_env(restarts), MachineInfo{1, "/tmp"});
    const FitResult result = trainer.fit(*module, {}, {}, ckpt);
    if (parameters) *parameters = parameters_of(*module);
    return result;
  }

  std::string old_path_;
  struct sigaction sigterm_before_ {};
};

TEST_F(RequeueTest, TwoRequeuesMidEpochEndBitIdenticalToAnUninterruptedRun) {
  const TinyOptions base{
      .train_size = 40, .dropout = 0.3, .optimizer = Optim::kAdam, .lr = 0.01, .scheduler = Interval::kEpoch};
  const TrainerOptions options{.max_epochs = 2, .seed = 1, .hpc_checkpoints_to_keep = 1};
  auto straight_module = make_module(base);
  make_trainer({.max_epochs = 2, .seed = 1, .enable_checkpointing = false}).fit(*straight_module);

  // Run 1: the signal arrives during batch 3 of epoch 0.
  TinyOptions first = base;
  first.signal_at_batch = 3;
  const FitResult one = run_job(first, options, 0);
  EXPECT_EQ(one.reason, StopReason::kRequeued);
  EXPECT_TRUE(one.requeued());
  EXPECT_EQ(one.global_step, 4) << "the signalled step completes, then the run stops";
  EXPECT_EQ(one.hpc_checkpoint_path, (root_ / "hpc_ckpt_1.ckpt").string());
  EXPECT_EQ(scontrol_calls(), "requeue 70_7\n") << "an array task requeues itself, not the whole array";

  // Run 2 (SLURM_RESTART_COUNT=1) resumes there, and is signalled again at batch 6 of epoch 0.
  TinyOptions second = base;
  second.signal_at_batch = 6;
  const FitResult two = run_job(second, options, 1);
  EXPECT_EQ(two.resumed_from, one.hpc_checkpoint_path);
  EXPECT_EQ(two.reason, StopReason::kRequeued);
  EXPECT_EQ(two.global_step, 7);
  EXPECT_EQ(two.hpc_checkpoint_path, (root_ / "hpc_ckpt_2.ckpt").string());
  EXPECT_FALSE(fs::exists(root_ / "hpc_ckpt_1.ckpt")) << "hpc_checkpoints_to_keep=1 prunes the older one";

  // Run 3 runs to the end; the job script's ckpt_path loses to the HPC checkpoint.
  std::map<std::string, torch::Tensor> resumed;
  const FitResult three = run_job(base, options, 2, &resumed, "last");
  EXPECT_EQ(three.resumed_from, two.hpc_checkpoint_path);
  EXPECT_EQ(three.reason, StopReason::kMaxEpochs);
  EXPECT_EQ(three.global_step, 20);
  EXPECT_EQ(scontrol_calls(), "requeue 70_7\nrequeue 70_7\n");
  EXPECT_TRUE(bit_identical(resumed, parameters_of(*straight_module)));
}

TEST_F(RequeueTest, HpcCheckpointDirHoldsTheHpcCheckpointAndTheRestartResumesFromThere) {
  const fs::path dir = root_ / "elsewhere" / "hpc";
  const TrainerOptions options{.max_epochs = 1, .seed = 1, .hpc_checkpoint_dir = dir.string()};
  TinyOptions first{.train_size = 16};
  first.signal_at_batch = 1;
  const FitResult one = run_job(first, options, 0);
  EXPECT_EQ(one.reason, StopReason::kRequeued);
  EXPECT_EQ(one.hpc_checkpoint_path, (dir / "hpc_ckpt_1.ckpt").string());
  EXPECT_TRUE(fs::exists(one.hpc_checkpoint_path));
  EXPECT_TRUE(list_hpc_checkpoints(root_.string()).empty()) << "nothing in the root dir";

  // The restart looks in the same folder (none in the root dir to find instead).
  const FitResult two = run_job({.train_size = 16}, options, 1);
  EXPECT_EQ(two.resumed_from, one.hpc_checkpoint_path);
  EXPECT_EQ(two.reason, StopReason::kMaxEpochs);
  EXPECT_EQ(two.global_step, 4);
}

TEST_F(RequeueTest, AnHpcCheckpointIsNumberedAfterTheSnapshotsAndTheRestartResumesFromIt) {
  TrainerOptions options{.max_epochs = 1, .seed = 1};
  options.snapshot_every_n_steps = 2;
  TinyOptions first{.train_size = 40};
  first.signal_at_batch = 4;  // stops after step 5: snapshots at steps 2 and 4 came first
  const FitResult one = run_job(first, options, 0);
  EXPECT_EQ(one.reason, StopReason::kRequeued);
  EXPECT_EQ(one.snapshots.saved, 2);
  EXPECT_EQ(one.hpc_checkpoint_path, (root_ / "hpc_ckpt_3.ckpt").string());
  const FitResult two = run_job({.train_size = 40}, options, 1);
  EXPECT_EQ(two.resumed_from, one.hpc_checkpoint_path) << "the newest of either kind";
  EXPECT_EQ(two.global_step, 10);
  EXPECT_EQ(list_snapshots(root_.string()),
            (std::vector<std::string>{(root_ / "snapshot_6.ckpt").string(), (root_ / "snapshot_5.ckpt").string()}))
      << "steps 6, 8 and 10 continue the sequence (numbers 4 to 6)";
}

TEST_F(RequeueTest, ASignalDuringTheLastStepFinishesTheRunInsteadOfRequeueing) {
  TinyOptions last{.train_size = 16};
  last.signal_at_batch = 3;  // the 4th and last batch of the only epoch
  const FitResult result = run_job(last, {.max_epochs = 1}, 0);
  EXPECT_EQ(result.reason, StopReason::kMaxEpochs);
  EXPECT_EQ(result.global_step, 4);
  EXPECT_EQ(result.hpc_checkpoint_path, "");
  EXPECT_EQ(scontrol_calls(), "");
  // A signal one step earlier still requeues.
  last.signal_at_batch = 2;
  EXPECT_EQ(run_job(last, {.max_epochs = 1}, 0).reason, StopReason::kRequeued);
}

TEST_F(RequeueTest, AFirstRunWithoutHpcCheckpointsStartsFresh) {
  const FitResult result = run_job({}, {.max_epochs = 1}, 0);
  EXPECT_EQ(result.resumed_from, "");
  EXPECT_EQ(result.reason, StopReason::kMaxEpochs);
  EXPECT_EQ(scontrol_calls(), "");
}

TEST_F(RequeueTest, ATruncatedNewestHpcCheckpointFallsBackToThePreviousWithAWarning) {
  TinyOptions signalled{.train_size = 40};
  signalled.signal_at_batch = 2;
  const FitResult one = run_job(signalled, {.max_epochs = 1, .seed = 1}, 0);
  ASSERT_EQ(one.hpc_checkpoint_path, (root_ / "hpc_ckpt_1.ckpt").string());
  // A newer file cut in half, as a full disk or an interrupted copy leaves it.
  const auto size = fs::file_size(one.hpc_checkpoint_path);
  fs::copy_file(one.hpc_checkpoint_path, root_ / "hpc_ckpt_2.ckpt");
  fs::resize_file(root_ / "hpc_ckpt_2.ckpt", size / 2);

  ::testing::internal::CaptureStderr();
  const FitResult two = run_job({.train_size = 40}, {.max_epochs = 1, .seed = 1}, 1);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(two.resumed_from, one.hpc_checkpoint_path);
  EXPECT_EQ(two.global_step, 10);
  EXPECT_NE(err.find("warning: HPC checkpoint " + (root_ / "hpc_ckpt_2.ckpt").string() + " is unreadable"),
            std::string::npos)
      << err;
}

TEST_F(RequeueTest, SigtermUnderSlurmSavesAnHpcCheckpointWithoutRequeueing) {
  TinyOptions terminated{.train_size = 40};
  terminated.signal_at_batch = 3;
  terminated.signal = SIGTERM;
  const FitResult result = run_job(terminated, {.max_epochs = 2, .seed = 1}, 0);
  EXPECT_EQ(result.reason, StopReason::kInterrupted);
  EXPECT_EQ(result.global_step, 4);
  EXPECT_EQ(result.hpc_checkpoint_path, (root_ / "hpc_ckpt_1.ckpt").string());
  EXPECT_EQ(scontrol_calls(), "") << "SLURM requeues a preempted job by its own policy";
  struct sigaction now {};
  sigaction(SIGTERM, nullptr, &now);
  EXPECT_EQ(now.sa_handler, sigterm_before_.sa_handler) << "fit restores the SIGTERM handler";

  // Without checkpoint_on_sigterm the run just stops.
  fs::remove(result.hpc_checkpoint_path);
  const FitResult bare = run_job(terminated, {.max_epochs = 2, .seed = 1, .checkpoint_on_sigterm = false}, 0);
  EXPECT_EQ(bare.reason, StopReason::kInterrupted);
  EXPECT_EQ(bare.hpc_checkpoint_path, "");
  EXPECT_TRUE(list_hpc_checkpoints(root_.string()).empty());
}

TEST_F(RequeueTest, AFailedRequeueKeepsTheCheckpointAndSaysHowToResume) {
  write_scontrol("echo 'scontrol: error: Requested operation is presently disabled for job 70_7' >&2; exit 1");
  TinyOptions signalled{.train_size = 40};
  signalled.signal_at_batch = 1;
  ::testing::internal::CaptureStderr();
  const FitResult result = run_job(signalled, {.max_epochs = 1}, 0);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(result.reason, StopReason::kInterrupted);
  EXPECT_NE(result.message.find("presently disabled"), std::string::npos) << result.message;
  EXPECT_TRUE(fs::exists(result.hpc_checkpoint_path));
  EXPECT_NE(err.find("HINT: allow requeueing (#SBATCH --requeue)"), std::string::npos) << err;
}

TEST_F(RequeueTest, OutsideSlurmTheRequeueSignalIsLeftAlone) {
  struct sigaction before {};
  sigaction(SIGUSR1, nullptr, &before);
  Trainer trainer = make_trainer({.max_epochs = 1});
  EXPECT_FALSE(trainer.plan().requeue.enabled);
  struct sigaction during {};
  sigaction(SIGUSR1, nullptr, &during);
  EXPECT_EQ(during.sa_handler, before.sa_handler) << "no handler is installed outside SLURM";
  {
    Trainer in_slurm(quiet({}), slurm_env(0), MachineInfo{1, "/tmp"});
    sigaction(SIGUSR1, nullptr, &during);
    EXPECT_NE(during.sa_handler, before.sa_handler) << "a SLURM batch job catches it from construction on";
  }
  sigaction(SIGUSR1, nullptr, &during);
  EXPECT_EQ(during.sa_handler, before.sa_handler) << "and gives it back with the Trainer";
}

}  // namespace
}  // namespace volt
