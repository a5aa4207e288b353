#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "volt/base/collectives.h"
#include "volt/base/monitor_mode.h"
#include "volt/base/reduce.h"
#include "volt/base/state_dict.h"
#include "volt/base/testing_collectives.h"
#include "volt/core/error.h"

namespace volt {
namespace {

TEST(Reduce, NamesRoundTripAndBadNamesListTheChoices) {
  for (const Reduce reduce : {Reduce::kMean, Reduce::kSum, Reduce::kMax, Reduce::kMin}) {
    EXPECT_EQ(parse_reduce(to_string(reduce)), reduce);
  }
  try {
    parse_reduce("median");
    ADD_FAILURE() << "expected a volt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown reduce_fx 'median'; expected one of: mean, sum, max, min"),
              std::string::npos)
        << e.what();
  }
}

TEST(Mode, OneParserForEveryMonitor) {
  EXPECT_EQ(parse_mode("MAX"), Mode::kMax);
  EXPECT_EQ(parse_mode(to_string(Mode::kMin)), Mode::kMin);
  EXPECT_THROW(parse_mode("lowest"), Error);
}

TEST(StateDict, StartsEmptyWithStringKeys) {
  StateDict state = make_state_dict();
  EXPECT_EQ(state.size(), 0U);
  EXPECT_TRUE(state.keyType()->kind() == c10::TypeKind::StringType);
  state.insert("epoch", int64_t{3});
  EXPECT_EQ(state.at("epoch").toInt(), 3);
}

}  // namespace
}  // namespace volt

namespace {

// Runs all_gather_uneven on one thread per tensor; returns each rank's result or error message.
std::vector<std::variant<std::vector<torch::Tensor>, std::string>> gather_on_threads(
    const std::vector<torch::Tensor>& tensors) {
  volt::testing::ThreadGroup group(static_cast<int64_t>(tensors.size()));
  std::vector<std::variant<std::vector<torch::Tensor>, std::string>> results(tensors.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < tensors.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        results[r] = volt::all_gather_uneven(
            tensors[r], [&](const torch::Tensor& t) { return group.exchange(static_cast<int64_t>(r), t); });
      } catch (const volt::Error& e) {
        results[r] = std::string(e.what());
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return results;
}

}  // namespace

TEST(Collectives, LocalOnesChangeNothing) {
  volt::Collectives& local = volt::local_collectives();
  torch::Tensor t = torch::tensor({1.0, 2.0});
  local.all_reduce(t, volt::Reduce::kSum);
  EXPECT_TRUE(torch::equal(t, torch::tensor({1.0, 2.0})));
  const std::vector<torch::Tensor> all = local.all_gather(t);
  ASSERT_EQ(all.size(), 1U);
  EXPECT_TRUE(torch::equal(all[0], t));
  EXPECT_EQ(local.world_size(), 1);
}

TEST(Collectives, GathersRowsOfDifferentCountsWithoutPadding) {
  const std::vector<torch::Tensor> tensors = {torch::arange(6, torch::kFloat).reshape({3, 2}),
                                              torch::empty({0, 2}, torch::kFloat),
                                              torch::arange(10, 14, torch::kFloat).reshape({2, 2})};
  const auto results = gather_on_threads(tensors);
  for (const auto& result : results) {
    ASSERT_TRUE(std::holds_alternative<std::vector<torch::Tensor>>(result)) << std::get<std::string>(result);
    const auto& all = std::get<std::vector<torch::Tensor>>(result);
    ASSERT_EQ(all.size(), tensors.size());
    for (size_t r = 0; r < tensors.size(); ++r) {
      EXPECT_EQ(all[r].sizes(), tensors[r].sizes()) << "rank " << r;
      EXPECT_TRUE(torch::equal(all[r], tensors[r])) << "rank " << r;
    }
  }
}

TEST(Collectives, GathersScalars) {
  const auto results = gather_on_threads({torch::tensor(1.5), torch::tensor(-2.0)});
  const auto& all = std::get<std::vector<torch::Tensor>>(results[1]);
  ASSERT_EQ(all.size(), 2U);
  EXPECT_EQ(all[0].item<float>(), 1.5F);
  EXPECT_EQ(all[1].item<float>(), -2.0F);
}

TEST(Collectives, ShapesThatDifferBeyondTheFirstDimensionFailOnEveryRankNamingEach) {
  const auto results = gather_on_threads({torch::zeros({3, 2}), torch::zeros({2, 3}), torch::zeros({1, 2})});
  for (const auto& result : results) {
    ASSERT_TRUE(std::holds_alternative<std::string>(result));
    const std::string& message = std::get<std::string>(result);
    EXPECT_NE(message.find("rank 0 [3, 2] Float"), std::string::npos) << message;
    EXPECT_NE(message.find("rank 1 [2, 3] Float"), std::string::npos) << message;
    EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
  }
  const auto dtypes = gather_on_threads({torch::zeros({1}), torch::zeros({1}, torch::kLong)});
  EXPECT_NE(std::get<std::string>(dtypes[0]).find("rank 1 [1] Long"), std::string::npos)
      << std::get<std::string>(dtypes[0]);
}
