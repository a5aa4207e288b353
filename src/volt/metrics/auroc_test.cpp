#include "volt/metrics/auroc.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "volt/base/testing_collectives.h"
#include "volt/core/error.h"
#include "volt/core/testing.h"
#include "volt/metrics/mean_squared_error.h"

namespace volt {
namespace {

/// AUROC from its definition: over every (positive, negative) pair, 1 when the positive scores
/// higher, 1/2 on a tie, divided by the number of pairs. O(n^2), independent of the ranks.
double pairwise_auroc(const std::vector<float>& scores, const std::vector<bool>& positive) {
  double wins = 0;
  double pairs = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    for (size_t j = 0; j < scores.size(); ++j) {
      if (!positive[i] || positive[j]) continue;
      pairs += 1;
      wins += scores[i] > scores[j] ? 1.0 : (scores[i] == scores[j] ? 0.5 : 0.0);
    }
  }
  return pairs == 0 ? 0.0 : wins / pairs;
}

std::vector<float> floats(const torch::Tensor& t) {
  const torch::Tensor c = t.to(torch::kFloat).contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

std::vector<bool> is_class(const torch::Tensor& target, int64_t c) {
  std::vector<bool> out;
  for (int64_t i = 0; i < target.size(0); ++i) out.push_back(target[i].item<int64_t>() == c);
  return out;
}

TEST(AUROC, BinaryCountsTiesAsOneHalf) {
  // Positives score 0.35, 0.8, 0.4; negatives 0.1, 0.4. Pairs won: 0.35 > 0.1; 0.8 > both;
  // 0.4 > 0.1 and ties 0.4: 1 + 2 + 1.5 = 4.5 of 6.
  BinaryAUROC auroc;
  auroc.update(torch::tensor({0.1F, 0.4F, 0.35F, 0.8F, 0.4F}), torch::tensor({0, 0, 1, 1, 1}, torch::kLong));
  EXPECT_DOUBLE_EQ(auroc.compute().item<double>(), 4.5 / 6);
  EXPECT_EQ(auroc.name(), "BinaryAUROC");
}

TEST(AUROC, BinaryEqualsThePairwiseDefinitionOnDataFullOfTies) {
  torch::manual_seed(5);
  // Scores on a grid of 11 values: most of 300 examples tie with others.
  const torch::Tensor scores = torch::randint(0, 11, {300}).to(torch::kFloat) / 10;
  const torch::Tensor target = torch::randint(0, 2, {300}, torch::kLong);
  BinaryAUROC auroc;
  auroc.update(scores.narrow(0, 0, 100), target.narrow(0, 0, 100).to(torch::kBool));
  auroc.update(scores.narrow(0, 100, 200), target.narrow(0, 100, 200).to(torch::kBool));
  EXPECT_NEAR(auroc.compute().item<double>(), pairwise_auroc(floats(scores), is_class(target, 1)), 1e-12);
}

TEST(AUROC, MulticlassIsTheMeanOfTheOneVsRestAurocs) {
  torch::manual_seed(6);
  const int64_t classes = 4;
  const torch::Tensor scores = torch::randint(0, 7, {120, classes}).to(torch::kFloat) / 6;
  const torch::Tensor target = torch::randint(0, classes, {120}, torch::kLong);
  MulticlassAUROC auroc(classes);
  auroc.update(scores, target);
  double sum = 0;
  for (int64_t c = 0; c < classes; ++c) sum += pairwise_auroc(floats(scores.select(1, c)), is_class(target, c));
  EXPECT_NEAR(auroc.compute().item<double>(), sum / classes, 1e-12);
  EXPECT_EQ(auroc.name(), "MulticlassAUROC");
}

TEST(AUROC, MulticlassSoftmaxesABatchOfLogitsFirst) {
  // Row 0 (class 0) is row 1 (class 1) shifted by 10: ranked raw, class 1's column puts row 0
  // first (AUROC 0); its softmax puts row 1 first (AUROC 1), as torchmetrics does.
  const torch::Tensor logits = torch::tensor({10.0F, 10.5F, 0.0F, 1.0F}).view({2, 2});
  const torch::Tensor target = torch::tensor({0, 1}, torch::kLong);
  MulticlassAUROC auroc(2);
  auroc.update(logits, target);
  EXPECT_DOUBLE_EQ(auroc.compute().item<double>(), 1.0);
  MulticlassAUROC probabilities(2);
  probabilities.update(logits.softmax(1), target);
  EXPECT_DOUBLE_EQ(probabilities.compute().item<double>(), 1.0);
}

TEST(AUROC, AClassWithoutPositivesOrNegativesScoresZero) {
  BinaryAUROC binary;
  binary.update(torch::tensor({0.2F, 0.9F}), torch::tensor({1, 1}, torch::kLong));
  EXPECT_EQ(binary.compute().item<double>(), 0.0);
  // Class 2 never occurs: (1 + 1 + 0) / 3 with classes 0 and 1 perfectly separated.
  MulticlassAUROC multiclass(3);
  multiclass.update(torch::tensor({0.9F, 0.1F, 0.0F, 0.1F, 0.9F, 0.0F}).view({2, 3}),
                    torch::tensor({0, 1}, torch::kLong));
  EXPECT_DOUBLE_EQ(multiclass.compute().item<double>(), 2.0 / 3);
}

TEST(AUROC, RanksWithUnevenAndEmptyShardsEqualOneProcess) {
  torch::manual_seed(7);
  const torch::Tensor scores = torch::randint(0, 5, {31, 3}).to(torch::kFloat) / 4;
  const torch::Tensor target = torch::randint(0, 3, {31}, torch::kLong);
  MulticlassAUROC single(3);
  single.update(scores, target);
  const double expected = single.compute().item<double>();
  const int64_t bounds[] = {0, 0, 17, 31};  // rank 0 has no examples
  testing::run_ranks(3, [&](int64_t rank, Collectives& collectives) {
    MulticlassAUROC auroc(3);
    const int64_t start = bounds[rank];
    const int64_t size = bounds[rank + 1] - start;
    auroc.update(scores.narrow(0, start, size), target.narrow(0, start, size));
    EXPECT_EQ(auroc.compute(collectives).item<double>(), expected) << "rank " << rank;
    EXPECT_EQ(auroc.state_dict().at("states").toGenericDict().at("preds").toTensor().size(0), size);
  });
}

TEST(AUROC, BadInputsSayWhatWasGivenAndWhatWasExpected) {
  BinaryAUROC binary;
  std::string message = testing::error_message([&] {
    binary.update(torch::rand({3}), torch::tensor({0, 2, 1}, torch::kLong));
  });
  EXPECT_NE(message.find("BinaryAUROC.update() was given target label 2; expected 0 or 1. HINT:"), std::string::npos)
      << message;
  message = testing::error_message([&] { binary.update(torch::rand({3, 2}), torch::tensor({0, 1, 1}, torch::kLong)); });
  EXPECT_NE(message.find("preds [3, 2] Float and target [3] Long; expected [N] floating-point scores"),
            std::string::npos)
      << message;
  MulticlassAUROC multiclass(3);
  message = testing::error_message([&] { multiclass.update(torch::rand({2}), torch::tensor({0, 1}, torch::kLong)); });
  EXPECT_NE(message.find("preds [2] Float for target [2] Long; expected [N, 3] floating-point scores"),
            std::string::npos)
      << message;
  EXPECT_NE(testing::error_message([] { MulticlassAUROC(1); }).find("num_classes is 1; expected at least 2"),
            std::string::npos);
}

TEST(MeanSquaredError, IsTheMeanOverEveryElementOfEveryUpdate) {
  MeanSquaredError mse;
  EXPECT_TRUE(std::isnan(mse.compute().item<double>())) << "0 / 0 before any update";
  mse.update(torch::tensor({1.0F, 2.0F, 3.0F}), torch::tensor({1.0F, 1.0F, 1.0F}));  // errors 0, 1, 2
  mse.update(torch::tensor({{0.5, -1.0}}, torch::kDouble), torch::tensor({{0.0, 1.0}}, torch::kDouble));
  EXPECT_DOUBLE_EQ(mse.compute().item<double>(), (0 + 1 + 4 + 0.25 + 4) / 5);
  const std::string message = testing::error_message([&] { mse.update(torch::rand({4, 1}), torch::rand({4})); });
  EXPECT_NE(message.find("preds [4, 1] Float and target [4] Float; expected two real tensors of the same shape"),
            std::string::npos)
      << message;
}

TEST(MeanSquaredError, RanksEqualOneProcess) {
  torch::manual_seed(8);
  const torch::Tensor preds = torch::randn({10});
  const torch::Tensor target = torch::randn({10});
  MeanSquaredError single;
  single.update(preds, target);
  testing::run_ranks(2, [&](int64_t rank, Collectives& collectives) {
    MeanSquaredError mse;
    mse.update(preds.narrow(0, rank * 3, rank == 0 ? 3 : 7), target.narrow(0, rank * 3, rank == 0 ? 3 : 7));
    EXPECT_NEAR(mse.compute(collectives).item<double>(), single.compute().item<double>(), 1e-12);
  });
}

}  // namespace
}  // namespace volt
