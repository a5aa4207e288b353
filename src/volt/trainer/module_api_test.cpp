// The module's side of Lightning's API: what a LightningModule sees of the run it is in
// (current_epoch, global_step, ranks, device, collectives, print), and the layers the Trainer
// synchronizes for it (sync_batchnorm).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "volt/core/console.h"
#include "volt/nn/sync_batch_norm.h"
#include "volt/trainer/trainer_testing.h"

namespace volt {
namespace {

using namespace volt::trainer_testing;  // NOLINT: the shared fixture and helpers

/// TinyModule that records what it sees of the run at its hooks and steps.
class ViewingModule : public TinyModule {
 public:
  using TinyModule::TinyModule;

  torch::Tensor training_step(const Batch& batch, int64_t batch_idx) override {
    seen.push_back(fmt::format("train e{} s{}", current_epoch(), global_step()));
    return TinyModule::training_step(batch, batch_idx);
  }
  void on_train_epoch_start() override {
    seen.push_back(fmt::format("epoch_start e{} s{}", current_epoch(), global_step()));
  }
  void on_validation_epoch_start() override {
    seen.push_back(fmt::format("val_start e{} s{}", current_epoch(), global_step()));
  }
  void on_test_epoch_start() override {
    seen.push_back(fmt::format("test_start e{} s{}", current_epoch(), global_step()));
  }
  OptimizerConfig configure_optimizers() override {
    seen.push_back(fmt::format("optimizers rank {}/{} local {} node {} zero {} {}", global_rank(), world_size(),
                               local_rank(), node_rank(), is_global_zero(), device().str()));
    return TinyModule::configure_optimizers();
  }
  void on_fit_start() override { print("hello from on_fit_start"); }

  std::vector<std::string> seen;
};

TEST_F(TrainerTest, TheModuleSeesTheEpochAndStepAtEveryHookAndStep) {
  torch::manual_seed(7);
  ViewingModule module(TinyOptions{.train_size = 8, .batch_size = 4});
  auto console = std::make_shared<RecordingConsole>();
  Trainer trainer = make_trainer({.max_epochs = 2, .num_sanity_val_steps = 0, .enable_checkpointing = false});
  trainer.set_console(console);
  trainer.fit(module);
  trainer.test(module);
  EXPECT_EQ(module.seen,
            (std::vector<std::string>{"optimizers rank 0/1 local 0 node 0 zero true cpu", "epoch_start e0 s0",
                                      "train e0 s0", "train e0 s1", "val_start e0 s2", "epoch_start e1 s2",
                                      "train e1 s2", "train e1 s3", "val_start e1 s4", "test_start e2 s4"}));
  // Outside a stage the module stands alone: epoch 0, rank 0 of 1, its parameters' device.
  EXPECT_EQ(module.current_epoch(), 0);
  EXPECT_EQ(module.world_size(), 1);
  EXPECT_EQ(module.device(), torch::Device(torch::kCPU));
  EXPECT_NE(std::find(console->infos.begin(), console->infos.end(), "hello from on_fit_start"), console->infos.end());
}

TEST_F(TrainerTest, AResumedFitStartsAtTheCheckpointsEpochAndStep) {
  std::string ckpt;
  {
    torch::manual_seed(7);
    ViewingModule module(TinyOptions{.train_size = 8, .batch_size = 4});
    Trainer trainer = make_trainer({.max_epochs = 1, .num_sanity_val_steps = 0});
    ckpt = trainer.fit(module).last_model_path;
    ASSERT_FALSE(ckpt.empty());
  }
  torch::manual_seed(7);
  ViewingModule module(TinyOptions{.train_size = 8, .batch_size = 4});
  Trainer trainer = make_trainer({.max_epochs = 2, .num_sanity_val_steps = 0, .enable_checkpointing = false});
  trainer.fit(module, {}, {}, ckpt);
  ASSERT_GE(module.seen.size(), 2U);
  EXPECT_EQ(module.seen[1], "epoch_start e1 s2");
}

/// TinyModule whose training_step_end returns `factor` times the default's combination,
/// recording what it was given.
class ScaledStepEnd : public TinyModule {
 public:
  ScaledStepEnd(TinyOptions options, double factor) : TinyModule(std::move(options)), factor_(factor) {}

  torch::Tensor training_step(const Batch& batch, int64_t batch_idx) override {
    torch::Tensor loss = TinyModule::training_step(batch, batch_idx);
    // Under dp this runs on the replicas' threads; only the single-device test reads it.
    if (batch.size() == 4) last_step_output = loss;
    return loss;
  }
  torch::Tensor training_step_end(const std::vector<torch::Tensor>& losses,
                                  const std::vector<int64_t>& batch_sizes) override {
    received_sizes.push_back(batch_sizes);
    received_same_as_step.push_back(losses.size() == 1 && losses[0].is_same(last_step_output));
    for (const auto& loss : losses) EXPECT_TRUE(loss.requires_grad());
    return TinyModule::training_step_end(losses, batch_sizes) * factor_;
  }

  torch::Tensor last_step_output;
  std::vector<std::vector<int64_t>> received_sizes;
  std::vector<bool> received_same_as_step;

 private:
  double factor_;
};

/// One epoch of two batches of 4 in order (so every fit sees the same batches whatever the RNG).
TinyOptions two_batches() { return {.train_size = 8, .val_size = 4, .shuffle = false}; }

TEST_F(TrainerTest, TrainingStepEndReceivesTheStepsLossAndWhatItReturnsIsBackPropagated) {
  const TrainerOptions options{.max_epochs = 1, .num_sanity_val_steps = 0, .enable_checkpointing = false};
  // Scaled by 0: no gradient, so SGD leaves the weights as they were.
  torch::manual_seed(7);
  ScaledStepEnd zero(two_batches(), 0.0);
  const auto initial = parameters_of(zero);
  make_trainer(options).fit(zero);
  EXPECT_TRUE(bit_identical(parameters_of(zero), initial));
  EXPECT_EQ(zero.received_sizes, (std::vector<std::vector<int64_t>>{{4}, {4}}));
  EXPECT_EQ(zero.received_same_as_step, (std::vector<bool>{true, true}));
  // Scaled by 2: with plain SGD, the same weights as twice the learning rate (powers of two scale
  // every float exactly).
  torch::manual_seed(7);
  ScaledStepEnd doubled(two_batches(), 2.0);
  make_trainer(options).fit(doubled);
  TinyOptions twice_lr = two_batches();
  twice_lr.lr = 0.2;
  auto reference = make_module(twice_lr);
  make_trainer(options).fit(*reference);
  EXPECT_TRUE(bit_identical(parameters_of(doubled), parameters_of(*reference)));
  EXPECT_FALSE(bit_identical(parameters_of(doubled), initial));
}

TEST_F(TrainerTest, TrainingStepEndUnderDpReceivesOneLossPerDeviceAndItsResultIsBackPropagated) {
  const TrainerOptions options{.accelerator = AcceleratorRequest::kCpu,
                               .devices = 2,
                               .strategy = StrategyRequest::kDp,
                               .max_epochs = 1,
                               .num_sanity_val_steps = 0,
                               .enable_checkpointing = false};
  torch::manual_seed(7);
  ScaledStepEnd zero(two_batches(), 0.0);
  const auto initial = parameters_of(zero);
  make_trainer(options).fit(zero);
  EXPECT_TRUE(bit_identical(parameters_of(zero), initial));
  EXPECT_EQ(zero.received_sizes, (std::vector<std::vector<int64_t>>{{2, 2}, {2, 2}}));
  // The control: the default combination moves the weights.
  auto plain = make_module(two_batches());
  make_trainer(options).fit(*plain);
  EXPECT_FALSE(bit_identical(parameters_of(*plain), initial));
}

TEST(ModuleCollectives, OneProcessGathersItselfAndReducesToACopy) {
  TinyModule module;
  const torch::Tensor t = torch::tensor({1.0, 2.0}, torch::requires_grad());
  const std::vector<torch::Tensor> all = module.all_gather(t);
  ASSERT_EQ(all.size(), 1U);
  EXPECT_TRUE(torch::equal(all[0], t.detach()));
  EXPECT_FALSE(all[0].requires_grad());
  torch::Tensor sum = module.all_reduce(t, Reduce::kSum);
  EXPECT_TRUE(torch::equal(sum, t.detach()));
  sum.add_(1.0);
  EXPECT_EQ(t[0].item<double>(), 1.0) << "all_reduce returns a new tensor";
}

/// TinyModule with a normalization layer on its inputs: plain BatchNorm1d or volt::SyncBatchNorm.
class NormalizedModule : public TinyModule {
 public:
  explicit NormalizedModule(bool plain) {
    if (plain) {
      plain_ = register_module("input_norm", torch::nn::BatchNorm1d(4));
    } else {
      synced_ = register_module("input_norm", SyncBatchNorm(torch::nn::BatchNormOptions(4)));
    }
  }
  torch::Tensor training_step(const Batch& batch, int64_t batch_idx) override {
    if (!synced_.is_empty()) attached.push_back(synced_->collectives() != nullptr);
    const torch::Tensor x = plain_.is_empty() ? synced_(batch.data) : plain_(batch.data);
    return torch::mse_loss(forward(x), batch.target);
  }
  /// Whether the SyncBatchNorm holds collectives now.
  bool attached_now() const { return synced_->collectives() != nullptr; }
  std::vector<bool> attached;

 private:
  torch::nn::BatchNorm1d plain_{nullptr};
  SyncBatchNorm synced_{nullptr};
};

TEST_F(TrainerTest, SyncBatchnormRefusesPlainBatchNormLayersNamingThemAndAttachesSyncOnesForTheFit) {
  NormalizedModule plain(/*plain=*/true);
  try {
    make_trainer({.sync_batchnorm = true, .max_epochs = 1}).fit(plain);
    FAIL() << "a plain BatchNorm1d under sync_batchnorm was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("input_norm"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("HINT:"), std::string::npos) << e.what();
  }
  NormalizedModule synced(/*plain=*/false);
  make_trainer({.sync_batchnorm = true, .max_epochs = 1, .num_sanity_val_steps = 0, .enable_checkpointing = false})
      .fit(synced);
  ASSERT_FALSE(synced.attached.empty());
  for (const bool attached : synced.attached) EXPECT_TRUE(attached);
  EXPECT_FALSE(synced.attached_now()) << "detached when fit ends";
  std::vector<std::string> none;
  EXPECT_EQ(plain_batchnorm_paths(synced), none);
}

// ---- log(name, Metric) ------------------------------------------------------------------------------

/// The logged Metric's value, against the module's hand-summed squared errors.
void expect_logged_mse(const Trainer& trainer, const TinyModule::Sum& sum, const std::string& name) {
  ASSERT_GT(sum.count, 0) << name;
  ASSERT_EQ(trainer.callback_metrics().count(name), 1u) << name << " was not logged";
  EXPECT_NEAR(trainer.callback_metrics().at(name), sum.squares / static_cast<double>(sum.count), 1e-6) << name;
}

TEST_F(TrainerTest, ALoggedMetricIsComputedOverTheWholeEpochOfTrainingAndOfValidation) {
  // 3 batches of 4 and one of 2: a mean of per-batch values would differ from the metric's.
  auto module = make_module({.train_size = 14, .val_size = 10, .metric = true});
  Trainer trainer = make_trainer({.max_epochs = 2});
  trainer.fit(*module);
  expect_logged_mse(trainer, module->sums.train, "train/mse");
  expect_logged_mse(trainer, module->sums.val, "val/mse");

  const EvalResult tested = trainer.validate(*module);
  expect_logged_mse(trainer, module->sums.val, "val/mse");
  EXPECT_EQ(tested.metrics.count("val/mse"), 1u);
}

TEST_F(TrainerTest, ALoggedMetricUnderDpCountsEveryReplicasExamplesOnce) {
  auto module = make_module({.train_size = 14, .val_size = 10, .metric = true});
  Trainer trainer = make_trainer(
      {.accelerator = AcceleratorRequest::kCpu, .devices = 2, .strategy = StrategyRequest::kDp, .max_epochs = 1});
  trainer.fit(*module);
  expect_logged_mse(trainer, module->sums.train, "train/mse");
  expect_logged_mse(trainer, module->sums.val, "val/mse");
}

TEST_F(TrainerTest, LoggingAMetricOnStepIsAClearError) {
  class OnStep : public TinyModule {
   public:
    using TinyModule::TinyModule;
    torch::Tensor training_step(const Batch& batch, int64_t batch_idx) override {
      mse_.update(forward(batch.data), batch.target);
      log("mse", mse_, {.on_step = true});
      return loss(batch);
    }
    MeanSquaredError mse_;
  };
  torch::manual_seed(7);
  OnStep module;
  Trainer trainer = make_trainer({.max_epochs = 1});
  try {
    trainer.fit(module);
    FAIL() << "fit accepted a Metric logged on_step";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("on_step=true"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("HINT:"), std::string::npos) << error.what();
  }
}

/// A module that names no name.
struct Unnamed : LightningModule {
  torch::Tensor training_step(const Batch&, int64_t) override { return {}; }
  OptimizerConfig configure_optimizers() override { return {}; }
};

TEST_F(TrainerTest, AModuleWithoutANameIsCalledByItsClassInErrors) {
  Unnamed module;
  EXPECT_EQ(module.name(), "volt::(anonymous namespace)::Unnamed");
  const std::string message = testing::error_message([&] { make_trainer({.max_epochs = 1}).fit(module); });
  EXPECT_NE(message.find("volt::(anonymous namespace)::Unnamed has no training data"), std::string::npos) << message;
}

TEST(RegisterMetric, RefusesADuplicateNameOrMetric) {
  TinyModule module;
  MeanSquaredError a;
  MeanSquaredError b;
  module.register_metric("a", a);
  EXPECT_THROW(module.register_metric("a", b), Error);
  EXPECT_THROW(module.register_metric("b", a), Error);
  EXPECT_THROW(module.register_metric("", b), Error);
  module.register_metric("b", b);
  EXPECT_EQ(module.registered_metrics().size(), 2u);
}

}  // namespace
}  // namespace volt
