#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "volt/callbacks/callback.h"
#include "volt/core/testing.h"
#include "volt/loops/automatic_optimization_loop.h"
#include "volt/loops/manual_optimization_loop.h"
#include "volt/loops/step_feed.h"
#include "volt/module/lightning_module.h"
#include "volt/precision/precision_plugin.h"
#include "volt/profiler/profiler.h"
#include "volt/strategies/strategy.h"

namespace volt {
namespace {

/// A linear regression that records its optimization hooks; under manual optimization its
/// training_step backpropagates and steps its one optimizer.
struct Recorder : LightningModule {
  torch::nn::Linear layer = register_module("layer", torch::nn::Linear(2, 1));
  std::vector<std::string> calls;
  bool detach = false;  // training_step returns a loss without a graph

  explicit Recorder(bool automatic = true) { set_automatic_optimization(automatic); }

  torch::Tensor training_step(const Batch& batch, int64_t) override {
    calls.emplace_back("training_step");
    torch::Tensor loss = torch::mse_loss(layer(batch.data), batch.target);
    if (automatic_optimization()) return detach ? loss.detach() : loss;
    manual_backward(loss);
    optimizers()[0].step();
    return loss;
  }
  void on_before_backward(const torch::Tensor&) override { calls.emplace_back("on_before_backward"); }
  void on_after_backward() override { calls.emplace_back("on_after_backward"); }
  void on_before_optimizer_step(torch::optim::Optimizer&, size_t) override {
    calls.emplace_back("on_before_optimizer_step");
  }
  void on_before_zero_grad(torch::optim::Optimizer&) override { calls.emplace_back("on_before_zero_grad"); }
  OptimizerConfig configure_optimizers() override { return std::make_shared<torch::optim::SGD>(parameters(), 0.1); }
};

/// Counts the hooks dispatched to the callbacks.
struct CountingDispatcher : CallbackDispatcher {
  int64_t count = 0;
  void dispatch(const CallbackHook&, const HookPoint&) override { ++count; }
};

class OptimizationLoopTest : public ::testing::Test {
 protected:
  OptimizationLoopTest() {
    torch::manual_seed(0);
    input_.batch = Batch{.data = torch::randn({4, 2}), .target = torch::randn({4, 1})};
  }

  /// The gradients of `module`'s weight for `input_`'s whole loss, computed apart.
  torch::Tensor whole_gradient(Recorder& module) {
    torch::Tensor loss = torch::mse_loss(module.layer(input_.batch.data), input_.batch.target);
    const torch::Tensor grad = torch::autograd::grad({loss}, {module.layer->weight})[0];
    return grad;
  }

  StepParts parts(Recorder& module, const OptimizerConfig& optimization) {
    return {strategy_, *precision_, module, optimization, profiler_};
  }

  SingleDeviceStrategy strategy_;
  std::unique_ptr<PrecisionPlugin> precision_ = make_precision_plugin(Precision::k32True, c10::DeviceType::CPU);
  Profiler profiler_;
  std::map<std::string, double> callback_metrics_;
  CountingDispatcher callbacks_;
  FitProgress progress_;
  StepInput input_;
};

TEST_F(OptimizationLoopTest, AutomaticAccumulatesScaledGradientsThenStepsAtTheWindowsEnd) {
  Recorder module;
  const OptimizerConfig optimization = module.configure_optimizers();
  AutomaticOptimizationLoop loop(parts(module, optimization), callback_metrics_, std::nullopt,
                                 GradientClipAlgorithm::kNorm);
  const torch::Tensor before = module.layer->weight.clone();
  const torch::Tensor expected = whole_gradient(module) / 2;
  loop.run(
      input_.batch, 0, input_, /*accumulate=*/2, [] { return false; }, progress_, callbacks_);
  EXPECT_TRUE(torch::allclose(module.layer->weight.grad(), expected)) << "the loss is divided by accumulate";
  EXPECT_TRUE(torch::equal(module.layer->weight, before)) << "no step inside the window";
  EXPECT_EQ(progress_.global_step, 0);
  EXPECT_EQ(module.calls, (std::vector<std::string>{"training_step", "on_before_backward", "on_after_backward"}));

  module.calls.clear();
  loop.run(
      input_.batch, 1, input_, /*accumulate=*/2, [] { return false; }, progress_, callbacks_);
  EXPECT_FALSE(torch::equal(module.layer->weight, before));
  EXPECT_EQ(progress_.global_step, 1);
  EXPECT_EQ(module.calls, (std::vector<std::string>{"training_step", "on_before_backward", "on_after_backward",
                                                    "on_before_optimizer_step", "on_before_zero_grad"}));
  EXPECT_EQ(callbacks_.count, 6) << "the callbacks hear every hook the module does, except training_step";
}

TEST_F(OptimizationLoopTest, AutomaticStepsAtThePassesLastBatchInsideAWindow) {
  Recorder module;
  const OptimizerConfig optimization = module.configure_optimizers();
  AutomaticOptimizationLoop loop(parts(module, optimization), callback_metrics_, std::nullopt,
                                 GradientClipAlgorithm::kNorm);
  int64_t asked = 0;
  loop.run(
      input_.batch, 0, input_, /*accumulate=*/4, [&] { return ++asked > 0; }, progress_, callbacks_);
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(progress_.global_step, 1);
}

TEST_F(OptimizationLoopTest, AutomaticJoinedStepBackpropagatesZerosWithoutHooks) {
  Recorder module;
  const OptimizerConfig optimization = module.configure_optimizers();
  AutomaticOptimizationLoop loop(parts(module, optimization), callback_metrics_, std::nullopt,
                                 GradientClipAlgorithm::kNorm);
  input_.joined = true;
  input_.weight = 0.0;
  loop.run(
      input_.batch, 0, input_, /*accumulate=*/2, [] { return false; }, progress_, callbacks_);
  EXPECT_TRUE(torch::equal(module.layer->weight.grad(), torch::zeros_like(module.layer->weight)));
  EXPECT_EQ(module.calls, std::vector<std::string>{"training_step"});
  EXPECT_EQ(callbacks_.count, 0);
}

TEST_F(OptimizationLoopTest, AutomaticRefusesALossWithoutAGraph) {
  Recorder module;
  module.detach = true;
  const OptimizerConfig optimization = module.configure_optimizers();
  AutomaticOptimizationLoop loop(parts(module, optimization), callback_metrics_, std::nullopt,
                                 GradientClipAlgorithm::kNorm);
  const std::string message = testing::error_message([&] {
    loop.run(
        input_.batch, 0, input_, 1, [] { return false; }, progress_, callbacks_);
  });
  EXPECT_NE(message.find("must return a scalar loss that requires grad"), std::string::npos) << message;
}

TEST_F(OptimizationLoopTest, ManualStepsThroughTheLoopWhileItsScopeLives) {
  Recorder module(/*automatic=*/false);
  const OptimizerConfig optimization = module.configure_optimizers();
  ManualOptimizationLoop loop(parts(module, optimization), 1, std::nullopt, StrategyKind::kSingleDevice);
  const torch::Tensor before = module.layer->weight.clone();
  loop.start_epoch(progress_, callbacks_);
  {
    const ManualOptimizationScope scope(module, &loop);
    loop.run(input_.batch, 0, input_);
  }
  EXPECT_FALSE(torch::equal(module.layer->weight, before));
  EXPECT_EQ(progress_.global_step, 1);
  EXPECT_EQ(module.calls, (std::vector<std::string>{"training_step", "on_before_backward", "on_after_backward",
                                                    "on_before_optimizer_step"}));
  EXPECT_EQ(callbacks_.count, 3);
  const std::string message = testing::error_message([&] { module.optimizers(); });
  EXPECT_NE(message.find("outside fit's training"), std::string::npos) << "the scope cleared the loop: " << message;
}

TEST_F(OptimizationLoopTest, ManualRefusesWhatTheModuleDecidesAndThreadedStrategies) {
  Recorder module(/*automatic=*/false);
  const OptimizerConfig optimization = module.configure_optimizers();
  const auto error = [&](int64_t accumulate, std::optional<double> clip, StrategyKind strategy) {
    return testing::error_message(
        [&] { const ManualOptimizationLoop refused(parts(module, optimization), accumulate, clip, strategy); });
  };
  EXPECT_NE(error(2, std::nullopt, StrategyKind::kDdp).find("accumulate_grad_batches=2"), std::string::npos);
  EXPECT_NE(error(1, 1.0, StrategyKind::kDdp).find("gradient_clip_val=1"), std::string::npos);
  EXPECT_NE(error(1, std::nullopt, StrategyKind::kDp).find("strategy 'dp' cannot run"), std::string::npos);
  ManualOptimizationLoop loop(parts(module, optimization), 1, std::nullopt, StrategyKind::kDdp);
  EXPECT_NE(
      testing::error_message([&] { loop.check_accumulation(4, 3); }).find("accumulate_grad_batches=4 for epoch 3"),
      std::string::npos);
}

}  // namespace
}  // namespace volt
