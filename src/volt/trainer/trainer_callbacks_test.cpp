// Callbacks that end a fit early and leave a checkpoint to resume from: Timer (and the max_time
// option), ModelCheckpoint's last.ckpt at a stop inside an epoch, and OnExceptionCheckpoint. Each
// resumed run must end bit-identical to one that never stopped.
#include <gtest/gtest.h>

#include <stdexcept>

#include "volt/callbacks/gradient_accumulation_scheduler.h"
#include "volt/callbacks/on_exception_checkpoint.h"
#include "volt/callbacks/timer.h"
#include "volt/core/console.h"
#include "volt/core/strings.h"
#include "volt/trainer/trainer_testing.h"

namespace volt {
namespace {

using namespace volt::trainer_testing;  // NOLINT: the shared fixture and helpers
namespace fs = std::filesystem;

class EarlyEndTest : public TrainerTest {
 protected:
  /// Fits a fresh TinyModule (4 batches an epoch) for `options`; keeps its parameters.
  FitResult fit(TrainerOptions options, const std::string& ckpt_path = "", uint64_t init_seed = 7,
                std::unique_ptr<TinyModule> module = nullptr) {
    if (!module) module = make_module({}, init_seed);
    options.seed = 1;
    Trainer trainer = make_trainer(std::move(options));
    trainer.set_checkpoint_io(io_);
    trainer.set_console(console_);
    const FitResult result = trainer.fit(*module, {}, {}, ckpt_path);
    parameters_ = parameters_of(*module);
    return result;
  }

  /// Whether the console said `line`.
  bool said(const std::string& line) const {
    return std::find(console_->infos.begin(), console_->infos.end(), line) != console_->infos.end();
  }

  std::shared_ptr<InMemoryCheckpointIO> io_ = std::make_shared<InMemoryCheckpointIO>();
  std::shared_ptr<RecordingConsole> console_ = std::make_shared<RecordingConsole>();
  std::map<std::string, torch::Tensor> parameters_;
};

TEST_F(EarlyEndTest, ATimerStopsAtTheFirstStepPastItsDurationAndTheRunResumesFromLastBitIdentical) {
  fit({.max_epochs = 2, .enable_checkpointing = false});
  const auto straight = parameters_;

  // One second per clock reading: the train start reads 0, the end of batch k reads k.
  int64_t readings = 0;
  auto timer = std::make_shared<Timer>(TimerOptions{.duration = std::chrono::duration<double>(5.5)}, [&readings] {
    return std::chrono::steady_clock::time_point(std::chrono::seconds(readings++));
  });
  const FitResult stopped = fit({.max_epochs = 2, .callbacks = {timer}, .enable_checkpointing = false});
  EXPECT_EQ(stopped.reason, StopReason::kCallback);
  EXPECT_EQ(stopped.global_step, 6);  // 6 s >= 5.5 s; 5 s was not
  EXPECT_NE(stopped.message.find("Time limit reached"), std::string::npos) << stopped.message;
  const std::string last = (root_ / "checkpoints" / "last.ckpt").string();
  ASSERT_EQ(timer->checkpoint_path(), last);
  ASSERT_TRUE(io_->exists(last));
  EXPECT_EQ(load_dict(*io_, last).at("global_step").toInt(), 6);

  // The file is last.ckpt, which ckpt_path="last" takes first on disk (the in-memory IO here has no
  // folder to search), so the test resumes from its path.
  const FitResult resumed = fit({.max_epochs = 2, .enable_checkpointing = false}, last, /*init_seed=*/99);
  EXPECT_EQ(resumed.resumed_from, last);
  EXPECT_EQ(resumed.global_step, 8);
  EXPECT_TRUE(bit_identical(parameters_, straight));
}

TEST_F(EarlyEndTest, MaxTimeAddsATimerThatStopsWithinOneStep) {
  const FitResult result = fit({.max_epochs = 2, .max_time = std::chrono::duration<double>(1e-6)});
  EXPECT_EQ(result.reason, StopReason::kCallback);
  EXPECT_EQ(result.global_step, 1);  // the first check is after the first step
  EXPECT_TRUE(io_->exists((root_ / "checkpoints" / "last.ckpt").string()));
}

TEST_F(EarlyEndTest, ATimerCallbackWinsOverMaxTime) {
  auto timer = std::make_shared<Timer>(TimerOptions{.duration = std::chrono::hours(1)});
  const FitResult result = fit({.max_epochs = 2,
                                .max_time = std::chrono::duration<double>(1e-6),
                                .callbacks = {timer},
                                .enable_checkpointing = false});
  EXPECT_EQ(result.reason, StopReason::kMaxEpochs);
  EXPECT_EQ(result.global_step, 8);
  EXPECT_GT(timer->time_elapsed(), 0.0);
}

// ---- ModelCheckpoint(save_last) at a stop inside an epoch ------------------------------------------

std::shared_ptr<ModelCheckpoint> saving_last() {
  return std::make_shared<ModelCheckpoint>(ModelCheckpointOptions{.save_last = true});
}

TEST_F(EarlyEndTest, MaxStepsInsideAnEpochLeavesLastCkptAtThatStepAndTheRunResumesFromItBitIdentical) {
  fit({.max_epochs = 2, .enable_checkpointing = false});
  const auto straight = parameters_;

  // Validation saves at epoch 0's end (step 4); max_steps stops 2 batches into epoch 1.
  const FitResult stopped = fit({.max_epochs = 2, .max_steps = 6, .callbacks = {saving_last()}});
  const std::string last = (root_ / "checkpoints" / "last.ckpt").string();
  ASSERT_EQ(stopped.last_model_path, last);
  EXPECT_EQ(stopped.global_step, 6);
  EXPECT_EQ(load_dict(*io_, last).at("global_step").toInt(), 6) << "not epoch 0's end, which the fit summary hides";
  EXPECT_TRUE(said("Saved " + last + " at epoch 1 after 2 batches, global step 6")) << join(console_->infos, "\n");

  const FitResult resumed = fit({.max_epochs = 2, .enable_checkpointing = false}, last, /*init_seed=*/99);
  EXPECT_EQ(resumed.resumed_from, last);
  EXPECT_EQ(resumed.global_step, 8);
  EXPECT_TRUE(bit_identical(parameters_, straight));
  EXPECT_TRUE(said("Restored training state from " + last + ": epoch 1 after 2 batches, global step 6"))
      << join(console_->infos, "\n");
}

TEST_F(EarlyEndTest, SigintInsideAnEpochLeavesLastCkptAtThatStepAndTheRunResumesFromItBitIdentical) {
  fit({.max_epochs = 2, .enable_checkpointing = false});
  const auto straight = parameters_;

  // SIGINT during batch 1 of epoch 0: the step completes, then the fit stops before any save.
  const FitResult stopped =
      fit({.max_epochs = 2, .callbacks = {saving_last()}}, "", 7, make_module({.sigint_at_batch = 1}, 7));
  ASSERT_EQ(stopped.reason, StopReason::kInterrupted);
  ASSERT_EQ(stopped.global_step, 2);
  const std::string last = (root_ / "checkpoints" / "last.ckpt").string();
  ASSERT_TRUE(io_->exists(last)) << "an interrupted fit leaves last.ckpt where it stopped";
  EXPECT_EQ(load_dict(*io_, last).at("global_step").toInt(), 2);

  const FitResult resumed = fit({.max_epochs = 2, .enable_checkpointing = false}, last, /*init_seed=*/99);
  EXPECT_EQ(resumed.global_step, 8);
  EXPECT_TRUE(bit_identical(parameters_, straight));
}

/// TinyModule whose training_step throws at one global step.
class FailingModule : public TinyModule {
 public:
  explicit FailingModule(int64_t fail_at_step) : fail_at_step_(fail_at_step) {}
  torch::Tensor training_step(const Batch& batch, int64_t batch_idx) override {
    if (global_step() == fail_at_step_) throw std::runtime_error("the step failed");
    return TinyModule::training_step(batch, batch_idx);
  }

 private:
  int64_t fail_at_step_;
};

TEST_F(EarlyEndTest, OnExceptionCheckpointSavesTheRunWhenAStepThrowsAndItResumesBitIdentical) {
  fit({.max_epochs = 2, .enable_checkpointing = false});
  const auto straight = parameters_;

  const std::string dir = (root_ / "crash").string();
  torch::manual_seed(7);
  auto failing = std::make_unique<FailingModule>(/*fail_at_step=*/5);
  EXPECT_THROW(
      fit({.max_epochs = 2,
           .callbacks = {std::make_shared<OnExceptionCheckpoint>(OnExceptionCheckpointOptions{.dirpath = dir})},
           .enable_checkpointing = false},
          "", 7, std::move(failing)),
      std::runtime_error);
  const std::string path = (fs::path(dir) / "on_exception.ckpt").string();
  ASSERT_TRUE(io_->exists(path));
  EXPECT_EQ(load_dict(*io_, path).at("global_step").toInt(), 5);

  const FitResult resumed = fit({.max_epochs = 2, .enable_checkpointing = false}, path, /*init_seed=*/99);
  EXPECT_EQ(resumed.global_step, 8);
  EXPECT_TRUE(bit_identical(parameters_, straight));
}

// ---- GradientAccumulationScheduler ---------------------------------------------------------------

TEST_F(EarlyEndTest, AnAccumulationScheduleEqualsChangingAccumulateGradBatchesBetweenEpochs) {
  // Epoch 0 steps after every batch (4 steps), epoch 1 after every 2 (2 steps).
  auto scheduler = std::make_shared<GradientAccumulationScheduler>(std::map<int64_t, int64_t>{{1, 2}});
  const FitResult scheduled = fit({.max_epochs = 2, .callbacks = {scheduler}, .enable_checkpointing = false});
  EXPECT_EQ(scheduled.global_step, 6);
  const auto with_schedule = parameters_;

  // The same by hand: one epoch at 1, then a resume that accumulates 2.
  auto checkpoint = std::make_shared<ModelCheckpoint>(ModelCheckpointOptions{.save_top_k = -1});
  fit({.max_epochs = 1, .callbacks = {checkpoint}});
  const std::string path = path_ending_with(io_->paths(), "epoch=0-step=4.ckpt");
  const FitResult by_hand = fit({.max_epochs = 2, .accumulate_grad_batches = 2, .enable_checkpointing = false}, path,
                                /*init_seed=*/99);
  EXPECT_EQ(by_hand.global_step, 6);
  EXPECT_TRUE(bit_identical(parameters_, with_schedule));

  // Control: accumulating 2 from the start gives other weights.
  fit({.max_epochs = 2, .accumulate_grad_batches = 2, .enable_checkpointing = false});
  EXPECT_FALSE(bit_identical(parameters_, with_schedule));
}

TEST_F(EarlyEndTest, AnAccumulationScheduleWithAccumulateGradBatchesOrManualOptimizationIsRefused) {
  auto scheduler = std::make_shared<GradientAccumulationScheduler>(std::map<int64_t, int64_t>{{0, 2}});
  try {
    fit({.max_epochs = 1, .accumulate_grad_batches = 3, .callbacks = {scheduler}, .enable_checkpointing = false});
    FAIL() << "accumulate_grad_batches and a schedule were both accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("HINT:"), std::string::npos) << error.what();
  }
  EXPECT_THROW(fit({.max_epochs = 1, .callbacks = {scheduler}, .enable_checkpointing = false}, "", 7,
                   make_module({.manual = true})),
               Error);
}

}  // namespace
}  // namespace volt
