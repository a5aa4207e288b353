// Manual optimization (automatic_optimization() false): training_step backpropagates and steps
// its optimizers itself through the Trainer, as a GAN does with two of them.
#include <gtest/gtest.h>

#include "volt/trainer/trainer_testing.h"

namespace volt {
namespace {

using namespace volt::trainer_testing;  // NOLINT: the shared fixture and helpers

/// Two linear maps trained in turns, each by its own optimizer, on a loss that reaches both (a
/// GAN's generator and discriminator in miniature): toggle_optimizer keeps each step's gradients
/// to the optimizer that steps.
class TwoPlayers : public LightningModule {
 public:
  explicit TwoPlayers(bool clip = false) : LightningModule("TwoPlayers"), clip_(clip) {
    torch::manual_seed(3);
    first_ = register_module("first", torch::nn::Linear(4, 4));
    second_ = register_module("second", torch::nn::Linear(4, 1));
    data_ = make_dataset(16, 1, 1);
    set_automatic_optimization(false);
  }
  torch::Tensor training_step(const Batch& batch, int64_t) override {
    std::vector<LightningOptimizer> opts = optimizers();
    EXPECT_EQ(opts.size(), 2U);
    // The first player lowers the loss, with the second's gradients left alone.
    toggle_optimizer(opts[0]);
    const torch::Tensor loss = torch::mse_loss(second_(first_(batch.data)), batch.target);
    manual_backward(loss);
    const torch::Tensor grad = second_->weight.grad();
    second_touched_by_first.push_back(grad.defined() && grad.abs().sum().item<double>() > 0);
    if (clip_) clip_gradients(opts[0], 1e-3, GradientClipAlgorithm::kValue);
    opts[0].step();
    opts[0].zero_grad();
    untoggle_optimizer(opts[0]);
    // The second raises it (an adversary), the first's gradients left alone.
    toggle_optimizer(opts[1]);
    const torch::Tensor adversarial = -torch::mse_loss(second_(first_(batch.data)), batch.target);
    manual_backward(adversarial);
    opts[1].step();
    opts[1].zero_grad();
    untoggle_optimizer(opts[1]);
    steps_seen.push_back(global_step());
    return loss.detach();
  }
  OptimizerConfig configure_optimizers() override {
    OptimizerConfig config;
    config.optimizers.push_back(std::make_shared<torch::optim::SGD>(first_->parameters(), 0.1));
    config.optimizers.push_back(std::make_shared<torch::optim::SGD>(second_->parameters(), 0.01));
    return config;
  }
  DataLoader train_dataloader() override { return DataLoader(data_, {.batch_size = 4}); }

  /// The same two steps by hand, without a Trainer, on the same batches.
  void train_by_hand(int64_t epochs) {
    torch::optim::SGD first(first_->parameters(), 0.1);
    torch::optim::SGD second(second_->parameters(), 0.01);
    for (int64_t e = 0; e < epochs; ++e) {
      for (int64_t b = 0; b < 4; ++b) {
        const Batch batch = data_->get_batch(torch::arange(b * 4, b * 4 + 4));
        torch::mse_loss(second_(first_(batch.data)), batch.target).backward();
        if (clip_) torch::nn::utils::clip_grad_value_(first_->parameters(), 1e-3);
        first.step();
        first.zero_grad();
        second.zero_grad();
        (-torch::mse_loss(second_(first_(batch.data)), batch.target)).backward();
        second.step();
        first.zero_grad();
        second.zero_grad();
      }
    }
  }

  std::vector<bool> second_touched_by_first;
  std::vector<int64_t> steps_seen;

 private:
  bool clip_;
  torch::nn::Linear first_{nullptr};
  torch::nn::Linear second_{nullptr};
  std::shared_ptr<TensorDataset> data_;
};

TEST_F(TrainerTest, TwoOptimizersSteppedByHandInTheStepMatchAPlainLoopAndEachStepCounts) {
  for (const bool clip : {false, true}) {
    TwoPlayers module(clip);
    TwoPlayers reference(clip);
    const FitResult result =
        make_trainer({.max_epochs = 2, .num_sanity_val_steps = 0, .enable_checkpointing = false}).fit(module);
    reference.train_by_hand(2);
    EXPECT_TRUE(bit_identical(trainer_testing::parameters_of(module), trainer_testing::parameters_of(reference)))
        << "clip " << clip;
    // Each optimizer's step counts (Lightning's global_step under manual optimization).
    EXPECT_EQ(result.global_step, 2 * 2 * 4);
    EXPECT_EQ(module.steps_seen.front(), 2);
    // toggle_optimizer kept the second player's weights out of the first one's backward.
    ASSERT_EQ(module.second_touched_by_first.size(), 8U);
    for (const bool touched : module.second_touched_by_first) EXPECT_FALSE(touched);
  }
}

TEST_F(TrainerTest, ManualOptimizationRefusesWhatTheTrainerWouldDoForIt) {
  auto accumulate = make_module({.manual = true});
  EXPECT_THROW(make_trainer({.max_epochs = 1, .accumulate_grad_batches = 2}).fit(*accumulate), Error);
  auto clip = make_module({.manual = true});
  try {
    make_trainer({.max_epochs = 1, .gradient_clip_val = 1.0}).fit(*clip);
    FAIL() << "gradient_clip_val under manual optimization was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("HINT: call clip_gradients"), std::string::npos) << e.what();
  }
  // dp's replicas are threads: their manual backward passes and steps would interleave.
  auto dp = make_module({.manual = true});
  try {
    make_trainer(
        {.accelerator = AcceleratorRequest::kCpu, .devices = 2, .strategy = StrategyRequest::kDp, .max_epochs = 1})
        .fit(*dp);
    FAIL() << "manual optimization under dp was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("which strategy 'dp' cannot run"), std::string::npos) << e.what();
  }
}

/// TinyModule under manual optimization that records, at each step, its optimizer's learning
/// rate and the dtype its forward pass computes in.
class RecordingManual : public TinyModule {
 public:
  using TinyModule::TinyModule;
  torch::Tensor training_step(const Batch& batch, int64_t batch_idx) override {
    lrs.push_back(optimizers().at(0).optimizer().param_groups().at(0).options().get_lr());
    forward_dtypes.push_back(forward(batch.data).scalar_type());
    return TinyModule::training_step(batch, batch_idx);
  }
  std::vector<double> lrs;
  std::vector<c10::ScalarType> forward_dtypes;
};

TEST_F(TrainerTest, ManualOptimizationStepsItsSchedulerFromLrSchedulersAndTheTrainerDoesNot) {
  // StepLR(step_size=2, gamma=0.5) stepped by the module after each of 6 steps: the Trainer
  // stepping it too would halve the rate every step.
  torch::manual_seed(7);
  RecordingManual module(
      {.train_size = 24, .val_size = 4, .shuffle = false, .scheduler = Interval::kStep, .manual = true});
  make_trainer({.max_epochs = 1, .num_sanity_val_steps = 0, .enable_checkpointing = false}).fit(module);
  EXPECT_EQ(module.lrs, (std::vector<double>{0.1, 0.1, 0.05, 0.05, 0.025, 0.025}));
}

TEST_F(TrainerTest, ManualOptimizationUnderBf16MixedComputesInBfloat16AndStepsFloat32Weights) {
  const TrainerOptions options{.max_epochs = 1, .num_sanity_val_steps = 0, .enable_checkpointing = false};
  torch::manual_seed(7);
  RecordingManual mixed({.train_size = 8, .val_size = 4, .shuffle = false, .manual = true});
  const auto initial = parameters_of(mixed);
  TrainerOptions bf16 = options;
  bf16.precision = Precision::kBf16Mixed;
  make_trainer(bf16).fit(mixed);
  // training_step ran under autocast: its Linear computed in bfloat16.
  EXPECT_EQ(mixed.forward_dtypes, (std::vector<c10::ScalarType>{torch::kBFloat16, torch::kBFloat16}));
  for (const auto& [name, p] : parameters_of(mixed)) EXPECT_EQ(p.scalar_type(), torch::kFloat) << name;
  EXPECT_FALSE(bit_identical(parameters_of(mixed), initial)) << "manual_backward and step moved nothing";
  // The control: at 32-true the same steps compute in float32 and end elsewhere.
  torch::manual_seed(7);
  RecordingManual full({.train_size = 8, .val_size = 4, .shuffle = false, .manual = true});
  make_trainer(options).fit(full);
  EXPECT_EQ(full.forward_dtypes, (std::vector<c10::ScalarType>{torch::kFloat, torch::kFloat}));
  EXPECT_FALSE(bit_identical(parameters_of(mixed), parameters_of(full)));
}

TEST(ManualOptimizationCalls, OutsideManualOptimizationSayWhatToDo) {
  TinyModule automatic;
  try {
    automatic.manual_backward(torch::ones({1}, torch::requires_grad()));
    FAIL() << "manual_backward with automatic optimization was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("set_automatic_optimization(false)"), std::string::npos) << e.what();
  }
  TinyModule manual({.manual = true});
  try {
    manual.optimizers();
    FAIL() << "optimizers() outside fit was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside fit's training"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace volt
