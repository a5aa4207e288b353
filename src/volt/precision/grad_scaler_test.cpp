#include "volt/precision/grad_scaler.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>

#include "volt/core/error.h"

namespace volt {
namespace {

/// One parameter w with loss = sum(w * x): its gradient is x, so tests choose the gradient.
struct OneParameter {
  torch::Tensor w = torch::ones({3}).requires_grad_(true);
  torch::optim::SGD optimizer{std::vector<torch::Tensor>{w}, torch::optim::SGDOptions(0.1)};

  torch::Tensor loss(const torch::Tensor& x) const { return (w * x).sum(); }
};

TEST(GradScaler, DefaultsArePyTorchs) {
  const GradScalerOptions o;
  EXPECT_EQ(o.init_scale, 65536.0);
  EXPECT_EQ(o.growth_factor, 2.0);
  EXPECT_EQ(o.backoff_factor, 0.5);
  EXPECT_EQ(o.growth_interval, 2000);
  EXPECT_EQ(GradScaler().get_scale(), 65536.0);
}

TEST(GradScaler, ScalesTheLoss) {
  GradScaler scaler({.init_scale = 8.0});
  EXPECT_EQ(scaler.scale(torch::tensor(1.5)).item<double>(), 12.0);
}

TEST(GradScaler, ScalesAFloat16LossInFloat32) {
  const torch::Tensor scaled = GradScaler().scale(torch::tensor(2.0, torch::kHalf));
  EXPECT_EQ(scaled.scalar_type(), torch::kFloat32);
  EXPECT_EQ(scaled.item<double>(), 131072.0);
}

TEST(GradScaler, UnscaleBeforeClippingSeesTheTrueGradient) {
  OneParameter p;
  GradScaler scaler({.init_scale = 1024.0});
  scaler.scale(p.loss(torch::tensor({3.0, 4.0, 0.0}))).backward();
  EXPECT_TRUE(torch::allclose(p.w.grad(), torch::tensor({3072.0, 4096.0, 0.0})));
  scaler.unscale_(p.optimizer);
  EXPECT_TRUE(torch::allclose(p.w.grad(), torch::tensor({3.0, 4.0, 0.0})));
  // Clipping now works in true units: norm 5 clipped to 1.
  const double norm = torch::nn::utils::clip_grad_norm_(std::vector<torch::Tensor>{p.w}, 1.0);
  EXPECT_NEAR(norm, 5.0, 1e-5);
  EXPECT_TRUE(scaler.step(p.optimizer));
  EXPECT_TRUE(torch::allclose(p.w.detach(), torch::tensor({1.0 - 0.1 * 0.6, 1.0 - 0.1 * 0.8, 1.0}), 1e-5, 1e-5));
  scaler.update();
}

TEST(GradScaler, ASyncedInfFromAnotherShardSkipsThisProcesssStepToo) {
  // fsdp: this process's shard of the gradients is finite, another's overflowed; the sync (max
  // across processes) makes this one skip the step and back off as the other does.
  OneParameter p;
  GradScaler scaler({.init_scale = 1024.0});
  std::vector<float> seen;
  scaler.set_found_inf_sync([&seen](torch::Tensor& found) {
    seen.push_back(found.item<float>());
    found.fill_(1.0);  // what the other process reported
  });
  scaler.scale(p.loss(torch::tensor({1.0, 2.0, 3.0}))).backward();
  EXPECT_FALSE(scaler.step(p.optimizer));
  scaler.update();
  EXPECT_EQ(seen, std::vector<float>{0.0F});  // this process's own flag went into the sync
  EXPECT_TRUE(torch::equal(p.w.detach(), torch::ones({3})));
  EXPECT_EQ(scaler.get_scale(), 512.0);
  // Every process finite: the step happens.
  scaler.set_found_inf_sync([](torch::Tensor&) {});
  p.optimizer.zero_grad();
  scaler.scale(p.loss(torch::tensor({1.0, 2.0, 3.0}))).backward();
  EXPECT_TRUE(scaler.step(p.optimizer));
}

TEST(GradScaler, OverflowSkipsTheStepAndHalvesTheScale) {
  OneParameter p;
  GradScaler scaler({.init_scale = 1024.0, .growth_interval = 3});
  const float inf = std::numeric_limits<float>::infinity();
  scaler.scale(p.loss(torch::tensor({1.0f, inf, 1.0f}))).backward();
  EXPECT_FALSE(scaler.step(p.optimizer));
  scaler.update();
  EXPECT_TRUE(torch::equal(p.w.detach(), torch::ones({3})));
  EXPECT_EQ(scaler.get_scale(), 512.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScaler, NanAlsoSkipsTheStep) {
  OneParameter p;
  GradScaler scaler({.init_scale = 4.0});
  scaler.scale(p.loss(torch::tensor({1.0f, std::numeric_limits<float>::quiet_NaN(), 1.0f}))).backward();
  EXPECT_FALSE(scaler.step(p.optimizer));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 2.0);
}

TEST(GradScaler, GrowsAfterGrowthIntervalFiniteSteps) {
  OneParameter p;
  GradScaler scaler({.init_scale = 16.0, .growth_interval = 3});
  for (int step = 1; step <= 3; ++step) {
    p.optimizer.zero_grad();
    scaler.scale(p.loss(torch::ones({3}))).backward();
    EXPECT_TRUE(scaler.step(p.optimizer));
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), step < 3 ? 16.0 : 32.0) << "after step " << step;
    EXPECT_EQ(scaler.growth_tracker(), step < 3 ? step : 0);
  }
}

TEST(GradScaler, AnOverflowRestartsTheGrowthCount) {
  OneParameter p;
  GradScaler scaler({.init_scale = 16.0, .growth_interval = 2});
  const auto iteration = [&](float g) {
    p.optimizer.zero_grad();
    scaler.scale(p.loss(torch::full({3}, g))).backward();
    scaler.step(p.optimizer);
    scaler.update();
  };
  iteration(1.0f);
  iteration(std::numeric_limits<float>::infinity());
  EXPECT_EQ(scaler.get_scale(), 8.0);
  iteration(1.0f);
  EXPECT_EQ(scaler.get_scale(), 8.0);
  iteration(1.0f);
  EXPECT_EQ(scaler.get_scale(), 16.0);
}

TEST(GradScaler, UnscalingTwiceInOneStepIsAnError) {
  OneParameter p;
  GradScaler scaler;
  scaler.scale(p.loss(torch::ones({3}))).backward();
  scaler.unscale_(p.optimizer);
  EXPECT_THROW(scaler.unscale_(p.optimizer), Error);
  EXPECT_TRUE(scaler.step(p.optimizer));  // does not unscale again
  EXPECT_TRUE(torch::allclose(p.w.detach(), torch::full({3}, 0.9)));
  EXPECT_THROW(scaler.step(p.optimizer), Error);
  scaler.update();
}

TEST(GradScaler, UpdateWithoutAStepIsAnError) {
  GradScaler scaler;
  EXPECT_THROW(scaler.update(), Error);
}

TEST(GradScaler, StateDictHasPyTorchsKeysAndRoundTrips) {
  OneParameter p;
  GradScaler scaler({.init_scale = 16.0, .growth_interval = 5});
  scaler.scale(p.loss(torch::ones({3}))).backward();
  scaler.step(p.optimizer);
  scaler.update();
  const auto state = scaler.state_dict();
  EXPECT_EQ(state.at("scale").toDouble(), 16.0);
  EXPECT_EQ(state.at("growth_factor").toDouble(), 2.0);
  EXPECT_EQ(state.at("backoff_factor").toDouble(), 0.5);
  EXPECT_EQ(state.at("growth_interval").toInt(), 5);
  EXPECT_EQ(state.at("_growth_tracker").toInt(), 1);

  GradScaler restored;
  restored.load_state_dict(state);
  EXPECT_EQ(restored.get_scale(), 16.0);
  EXPECT_EQ(restored.growth_tracker(), 1);
  EXPECT_EQ(restored.options().growth_interval, 5);
}

TEST(GradScaler, LoadingStateWithoutAKeyNamesIt) {
  auto state = GradScaler().state_dict();
  ASSERT_EQ(state.erase("_growth_tracker"), 1u);
  try {
    GradScaler().load_state_dict(state);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'_growth_tracker'"), std::string::npos) << e.what();
  }
}

TEST(GradScaler, BadOptionsAreErrors) {
  EXPECT_THROW(GradScaler({.init_scale = 0.0}), Error);
  EXPECT_THROW(GradScaler({.backoff_factor = 1.5}), Error);
  EXPECT_THROW(GradScaler({.growth_interval = 0}), Error);
}

}  // namespace
}  // namespace volt
