#include "volt/strategies/fsdp_unit.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>

#include "volt/core/error.h"

namespace volt {
namespace {

/// Records the calls a strategy's hooks would get.
class RecordingHooks : public FsdpUnitHooks {
 public:
  void before_forward() override { calls += "before;"; }
  void after_forward(const torch::Tensor& output) override {
    calls += "after;";
    last_output = output;
  }
  std::string calls;
  torch::Tensor last_output;
};

TEST(FsdpUnit, KeepsTheWrappedModulesNamesSoCheckpointsReadTheSame) {
  torch::manual_seed(0);
  torch::nn::Sequential plain(torch::nn::Linear(4, 3), torch::nn::ReLU(), torch::nn::BatchNorm1d(3));
  torch::manual_seed(0);
  torch::nn::Sequential wrapped(FsdpUnit(torch::nn::Linear(4, 3)), torch::nn::ReLU(),
                                FsdpUnit(torch::nn::BatchNorm1d(3)));
  std::vector<std::string> plain_names, wrapped_names;
  for (const auto& item : plain->named_parameters()) plain_names.push_back(item.key());
  for (const auto& item : wrapped->named_parameters()) wrapped_names.push_back(item.key());
  EXPECT_EQ(wrapped_names, plain_names);
  std::vector<std::string> plain_buffers, wrapped_buffers;
  for (const auto& item : plain->named_buffers()) plain_buffers.push_back(item.key());
  for (const auto& item : wrapped->named_buffers()) wrapped_buffers.push_back(item.key());
  EXPECT_EQ(wrapped_buffers, plain_buffers);
  // Same draws, same values, same outputs.
  const torch::Tensor x = torch::randn({5, 4});
  EXPECT_TRUE(torch::equal(wrapped->forward(x), plain->forward(x)));
}

TEST(FsdpUnit, SharesTheWrappedModulesTensorsSoSetDataReachesThem) {
  torch::nn::Linear linear(2, 2);
  FsdpUnit unit(linear);
  const torch::Tensor replacement = torch::ones({2, 2});
  unit->named_parameters()["weight"].set_data(replacement);
  EXPECT_TRUE(torch::equal(linear->weight, replacement));
}

TEST(FsdpUnit, CallsTheAttachedHooksAroundTheForwardAndNothingWhenDetached) {
  FsdpUnit unit(torch::nn::Linear(3, 2));
  const auto hooks = std::make_shared<RecordingHooks>();
  unit->attach(hooks);
  EXPECT_TRUE(unit->attached());
  const torch::Tensor y = unit(torch::randn({4, 3}));
  EXPECT_EQ(hooks->calls, "before;after;");
  EXPECT_TRUE(hooks->last_output.is_same(y));
  unit->attach(nullptr);
  (void)unit(torch::randn({4, 3}));
  EXPECT_EQ(hooks->calls, "before;after;");
}

/// A module whose forward takes two tensors (so only call() reaches it).
struct AddImpl : torch::nn::Module {
  AddImpl() { scale = register_parameter("scale", torch::ones({1})); }
  torch::Tensor forward(const torch::Tensor& a, const torch::Tensor& b) { return (a + b) * scale; }
  torch::Tensor scale;
};
TORCH_MODULE(Add);

TEST(FsdpUnit, CallPassesAnyArgumentsToTheWrappedForward) {
  FsdpUnit unit(Add{});
  const auto hooks = std::make_shared<RecordingHooks>();
  unit->attach(hooks);
  const torch::Tensor out = unit->call(torch::ones({2}), torch::full({2}, 2.0));
  EXPECT_TRUE(torch::equal(out, torch::full({2}, 3.0)));
  EXPECT_EQ(hooks->calls, "before;after;");
}

TEST(FsdpUnit, TrainAndEvalReachTheWrappedModule) {
  torch::nn::Dropout dropout(0.5);
  FsdpUnit unit(dropout);
  unit->eval();
  EXPECT_FALSE(dropout->is_training());
  unit->train();
  EXPECT_TRUE(dropout->is_training());
}

TEST(FsdpUnit, ClonesIntoAnIndependentUnitWithoutHooks) {
  FsdpUnit unit(torch::nn::Sequential(torch::nn::Linear(2, 2), torch::nn::Tanh()));
  unit->attach(std::make_shared<RecordingHooks>());
  const auto copy = std::dynamic_pointer_cast<FsdpUnitImpl>(unit->clone());
  ASSERT_NE(copy, nullptr);
  EXPECT_FALSE(copy->attached());
  const torch::Tensor x = torch::randn({3, 2});
  EXPECT_TRUE(torch::allclose(copy->forward(x), unit->forward(x)));
  torch::NoGradGuard no_grad;
  copy->parameters()[0].add_(1.0);
  EXPECT_FALSE(torch::equal(copy->parameters()[0], unit->parameters()[0]));
  std::ostringstream printed;
  unit->pretty_print(printed);
  EXPECT_EQ(printed.str().rfind("volt::FsdpUnit(torch::nn::Sequential", 0), 0u) << printed.str();
}

TEST(FsdpUnit, CountsTheElementsItHolds) {
  FsdpUnit unit(torch::nn::Linear(4, 3));
  EXPECT_EQ(unit->numel(), 4 * 3 + 3);
}

TEST(FsdpUnit, RefusesAnEmptyModule) {
  EXPECT_THROW(FsdpUnitImpl{torch::nn::AnyModule()}, Error);
  EXPECT_THROW(FsdpUnitImpl{torch::nn::Sequential(nullptr)}, Error);
}

}  // namespace
}  // namespace volt
