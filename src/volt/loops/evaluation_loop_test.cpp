#include "volt/loops/evaluation_loop.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>

#include "volt/data/data_loader.h"
#include "volt/loops/prediction_loop.h"
#include "volt/module/lightning_module.h"
#include "volt/module/result_collection.h"
#include "volt/precision/precision_plugin.h"
#include "volt/strategies/strategy.h"

namespace volt {
namespace {

/// Logs its loss in validation_step and throws at batch `throw_at` (-1: never).
struct Probe : LightningModule {
  torch::nn::Linear layer = register_module("layer", torch::nn::Linear(2, 1));
  int64_t throw_at = -1;
  int64_t epoch_starts = 0;
  int64_t epoch_ends = 0;

  torch::Tensor training_step(const Batch& batch, int64_t) override {
    return torch::mse_loss(layer(batch.data), batch.target);
  }
  void validation_step(const Batch& batch, int64_t batch_idx) override {
    EXPECT_FALSE(is_training()) << "validation runs in eval mode";
    EXPECT_FALSE(torch::GradMode::is_enabled()) << "validation runs without gradients";
    if (batch_idx == throw_at) throw std::runtime_error("validation_step failed");
    log("val/loss", torch::mse_loss(layer(batch.data), batch.target));
  }
  void on_validation_epoch_start() override { ++epoch_starts; }
  void on_validation_epoch_end() override { ++epoch_ends; }
  OptimizerConfig configure_optimizers() override { return std::make_shared<torch::optim::SGD>(parameters(), 0.1); }
};

class EvaluationLoopTest : public ::testing::Test {
 protected:
  EvaluationLoopTest() {
    torch::manual_seed(0);
    const auto x = torch::randn({12, 2});
    loader_ = DataLoader(std::make_shared<TensorDataset>(x, x.sum(1, true)), {.batch_size = 4});
    loader_.configure(1, 0, 0, /*pad=*/false);
    loader_.set_epoch(0);
  }

  SingleDeviceStrategy strategy_;
  std::unique_ptr<PrecisionPlugin> precision_ = make_precision_plugin(Precision::k32True, c10::DeviceType::CPU);
  DataLoader loader_;
};

TEST_F(EvaluationLoopTest, RunsEveryBatchAndCountsEveryExampleOnce) {
  Probe module;
  ResultCollection results(/*training=*/false);
  EvaluationLoop loop(strategy_, *precision_, c10::Device(c10::kCPU), nullptr);
  EXPECT_EQ(loop.run(module, loader_, 3, EvalStage::kValidation, results).examples, 12);
  EXPECT_EQ(module.epoch_starts, 1);
  EXPECT_EQ(module.epoch_ends, 1);
  EXPECT_EQ(results.epoch_metrics(MetricTarget::kCallback).count("val/loss"), 1u);
  EXPECT_TRUE(module.is_training()) << "the module's mode comes back";
  EXPECT_EQ(module.metric_sink(), nullptr) << "the sink comes back";
}

TEST_F(EvaluationLoopTest, AThrowingStepLeavesTheModuleAsItWas) {
  Probe module;
  module.throw_at = 1;
  ResultCollection outer(/*training=*/true);
  const MetricSinkScope sink(module, &outer);  // as during a training epoch's mid-epoch validation
  {
    ResultCollection results(/*training=*/false);
    EvaluationLoop loop(strategy_, *precision_, c10::Device(c10::kCPU), nullptr);
    EXPECT_THROW(loop.run(module, loader_, 3, EvalStage::kValidation, results), std::runtime_error);
  }
  // Before the scopes, the module kept a pointer to the destroyed `results` and stayed in eval
  // mode; a later log() would have written through a dangling pointer.
  EXPECT_EQ(module.metric_sink(), &outer);
  EXPECT_TRUE(module.is_training());
}

TEST_F(EvaluationLoopTest, PredictionRestoresTheModeAndReturnsOneOutputPerBatch) {
  struct Predictor : Probe {
    torch::Tensor predict_step(const Batch& batch, int64_t) override {
      EXPECT_FALSE(is_training());
      return layer(batch.data);
    }
  } module;
  PredictionLoop loop(strategy_, *precision_, c10::Device(c10::kCPU));
  const auto outputs = loop.run(module, loader_, 3, /*gather=*/false);
  ASSERT_EQ(outputs.size(), 3u);
  EXPECT_EQ(outputs[0].size(0), 4);
  EXPECT_TRUE(module.is_training());
}

}  // namespace
}  // namespace volt
