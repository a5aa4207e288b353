#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "volt/base/testing_collectives.h"
#include "volt/core/error.h"
#include "volt/core/testing.h"
#include "volt/metrics/accuracy.h"
#include "volt/metrics/confusion_matrix.h"
#include "volt/metrics/precision_recall.h"

namespace volt {
namespace {

// The hand-checked batch: 7 examples of 3 classes.
//   target 0 0 0 0 1 1 2
//   preds  0 0 0 1 1 2 2
// class 0: tp 3, fp 0, fn 1;  class 1: tp 1, fp 1, fn 1;  class 2: tp 1, fp 1, fn 0.
const torch::Tensor& target7() {
  static const torch::Tensor t = torch::tensor({0, 0, 0, 0, 1, 1, 2}, torch::kLong);
  return t;
}
const torch::Tensor& preds7() {
  static const torch::Tensor p = torch::tensor({0, 0, 0, 1, 1, 2, 2}, torch::kLong);
  return p;
}

double value(Metric& metric) { return metric.compute().item<double>(); }

template <typename M>
double on_batch7(const ClassificationOptions& options, const torch::Tensor& preds = preds7()) {
  M metric(options);
  metric.update(preds, target7());
  return value(metric);
}

TEST(Average, NamesRoundTripAndBadNamesListTheChoices) {
  EXPECT_EQ(parse_average(to_string(Average::kMicro)), Average::kMicro);
  EXPECT_EQ(parse_average("MACRO"), Average::kMacro);
  EXPECT_NE(testing::error_message([] { parse_average("weighted"); }).find("expected one of: micro, macro"),
            std::string::npos);
}

TEST(ClassificationOptions, DefaultsAreTop1MicroAndBadOptionsAreNamed) {
  const ClassificationOptions defaults;
  EXPECT_EQ(defaults.top_k, 1);
  EXPECT_EQ(defaults.average, Average::kMicro);
  EXPECT_NE(testing::error_message([] {
              MulticlassAccuracy({.num_classes = 1});
            }).find("num_classes is 1; a multiclass metric needs at least 2"),
            std::string::npos);
  EXPECT_NE(testing::error_message([] {
              MulticlassAccuracy({.num_classes = 3, .top_k = 4});
            }).find("top_k is 4; expected 1 to num_classes (3)"),
            std::string::npos);
}

TEST(MulticlassAccuracy, MicroCountsExamplesAndMacroAveragesClasses) {
  EXPECT_DOUBLE_EQ(on_batch7<MulticlassAccuracy>({.num_classes = 3}), 5.0 / 7);
  // Per-class recall: 3/4, 1/2, 1/1.
  EXPECT_DOUBLE_EQ(on_batch7<MulticlassAccuracy>({.num_classes = 3, .average = Average::kMacro}),
                   (0.75 + 0.5 + 1.0) / 3);
  // A class that occurs nowhere is left out of the macro mean (torchmetrics).
  EXPECT_DOUBLE_EQ(on_batch7<MulticlassAccuracy>({.num_classes = 4, .average = Average::kMacro}),
                   (0.75 + 0.5 + 1.0) / 3);
}

TEST(MulticlassAccuracy, ScoresCountByTheirArgmax) {
  // Scores whose highest entry is preds7's class, the others random below it.
  torch::manual_seed(1);
  const torch::Tensor scores = torch::rand({7, 3}) + torch::one_hot(preds7(), 3).to(torch::kFloat) * 2;
  EXPECT_DOUBLE_EQ(on_batch7<MulticlassAccuracy>({.num_classes = 3}, scores), 5.0 / 7);
  EXPECT_DOUBLE_EQ(on_batch7<MulticlassAccuracy>({.num_classes = 3, .average = Average::kMacro}, scores),
                   (0.75 + 0.5 + 1.0) / 3);
}

TEST(MulticlassAccuracy, TopKCountsATargetAmongTheKHighestScores) {
  const torch::Tensor scores = torch::tensor({0.5F, 0.3F, 0.2F,   // target 1: top-2 {0, 1} hit, top-1 miss
                                              0.1F, 0.2F, 0.7F,   // target 0: top-2 {2, 1} miss
                                              0.3F, 0.6F, 0.1F,   // target 0: top-2 {1, 0} hit, top-1 miss
                                              0.2F, 0.1F, 0.7F})  // target 2: hit
                                   .view({4, 3});
  const torch::Tensor target = torch::tensor({1, 0, 0, 2}, torch::kLong);
  const auto run = [&](const ClassificationOptions& options) {
    MulticlassAccuracy accuracy(options);
    accuracy.update(scores, target);
    return value(accuracy);
  };
  EXPECT_DOUBLE_EQ(run({.num_classes = 3}), 1.0 / 4);
  EXPECT_DOUBLE_EQ(run({.num_classes = 3, .top_k = 2}), 3.0 / 4);
  // Class 0: 1 of its 2 examples hit; classes 1 and 2: their one example each.
  EXPECT_DOUBLE_EQ(run({.num_classes = 3, .top_k = 2, .average = Average::kMacro}), (0.5 + 1 + 1) / 3);
}

TEST(PrecisionRecallF1, HandCheckedPerClassAndMicro) {
  // MulticlassPrecision per class: 3/3, 1/2, 1/2. MulticlassRecall: 3/4, 1/2, 1/1. F1 = 2tp / (2tp + fp + fn): 6/7,
  // 2/4, 2/3.
  EXPECT_DOUBLE_EQ(on_batch7<MulticlassPrecision>({.num_classes = 3, .average = Average::kMacro}),
                   (1.0 + 0.5 + 0.5) / 3);
  EXPECT_DOUBLE_EQ(on_batch7<MulticlassRecall>({.num_classes = 3, .average = Average::kMacro}), (0.75 + 0.5 + 1.0) / 3);
  EXPECT_DOUBLE_EQ(on_batch7<MulticlassF1Score>({.num_classes = 3, .average = Average::kMacro}),
                   (6.0 / 7 + 0.5 + 2.0 / 3) / 3);
  // Micro: summed counts tp 5, fp 2, fn 2.
  EXPECT_DOUBLE_EQ(on_batch7<MulticlassPrecision>({.num_classes = 3}), 5.0 / 7);
  EXPECT_DOUBLE_EQ(on_batch7<MulticlassRecall>({.num_classes = 3}), 5.0 / 7);
  EXPECT_DOUBLE_EQ(on_batch7<MulticlassF1Score>({.num_classes = 3}), 10.0 / 14);
}

TEST(PrecisionRecallF1, MacroTopKLeavesOutClassesWithoutExamplesExceptForF1) {
  // Top-2 of 3 classes; class 2 is never expected but is among the top 2 of the second example.
  //   example 0: target 0, top-2 {0, 1};  example 1: target 1, top-2 {2, 1}
  // class 0: tp 1, fp 0, fn 0;  class 1: tp 1, fp 1, fn 0;  class 2: tp 0, fp 1, fn 0.
  const torch::Tensor scores = torch::tensor({0.6F, 0.3F, 0.1F, 0.1F, 0.3F, 0.6F}).view({2, 3});
  const torch::Tensor target = torch::tensor({0, 1}, torch::kLong);
  const auto run = [&](auto metric) {
    metric.update(scores, target);
    return value(metric);
  };
  const ClassificationOptions options{.num_classes = 3, .top_k = 2, .average = Average::kMacro};
  // Precision and recall leave class 2 out (no examples), as torchmetrics does with top_k > 1.
  EXPECT_DOUBLE_EQ(run(MulticlassPrecision(options)), (1.0 + 0.5) / 2);
  EXPECT_DOUBLE_EQ(run(MulticlassRecall(options)), (1.0 + 1.0) / 2);
  // F1 keeps it (it has a false positive), with F1 0: torchmetrics' F-beta ignores top_k there.
  EXPECT_DOUBLE_EQ(run(MulticlassF1Score(options)), (1.0 + 2.0 / 3 + 0.0) / 3);
}

TEST(PrecisionRecallF1, ADivisionByZeroCountsAsZero) {
  // Class 1 is expected but never predicted: its precision is 0 / 0, taken as 0.
  MulticlassPrecision precision({.num_classes = 2, .average = Average::kMacro});
  precision.update(torch::tensor({0, 0}, torch::kLong), torch::tensor({0, 1}, torch::kLong));
  EXPECT_DOUBLE_EQ(value(precision), (0.5 + 0.0) / 2);
  // Nothing at all yet: 0, not NaN.
  EXPECT_DOUBLE_EQ(value(*std::make_unique<MulticlassF1Score>(ClassificationOptions{.num_classes = 3})), 0.0);
}

TEST(MulticlassConfusionMatrix, RowsAreTargetsAndColumnsPredictions) {
  MulticlassConfusionMatrix matrix(3);
  matrix.update(preds7(), target7());
  const torch::Tensor expected = torch::tensor({3, 1, 0,  //
                                                0, 1, 1,  //
                                                0, 0, 1},
                                               torch::kLong)
                                     .view({3, 3});
  EXPECT_TRUE(torch::equal(matrix.compute(), expected)) << matrix.compute();
}

/// Every built-in classification metric, made fresh.
std::vector<std::unique_ptr<Metric>> all_metrics(int64_t classes) {
  std::vector<std::unique_ptr<Metric>> out;
  for (const Average average : {Average::kMicro, Average::kMacro}) {
    out.push_back(
        std::make_unique<MulticlassAccuracy>(ClassificationOptions{.num_classes = classes, .average = average}));
    out.push_back(std::make_unique<MulticlassAccuracy>(
        ClassificationOptions{.num_classes = classes, .top_k = 2, .average = average}));
    out.push_back(
        std::make_unique<MulticlassPrecision>(ClassificationOptions{.num_classes = classes, .average = average}));
    out.push_back(
        std::make_unique<MulticlassRecall>(ClassificationOptions{.num_classes = classes, .average = average}));
    out.push_back(
        std::make_unique<MulticlassF1Score>(ClassificationOptions{.num_classes = classes, .average = average}));
  }
  out.push_back(std::make_unique<MulticlassConfusionMatrix>(classes));
  return out;
}

TEST(ClassificationMetrics, UpdatesInPiecesEqualOneUpdateAndResetStartsOver) {
  torch::manual_seed(3);
  const torch::Tensor scores = torch::randn({40, 5});
  const torch::Tensor target = torch::randint(0, 5, {40}, torch::kLong);
  auto whole = all_metrics(5);
  auto pieces = all_metrics(5);
  for (size_t m = 0; m < whole.size(); ++m) {
    whole[m]->update(scores, target);
    int64_t start = 0;
    for (const int64_t size : {1, 13, 0, 20, 6}) {
      pieces[m]->update(scores.narrow(0, start, size), target.narrow(0, start, size));
      start += size;
    }
    EXPECT_TRUE(torch::equal(whole[m]->compute(), pieces[m]->compute())) << whole[m]->name();
    EXPECT_EQ(pieces[m]->update_count(), 5);
    pieces[m]->reset();
    EXPECT_EQ(pieces[m]->update_count(), 0);
    EXPECT_TRUE(torch::equal(pieces[m]->compute(), all_metrics(5)[m]->compute())) << pieces[m]->name();
  }
}

TEST(ClassificationMetrics, ThreeRanksWithUnevenShardsEqualOneProcess) {
  torch::manual_seed(4);
  const torch::Tensor scores = torch::randn({23, 4});
  const torch::Tensor target = torch::randint(0, 4, {23}, torch::kLong);
  std::vector<torch::Tensor> reference;
  for (auto& metric : all_metrics(4)) {
    metric->update(scores, target);
    reference.push_back(metric->compute());
  }
  const int64_t bounds[] = {0, 11, 11, 23};  // rank 1 has no examples
  testing::run_ranks(3, [&](int64_t rank, Collectives& collectives) {
    auto metrics = all_metrics(4);
    const int64_t start = bounds[rank];
    const int64_t size = bounds[rank + 1] - start;
    for (size_t m = 0; m < metrics.size(); ++m) {
      metrics[m]->update(scores.narrow(0, start, size), target.narrow(0, start, size));
      const torch::Tensor synced = metrics[m]->compute(collectives);
      EXPECT_TRUE(torch::equal(synced, reference[m])) << metrics[m]->name() << " rank " << rank;
    }
  });
}

TEST(ClassificationMetrics, BadInputsSayWhatWasGivenAndWhatWasExpected) {
  MulticlassAccuracy accuracy({.num_classes = 3});
  const torch::Tensor target = torch::tensor({0, 2}, torch::kLong);
  std::string message = testing::error_message([&] { accuracy.update(torch::rand({2, 3}), torch::rand({2, 3})); });
  EXPECT_NE(message.find("MulticlassAccuracy.update() was given target [2, 3] Float; expected class indices of "
                         "shape [N] with an integer dtype. HINT:"),
            std::string::npos)
      << message;
  message = testing::error_message([&] { accuracy.update(torch::rand({2, 3}), torch::tensor({0, 3}, torch::kLong)); });
  EXPECT_NE(message.find("target class 3; expected classes in [0, 3) (num_classes 3). HINT:"), std::string::npos)
      << message;
  message = testing::error_message([&] { accuracy.update(torch::rand({2, 4}), target); });
  EXPECT_NE(message.find("preds [2, 4] Float with 4 classes; expected [N, 3] (num_classes 3)"), std::string::npos)
      << message;
  message = testing::error_message([&] { accuracy.update(torch::rand({3, 3}), target); });
  EXPECT_NE(message.find("preds for 3 examples but target for 2"), std::string::npos) << message;
  message = testing::error_message([&] { accuracy.update(torch::rand({2}), target); });
  EXPECT_NE(message.find("preds [2] Float; expected [N, 3] floating-point scores"), std::string::npos) << message;
  message = testing::error_message([&] {
    MulticlassAccuracy top2({.num_classes = 3, .top_k = 2});
    top2.update(torch::tensor({0, 1}, torch::kLong), target);
  });
  EXPECT_NE(message.find("top_k is 2; expected [N, 3] scores. HINT: top-k needs every class's score"),
            std::string::npos)
      << message;
  EXPECT_EQ(accuracy.update_count(), 0) << "a refused batch is not counted";
}

}  // namespace
}  // namespace volt
