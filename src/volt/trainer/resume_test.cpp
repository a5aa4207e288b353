// Exact resume: a run interrupted at a checkpoint and resumed ends bit-identical to one that
// never stopped, across schedulers, accumulation, dropout and bf16-mixed.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include "volt/checkpoint/weight_source.h"
#include "volt/core/testing.h"
#include "volt/trainer/trainer_testing.h"

namespace volt {
namespace {

using namespace volt::trainer_testing;  // NOLINT: the shared fixture and helpers
namespace fs = std::filesystem;

struct Outcome {
  std::map<std::string, torch::Tensor> parameters;
  int64_t global_step = 0;
  FitResult result;
  std::map<std::string, double> metrics;  // the Trainer's callback_metrics after the fit
};

class ResumeTest : public TrainerTest {
 public:
  Outcome fit(const TinyOptions& module_options, TrainerOptions options, const std::string& ckpt_path = "",
              uint64_t init_seed = 7) {
    auto module = make_module(module_options, init_seed);
    options.precision = precision_;
    Trainer trainer = make_trainer(std::move(options));
    trainer.set_checkpoint_io(io_);
    Outcome out;
    out.result = trainer.fit(*module, {}, {}, ckpt_path);
    out.parameters = parameters_of(*module);
    out.global_step = out.result.global_step;
    out.metrics = trainer.callback_metrics();
    return out;
  }

  /// Every step, with all checkpoints kept.
  static std::shared_ptr<Callback> every_n_steps(int64_t n) {
    return std::make_shared<ModelCheckpoint>(ModelCheckpointOptions{.save_top_k = -1, .every_n_train_steps = n});
  }

  /// Checks that training 2 epochs straight equals stopping where `stop` says, then resuming
  /// from the checkpoint whose name ends with `suffix` in a module with different initial weights.
  void expect_exact_resume(const TinyOptions& module_options, int64_t accumulate, TrainerOptions stop,
                           std::shared_ptr<Callback> checkpoint, const std::string& suffix) {
    io_ = std::make_shared<InMemoryCheckpointIO>();
    const Outcome straight =
        fit(module_options,
            {.max_epochs = 2, .accumulate_grad_batches = accumulate, .seed = 1, .enable_checkpointing = false});

    stop.accumulate_grad_batches = accumulate;
    stop.seed = 1;
    stop.callbacks = {std::move(checkpoint)};
    fit(module_options, stop);
    const std::string path = path_ending_with(io_->paths(), suffix);
    if (lightning_layout_) strip_to_lightning_layout(path);
    if (checkpoint_edit_) checkpoint_edit_(path);

    const Outcome resumed = fit(module_options, {.max_epochs = 2, .accumulate_grad_batches = accumulate, .seed = 1},
                                path, /*init_seed=*/99);
    EXPECT_EQ(resumed.result.resumed_from, path);
    EXPECT_EQ(resumed.global_step, straight.global_step);
    EXPECT_TRUE(bit_identical(resumed.parameters, straight.parameters));
    if (module_options.metric) {
      // Exactly equal: the resumed metric states add the same updates in the same order.
      for (const char* name : {"train/mse", "val/mse"}) {
        ASSERT_EQ(resumed.metrics.count(name), 1u) << name;
        EXPECT_EQ(resumed.metrics.at(name), straight.metrics.at(name)) << name;
      }
    }
  }

  /// Leaves only what PyTorch Lightning writes (and the generator state, which its fault-tolerant
  /// mode saves): no Volt version and none of Volt's own loop keys.
  void strip_to_lightning_layout(const std::string& path) {
    StateDict checkpoint = load_dict(*io_, path);
    ASSERT_TRUE(checkpoint.erase("volt_checkpoint_version"));
    ASSERT_TRUE(checkpoint.erase("volt_version"));
    StateDict fit_loop = checkpoint.at("loops").toGenericDict().at("fit_loop").toGenericDict();
    for (const char* key :
         {"epoch", "batches_done", "epoch_done", "global_step", "total_batches", "validation_pending"})
      ASSERT_TRUE(fit_loop.erase(key)) << key;
    io_->save(checkpoint, path);
  }

 protected:
  std::shared_ptr<InMemoryCheckpointIO> io_ = std::make_shared<InMemoryCheckpointIO>();
  Precision precision_ = Precision::k32True;                 // every fit's precision
  bool lightning_layout_ = false;                            // resume from Lightning's keys alone
  std::function<void(const std::string&)> checkpoint_edit_;  // changes the checkpoint before the resume
};

TEST_F(ResumeTest, FromAnEpochEndCheckpointIsBitIdentical) {
  // Through real files, as a user resumes.
  auto straight_module = make_module();
  make_trainer({.max_epochs = 2, .seed = 1, .enable_checkpointing = false}).fit(*straight_module);

  auto first = make_module();
  const FitResult one = make_trainer({.max_epochs = 1, .seed = 1}).fit(*first);
  ASSERT_EQ(one.last_model_path, (root_ / "checkpoints/epoch=0-step=4.ckpt").string());

  auto second = make_module({}, /*init_seed=*/99);
  const FitResult two = make_trainer({.max_epochs = 2, .seed = 1}).fit(*second, {}, {}, one.last_model_path);
  EXPECT_EQ(two.resumed_from, one.last_model_path);
  EXPECT_EQ(two.global_step, 8);
  EXPECT_EQ(two.epochs_completed, 2);
  EXPECT_EQ(second->count("training_step"), 4) << "only epoch 1 is trained again";
  EXPECT_TRUE(bit_identical(parameters_of(*second), parameters_of(*straight_module)));
}

TEST_F(ResumeTest, FromAMidEpochCheckpointIsBitIdentical) {
  expect_exact_resume({}, 1, {.max_steps = 3}, every_n_steps(3), "epoch=0-step=3.ckpt");
}

TEST_F(ResumeTest, InsideTheLastEpochTheLoggedMetricsContinueBitIdentical) {
  // 4 batches an epoch: step 6 is inside epoch 1, whose train/mse the resumed run reports.
  expect_exact_resume({.metric = true}, 1, {.max_steps = 6}, every_n_steps(6), "epoch=1-step=6.ckpt");
}

TEST_F(ResumeTest, FromTheLastCheckpointOfAFitStoppedInsideAnEpochTheLoggedMetricsContinueBitIdentical) {
  // last.ckpt is written after the cut-short epoch reported its values so far: the metrics'
  // states must still be those of the unfinished epoch.
  expect_exact_resume({.metric = true}, 1, {.max_steps = 6},
                      std::make_shared<ModelCheckpoint>(ModelCheckpointOptions{.save_last = true}), "last.ckpt");
}

TEST_F(ResumeTest, ControlACheckpointWithoutMetricStatesChangesTheLoggedMetric) {
  checkpoint_edit_ = [this](const std::string& path) {
    StateDict checkpoint = load_dict(*io_, path);
    ASSERT_TRUE(checkpoint.erase(kMetricsCheckpointKey)) << "the checkpoint holds no metric states";
    io_->save(checkpoint, path);
  };
  EXPECT_NONFATAL_FAILURE(
      expect_exact_resume({.metric = true}, 1, {.max_steps = 6}, every_n_steps(6), "epoch=1-step=6.ckpt"), "train/mse");
}

TEST_F(ResumeTest, WithDropoutAdamAndAnEpochSchedulerIsBitIdentical) {
  const TinyOptions options{.dropout = 0.3, .optimizer = Optim::kAdam, .lr = 0.01, .scheduler = Interval::kEpoch};
  // At the end of epoch 0, after its validation and scheduler step (the default ModelCheckpoint).
  expect_exact_resume(options, 1, {.max_epochs = 1}, std::make_shared<ModelCheckpoint>(), "epoch=0-step=4.ckpt");
  // After epoch 0's last batch, before its end-of-epoch work, which the resumed run then does.
  expect_exact_resume(options, 1, {.max_epochs = 1}, every_n_steps(4), "epoch=0-step=4.ckpt");
  // In the middle of epoch 0.
  expect_exact_resume(options, 1, {.max_steps = 3}, every_n_steps(3), "epoch=0-step=3.ckpt");
}

TEST_F(ResumeTest, WithDropoutAdamAndAStepSchedulerIsBitIdentical) {
  const TinyOptions options{.dropout = 0.3, .optimizer = Optim::kAdam, .lr = 0.01, .scheduler = Interval::kStep};
  expect_exact_resume(options, 1, {.max_steps = 5}, every_n_steps(5), "epoch=1-step=5.ckpt");
}

TEST_F(ResumeTest, WithGradientAccumulationIsBitIdentical) {
  // 6 batches of 4, 3 optimizer steps per epoch; the step-2 checkpoint is after batch 4.
  const TinyOptions options{.train_size = 24, .dropout = 0.3, .optimizer = Optim::kAdam, .lr = 0.01};
  expect_exact_resume(options, 2, {.max_steps = 2}, every_n_steps(2), "epoch=0-step=2.ckpt");
}

TEST_F(ResumeTest, Bf16MixedIsBitIdentical) {
  precision_ = Precision::kBf16Mixed;
  const TinyOptions options{.dropout = 0.3, .optimizer = Optim::kAdam, .lr = 0.01};
  expect_exact_resume(options, 1, {.max_steps = 3}, every_n_steps(3), "epoch=0-step=3.ckpt");
}

TEST_F(ResumeTest, FromACheckpointAfterTheLastBatchStillValidatesThatEpoch) {
  // every_n_train_steps saves at the end of batch 4, before epoch 0's validation ran.
  fit({}, {.max_epochs = 1, .num_sanity_val_steps = 0, .callbacks = {every_n_steps(4)}});
  auto module = make_module();
  Trainer trainer = make_trainer({.max_epochs = 1, .num_sanity_val_steps = 0});
  trainer.set_checkpoint_io(io_);
  const FitResult result = trainer.fit(*module, {}, {}, path_ending_with(io_->paths(), "epoch=0-step=4.ckpt"));
  EXPECT_EQ(module->count("training_step"), 0);
  EXPECT_EQ(validation_points(*module), (std::vector<int64_t>{0})) << "epoch 0's validation is still due";
  EXPECT_EQ(result.metrics.count("val/loss"), 1u);
}

TEST_F(ResumeTest, FromAMidEpochCheckpointRunsAValidationThatWasDueButNotOneThatRan) {
  // Validation after batches 2 and 4; one checkpoint before the validation at batch 2, one after.
  auto before = every_n_steps(2);
  auto after = std::make_shared<ModelCheckpoint>(
      ModelCheckpointOptions{.dirpath = (root_ / "after").string(), .save_top_k = -1});
  fit({}, {.max_steps = 2, .val_check_interval = 0.5, .num_sanity_val_steps = 0, .callbacks = {before, after}});
  const std::string due = path_ending_with(io_->paths(), "checkpoints/epoch=0-step=2.ckpt");
  const std::string ran = path_ending_with(io_->paths(), "after/epoch=0-step=2.ckpt");

  for (const auto& [path, expected] :
       {std::pair{due, std::vector<int64_t>{0, 2}}, std::pair{ran, std::vector<int64_t>{2}}}) {
    auto module = make_module();
    Trainer trainer = make_trainer({.max_epochs = 1, .val_check_interval = 0.5, .num_sanity_val_steps = 0});
    trainer.set_checkpoint_io(io_);
    trainer.fit(*module, {}, {}, path);
    EXPECT_EQ(module->count("training_step"), 2) << path;
    EXPECT_EQ(validation_points(*module), expected) << path;
  }
}

TEST_F(ResumeTest, ACheckpointWithoutTheValidationPendingKeyStillResumes) {
  // Checkpoints written before the key existed resume as if no validation were pending.
  fit({}, {.max_steps = 3, .seed = 1, .callbacks = {every_n_steps(3)}});
  const std::string path = path_ending_with(io_->paths(), "epoch=0-step=3.ckpt");
  StateDict checkpoint = load_dict(*io_, path);
  ASSERT_TRUE(checkpoint.at("loops").toGenericDict().at("fit_loop").toGenericDict().erase("validation_pending"));
  io_->save(checkpoint, path);
  const Outcome resumed = fit({}, {.max_epochs = 1, .seed = 1}, path);
  EXPECT_EQ(resumed.global_step, 4);
}

TEST_F(ResumeTest, FromLightningsLoopProgressAloneIsBitIdentical) {
  // What a Lightning checkpoint tells: its epoch and batch progress, no Volt keys.
  lightning_layout_ = true;
  const TinyOptions options{.dropout = 0.3, .optimizer = Optim::kAdam, .lr = 0.01, .scheduler = Interval::kEpoch};
  expect_exact_resume(options, 1, {.max_epochs = 1}, std::make_shared<ModelCheckpoint>(), "epoch=0-step=4.ckpt");
  expect_exact_resume(options, 1, {.max_epochs = 1}, every_n_steps(4), "epoch=0-step=4.ckpt");
  expect_exact_resume(options, 1, {.max_steps = 3}, every_n_steps(3), "epoch=0-step=3.ckpt");
}

TEST_F(ResumeTest, AMissingLoopEntryIsNamedByItsKeyPath) {
  fit({}, {.max_steps = 3, .seed = 1, .callbacks = {every_n_steps(3)}});
  const std::string path = path_ending_with(io_->paths(), "epoch=0-step=3.ckpt");
  const auto expect_named = [&](const std::string& damaged, const std::string& missing) {
    auto module = make_module();
    Trainer trainer = make_trainer({.max_epochs = 1});
    trainer.set_checkpoint_io(io_);
    try {
      trainer.fit(*module, {}, {}, damaged);
      ADD_FAILURE() << "expected a CheckpointError naming " << missing;
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("lacks the entry " + missing), std::string::npos) << e.what();
    }
  };
  // Volt's checkpoint without its loop's epoch: the top-level "epoch" is there, the loop's is not.
  StateDict volt = load_dict(*io_, path);
  ASSERT_TRUE(volt.at("loops").toGenericDict().at("fit_loop").toGenericDict().erase("epoch"));
  io_->save(volt, path + ".volt");
  expect_named(path + ".volt", R"(["loops"]["fit_loop"]["epoch"])");
  // Lightning's layout without its epoch progress.
  strip_to_lightning_layout(path);
  StateDict lightning = load_dict(*io_, path);
  ASSERT_TRUE(lightning.at("loops").toGenericDict().at("fit_loop").toGenericDict().erase("epoch_progress"));
  io_->save(lightning, path + ".lightning");
  expect_named(path + ".lightning", R"(["loops"]["fit_loop"]["epoch_progress"])");
}

TEST_F(ResumeTest, WorkersChangeNothingAndResumeMidEpochBitIdentical) {
  // Batches depend on (seed, epoch, index) only: 0, 1 and 4 worker threads train the same model.
  const TinyOptions base{.dropout = 0.3, .optimizer = Optim::kAdam, .lr = 0.01, .scheduler = Interval::kEpoch};
  const Outcome without = fit(base, {.max_epochs = 2, .seed = 1});
  for (const int64_t workers : {1, 4}) {
    for (const bool persistent : {false, true}) {
      TinyOptions options = base;
      options.num_workers = workers;
      options.persistent_workers = persistent;
      const Outcome with = fit(options, {.max_epochs = 2, .seed = 1});
      EXPECT_TRUE(bit_identical(with.parameters, without.parameters))
          << workers << " workers, persistent " << persistent;
      EXPECT_EQ(with.result.metrics, without.result.metrics);
    }
  }
  TinyOptions options = base;
  options.num_workers = 4;
  expect_exact_resume(options, 1, {.max_steps = 3}, every_n_steps(3), "epoch=0-step=3.ckpt");
}

TEST_F(ResumeTest, ManualOptimizationEqualsAutomaticAndResumesMidEpochBitIdentical) {
  const TinyOptions automatic{.dropout = 0.3, .optimizer = Optim::kAdam, .lr = 0.01, .scheduler = Interval::kStep};
  TinyOptions manual = automatic;
  manual.manual = true;
  const Outcome a = fit(automatic, {.max_epochs = 2, .seed = 1});
  const Outcome m = fit(manual, {.max_epochs = 2, .seed = 1});
  EXPECT_EQ(m.global_step, a.global_step);
  EXPECT_TRUE(bit_identical(m.parameters, a.parameters));
  expect_exact_resume(manual, 1, {.max_steps = 3}, every_n_steps(3), "epoch=0-step=3.ckpt");
}

TEST_F(ResumeTest, ControlADifferentSeedGivesDifferentParameters) {
  const TinyOptions options{.dropout = 0.3};
  const Outcome a = fit(options, {.max_epochs = 2, .seed = 1});
  const Outcome b = fit(options, {.max_epochs = 2, .seed = 2});
  EXPECT_FALSE(bit_identical(a.parameters, b.parameters));
}

TEST_F(ResumeTest, ControlDisturbingTheRestoredRandomStreamBreaksTheMatch) {
  // The same as the mid-epoch resume, except that the module draws a random number while the
  // checkpoint is restored: the comparison must notice a random stream that is off by one draw.
  const TinyOptions options{.dropout = 0.3};
  const Outcome straight = fit(options, {.max_epochs = 2, .seed = 1});
  fit(options, {.max_steps = 3, .seed = 1, .callbacks = {every_n_steps(3)}});
  TinyOptions disturbing = options;
  disturbing.draw_rng_on_load = true;
  const Outcome resumed =
      fit(disturbing, {.max_epochs = 2, .seed = 1}, path_ending_with(io_->paths(), "epoch=0-step=3.ckpt"));
  EXPECT_EQ(resumed.global_step, straight.global_step);
  EXPECT_FALSE(bit_identical(resumed.parameters, straight.parameters));
}

// ---- initial weights from outside (LightningModule::initial_weights) ----------------------------

// Element i of a parameter is i / 100 (plus 1 for the bias); records what it was asked for.
class RecordingSource : public WeightSource {
 public:
  std::string describe() const override { return "the recording source"; }
  at::Tensor read(const std::string& name, const std::vector<int64_t>& shape, int64_t begin, int64_t end) override {
    asked.push_back(fmt::format("{} {} [{}, {})", name, c10::str(c10::IntArrayRef(shape)), begin, end));
    return torch::arange(begin, end - short_by, torch::kDouble) / 100 + (name == "linear.bias" ? 1.0 : 0.0);
  }
  std::vector<std::string> asked;
  int64_t short_by = 0;  ///< returns this many elements fewer than asked
};

class ModuleWithSource : public TinyModule {
 public:
  std::shared_ptr<WeightSource> initial_weights() override { return source; }
  std::shared_ptr<RecordingSource> source = std::make_shared<RecordingSource>();
};

TEST_F(ResumeTest, AFitStartsFromTheModulesInitialWeightsAsFromAModuleBuiltWithThem) {
  torch::manual_seed(7);
  ModuleWithSource from_source;
  make_trainer({.max_epochs = 2, .seed = 1, .enable_checkpointing = false}).fit(from_source);
  EXPECT_EQ(from_source.source->asked,
            (std::vector<std::string>{"linear.weight [1, 4] [0, 4)", "linear.bias [1] [0, 1)"}));

  auto built = make_module({}, /*init_seed=*/99);
  {
    torch::NoGradGuard no_grad;
    built->named_parameters()["linear.weight"].copy_(torch::tensor({{0.0, 0.01, 0.02, 0.03}}));
    built->named_parameters()["linear.bias"].fill_(1.0);
  }
  make_trainer({.max_epochs = 2, .seed = 1, .enable_checkpointing = false}).fit(*built);
  EXPECT_TRUE(bit_identical(parameters_of(from_source), parameters_of(*built)));
}

TEST_F(ResumeTest, AResumedFitRestoresItsCheckpointAndNeverReadsTheInitialWeights) {
  const Outcome straight = fit({}, {.max_epochs = 2, .seed = 1, .enable_checkpointing = false});
  fit({}, {.max_steps = 3, .seed = 1, .callbacks = {every_n_steps(3)}});
  ModuleWithSource resumed;
  Trainer trainer = make_trainer({.max_epochs = 2, .seed = 1});
  trainer.set_checkpoint_io(io_);
  trainer.fit(resumed, {}, {}, path_ending_with(io_->paths(), "epoch=0-step=3.ckpt"));
  EXPECT_TRUE(resumed.source->asked.empty());
  EXPECT_TRUE(bit_identical(parameters_of(resumed), straight.parameters));
}

TEST_F(ResumeTest, ASourceThatReturnsTheWrongNumberOfElementsIsNamed) {
  ModuleWithSource module;
  module.source->short_by = 1;
  const std::string message =
      testing::error_message([&] { make_trainer({.max_epochs = 1, .enable_checkpointing = false}).fit(module); });
  EXPECT_NE(message.find("the recording source"), std::string::npos) << message;
  EXPECT_NE(message.find("elements [0, 4) of 'linear.weight' [1, 4], it returned 3 values"), std::string::npos)
      << message;
  EXPECT_NE(message.find("HINT"), std::string::npos) << message;
}

// ---- fast_dev_run, predict, evaluation ------------------------------------------------------------

}  // namespace
}  // namespace volt
