#include "volt/pipeline/balance.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <random>

#include "volt/core/error.h"

namespace volt {
namespace {

std::vector<LayerCost> costs_of(const std::vector<double>& seconds) {
  std::vector<LayerCost> out;
  for (const double s : seconds) out.push_back({.seconds = s, .parameter_bytes = 100, .activation_bytes = 10});
  return out;
}

double slowest(const std::vector<LayerCost>& costs, const std::vector<int64_t>& balance) {
  const std::vector<double> stages = stage_seconds(costs, balance);
  return *std::max_element(stages.begin(), stages.end());
}

// Every split of n layers into k non-empty stages, by brute force.
void all_balances(int64_t n, int64_t k, std::vector<int64_t>& prefix, std::vector<std::vector<int64_t>>& out) {
  if (k == 1) {
    prefix.push_back(n);
    out.push_back(prefix);
    prefix.pop_back();
    return;
  }
  for (int64_t first = 1; first <= n - (k - 1); ++first) {
    prefix.push_back(first);
    all_balances(n - first, k - 1, prefix, out);
    prefix.pop_back();
  }
}

TEST(BalanceTest, AnEightTimesSlowerLayerGetsAStageOfItsOwn) {
  // Layer 2 is 8x the others: with 3 stages the best split isolates it.
  const std::vector<LayerCost> costs = costs_of({1, 1, 8, 1, 1, 1, 1});
  const std::vector<int64_t> balance = balance_by_time(costs, 3);
  EXPECT_EQ(balance, (std::vector<int64_t>{2, 1, 4}));
  EXPECT_DOUBLE_EQ(slowest(costs, balance), 8.0);
}

TEST(BalanceTest, MatchesTheBestPartitionFoundByBruteForce) {
  std::mt19937 random(3);
  for (int trial = 0; trial < 100; ++trial) {
    const int64_t n = 1 + static_cast<int64_t>(random() % 9);
    const int64_t k = 1 + static_cast<int64_t>(random() % n);
    std::vector<double> seconds;
    for (int64_t i = 0; i < n; ++i) seconds.push_back(1 + static_cast<double>(random() % 20));
    const std::vector<LayerCost> costs = costs_of(seconds);
    std::vector<int64_t> prefix;
    std::vector<std::vector<int64_t>> every;
    all_balances(n, k, prefix, every);
    double best = 1e300;
    for (const auto& b : every) best = std::min(best, slowest(costs, b));
    const std::vector<int64_t> found = balance_by_time(costs, k);
    ASSERT_EQ(static_cast<int64_t>(found.size()), k);
    ASSERT_DOUBLE_EQ(slowest(costs, found), best) << "n=" << n << " k=" << k;
  }
}

TEST(BalanceTest, AMemoryLimitMovesLayersOffAFullStage) {
  // Equal times, but the first two layers hold 1000 bytes each: a 1500-byte limit cannot keep
  // them together, whatever the time says.
  std::vector<LayerCost> costs = costs_of({1, 1, 1, 1});
  costs[0].parameter_bytes = costs[1].parameter_bytes = 1000;
  const std::vector<int64_t> balance = balance_by_time(costs, 2, /*memory_limit=*/1500);
  EXPECT_EQ(balance[0], 1);
  // Micro-batches multiply the activations a stage keeps: 4 x 10 bytes more per layer.
  EXPECT_THROW(balance_by_time(costs, 2, /*memory_limit=*/1000, /*micro_batches=*/4), Error);
  try {
    balance_by_time(costs, 2, 500);
    FAIL() << "a limit below the largest layer was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("memory_limit=500"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("HINT"), std::string::npos);
  }
}

TEST(BalanceTest, RefusesImpossibleStageCountsAndBadBalances) {
  EXPECT_THROW(balance_by_time(costs_of({1, 1}), 3), Error);
  EXPECT_THROW(balance_by_time(costs_of({1, 1}), 0), Error);
  EXPECT_THROW(check_balance({2, 0, 1}, 3), Error);
  EXPECT_THROW(check_balance({2, 2}, 3), Error);
  EXPECT_NO_THROW(check_balance({2, 1}, 3));
}

TEST(BalanceTest, ProfilingMeasuresEachLayerAndLeavesGradientsAlone) {
  torch::manual_seed(0);
  torch::nn::Sequential layers(torch::nn::Linear(16, 512), torch::nn::ReLU(), torch::nn::Linear(512, 4));
  const std::vector<LayerCost> costs = profile_layers(layers, torch::randn({32, 16}), 2);
  ASSERT_EQ(costs.size(), 3U);
  EXPECT_EQ(costs[0].parameter_bytes, 2 * (16 * 512 + 512) * 4);
  EXPECT_EQ(costs[1].parameter_bytes, 0);
  EXPECT_EQ(costs[1].activation_bytes, 32 * 512 * 4);
  EXPECT_EQ(costs[2].activation_bytes, 32 * 4 * 4);
  for (const LayerCost& c : costs) EXPECT_GT(c.seconds, 0.0);
  for (const torch::Tensor& p : layers->parameters()) EXPECT_FALSE(p.grad().defined());
  const std::string text = describe_balance(costs, {2, 1});
  EXPECT_NE(text.find("stage 0: layers 0-1 (2)"), std::string::npos) << text;
  EXPECT_NE(text.find("stage 1: layers 2-2 (1)"), std::string::npos) << text;
}

// A layer that uses a parameter it does not register (a tied weight, a view of a model's module).
struct SharedWeightImpl : torch::nn::Module {
  explicit SharedWeightImpl(torch::Tensor weight) : weight(std::move(weight)) {}
  torch::Tensor forward(const torch::Tensor& x) { return x.matmul(weight); }
  torch::Tensor weight;
};
TORCH_MODULE(SharedWeight);

TEST(BalanceTest, ProfilingCountsAndSparesParametersALayerUsesWithoutRegisteringThem) {
  torch::manual_seed(0);
  torch::Tensor shared = torch::randn({16, 16}).requires_grad_(true);
  shared.mutable_grad() = torch::full({16, 16}, 7.0);  // a gradient accumulated before: it must stay
  torch::nn::Sequential layers(SharedWeight(shared), torch::nn::Linear(16, 4), SharedWeight(shared.narrow(0, 0, 4)));
  const std::vector<LayerCost> costs = profile_layers(layers, torch::randn({8, 16}), 1);
  EXPECT_EQ(costs[0].parameter_bytes, 2 * 16 * 16 * 4);
  EXPECT_EQ(costs[2].parameter_bytes, 2 * 16 * 16 * 4);  // the view's leaf is the whole tensor
  EXPECT_TRUE(torch::equal(shared.grad(), torch::full({16, 16}, 7.0)));
  for (const torch::Tensor& p : layers->parameters()) EXPECT_FALSE(p.grad().defined());
}

}  // namespace
}  // namespace volt
