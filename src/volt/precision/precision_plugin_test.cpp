#include "volt/precision/precision_plugin.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>

#include "volt/core/error.h"
#include "volt/precision/autocast_compat.h"

namespace volt {
namespace {

using Optimizers = std::vector<std::shared_ptr<torch::optim::Optimizer>>;

/// A 16-mixed plugin as a CUDA build makes it; its scaler runs on CPU tensors here (CPU has no
/// float16 autocast in LibTorch 1.13, but the scaling logic is device-independent).
std::unique_ptr<PrecisionPlugin> sixteen_mixed(GradScalerOptions options = {}) {
  return make_precision_plugin(Precision::k16Mixed, c10::DeviceType::CUDA, options);
}

TEST(PrecisionPlugin, Bf16MixedRunsLinearLayersInBf16OnCpu) {
  const auto plugin = make_precision_plugin(Precision::kBf16Mixed, c10::DeviceType::CPU);
  torch::nn::Linear linear(4, 2);
  const torch::Tensor x = torch::randn({3, 4});
  {
    const AutocastGuard autocast = plugin->forward_context();
    EXPECT_TRUE(autocast.active());
    EXPECT_EQ(linear(x).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(linear(x).scalar_type(), torch::kFloat32);
  EXPECT_FALSE(compat::autocast_enabled(c10::DeviceType::CPU));
  EXPECT_EQ(linear->weight.scalar_type(), torch::kFloat32);  // weights stay float32
}

TEST(PrecisionPlugin, NestedGuardsRestoreTheOuterState) {
  {
    const AutocastGuard outer(c10::DeviceType::CPU, at::kBFloat16);
    { const AutocastGuard inner = make_precision_plugin(Precision::k32True, c10::DeviceType::CPU)->forward_context(); }
    EXPECT_TRUE(compat::autocast_enabled(c10::DeviceType::CPU));
  }
  EXPECT_FALSE(compat::autocast_enabled(c10::DeviceType::CPU));
}

TEST(PrecisionPlugin, Bf16MixedTrainingLowersTheLoss) {
  torch::manual_seed(0);
  const auto plugin = make_precision_plugin(Precision::kBf16Mixed, c10::DeviceType::CPU);
  torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 1));
  const Optimizers optimizers{std::make_shared<torch::optim::Adam>(model->parameters(), 1e-2)};
  const torch::Tensor x = torch::randn({256, 8});
  const torch::Tensor y = x.sum(1, true);
  std::vector<double> losses;
  for (int step = 0; step < 60; ++step) {
    torch::Tensor loss;
    {
      const AutocastGuard autocast = plugin->forward_context();
      loss = torch::mse_loss(model->forward(x).to(torch::kFloat32), y);
    }
    plugin->backward(loss);
    EXPECT_TRUE(plugin->optimizer_step(
        optimizers, [] {}, [](size_t) {}));
    optimizers[0]->zero_grad();
    losses.push_back(loss.item<double>());
  }
  EXPECT_LT(losses.back(), 0.25 * losses.front()) << losses.front() << " -> " << losses.back();
  EXPECT_TRUE(plugin->state_dict().empty());  // bf16 needs no loss scaling
}

TEST(PrecisionPlugin, SixteenMixedUnscalesBeforeClippingAndSkipsOverflow) {
  const auto plugin = sixteen_mixed({.init_scale = 256.0});
  ASSERT_NE(plugin->scaler(), nullptr);
  torch::Tensor w = torch::ones({2}).requires_grad_(true);
  const Optimizers optimizers{std::make_shared<torch::optim::SGD>(std::vector<torch::Tensor>{w}, 1.0)};

  plugin->backward((w * torch::tensor({3.0f, 4.0f})).sum());
  EXPECT_TRUE(torch::allclose(w.grad(), torch::tensor({768.0f, 1024.0f})));
  torch::Tensor seen_by_clip;
  int before_step_calls = 0;
  EXPECT_TRUE(plugin->optimizer_step(
      optimizers, [&] { seen_by_clip = w.grad().clone(); }, [&](size_t) { ++before_step_calls; }));
  EXPECT_TRUE(torch::allclose(seen_by_clip, torch::tensor({3.0f, 4.0f})));
  EXPECT_TRUE(torch::allclose(w.detach(), torch::tensor({-2.0f, -3.0f})));
  EXPECT_EQ(before_step_calls, 1);

  optimizers[0]->zero_grad();
  plugin->backward((w * std::numeric_limits<float>::infinity()).sum());
  EXPECT_FALSE(plugin->optimizer_step(
      optimizers, [] {}, [](size_t) {}));
  EXPECT_TRUE(torch::allclose(w.detach(), torch::tensor({-2.0f, -3.0f})));
  EXPECT_EQ(plugin->scaler()->get_scale(), 128.0);
  EXPECT_EQ(plugin->state_dict().at("scale").toDouble(), 128.0);
}

TEST(PrecisionPlugin, SixteenMixedStateRoundTrips) {
  const auto saved = sixteen_mixed({.init_scale = 256.0});
  torch::Tensor w = torch::ones({2}).requires_grad_(true);
  const Optimizers optimizers{std::make_shared<torch::optim::SGD>(std::vector<torch::Tensor>{w}, 1.0)};
  saved->backward((w * std::numeric_limits<float>::infinity()).sum());
  saved->optimizer_step(
      optimizers, [] {}, [](size_t) {});
  const auto restored = sixteen_mixed();
  restored->load_state_dict(saved->state_dict());
  EXPECT_EQ(restored->scaler()->get_scale(), 128.0);
}

TEST(PrecisionPlugin, TrueModesCastTheModuleAndFloatingInputs) {
  for (const auto& [precision, dtype] :
       {std::pair{Precision::kBf16True, torch::kBFloat16}, std::pair{Precision::k64True, torch::kFloat64}}) {
    const auto plugin = make_precision_plugin(precision, c10::DeviceType::CPU);
    torch::nn::Linear linear(4, 2);
    plugin->convert_module(*linear);
    EXPECT_EQ(linear->weight.scalar_type(), dtype) << to_string(precision);
    const torch::Tensor x = plugin->convert_input(torch::randn({3, 4}));
    EXPECT_EQ(x.scalar_type(), dtype);
    EXPECT_EQ(linear(x).scalar_type(), dtype);
    EXPECT_EQ(plugin->convert_input(torch::ones({3}, torch::kLong)).scalar_type(), torch::kLong);
    EXPECT_FALSE(plugin->forward_context().active());
  }
}

TEST(PrecisionPlugin, FullPrecisionClipsThenSteps) {
  const auto plugin = make_precision_plugin(Precision::k32True, c10::DeviceType::CPU);
  EXPECT_EQ(plugin->precision(), Precision::k32True);
  torch::Tensor w = torch::ones({1}).requires_grad_(true);
  const Optimizers optimizers{std::make_shared<torch::optim::SGD>(std::vector<torch::Tensor>{w}, 1.0)};
  plugin->backward((w * 10).sum());
  std::vector<std::string> calls;
  plugin->optimizer_step(
      optimizers,
      [&] {
        calls.push_back("clip");
        torch::nn::utils::clip_grad_value_(std::vector<torch::Tensor>{w}, 1.0);
      },
      [&](size_t i) { calls.push_back("before_step " + std::to_string(i)); });
  EXPECT_EQ(calls, (std::vector<std::string>{"clip", "before_step 0"}));
  EXPECT_FLOAT_EQ(w.item<float>(), 0.0f);
  EXPECT_FALSE(plugin->scaler());
}

#if !VOLT_TORCH_CPU_FLOAT16
TEST(PrecisionPlugin, SixteenMixedOnCpuIsAnErrorNamingBf16Mixed) {
  try {
    make_precision_plugin(Precision::k16Mixed, c10::DeviceType::CPU);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'bf16-mixed'"), std::string::npos) << e.what();
  }
}
#endif

}  // namespace
}  // namespace volt
