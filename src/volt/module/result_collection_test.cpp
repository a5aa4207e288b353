#include "volt/module/result_collection.h"

#include <gtest/gtest.h>

#include "volt/core/error.h"

namespace volt {
namespace {

TEST(ResultCollection, TrainingValuesAreStepValuesByDefault) {
  ResultCollection results(/*training=*/true);
  results.log("loss", torch::tensor(0.5), {});
  EXPECT_EQ(results.step_metrics(MetricTarget::kLogger), (std::map<std::string, double>{{"loss", 0.5}}));
  EXPECT_TRUE(results.epoch_metrics(MetricTarget::kLogger).empty());
}

TEST(ResultCollection, EpochMeanIsWeightedByBatchSize) {
  ResultCollection results(/*training=*/false);
  results.set_batch_size(3);
  results.log("acc", torch::tensor(1.0), {});
  results.set_batch_size(1);
  results.log("acc", torch::tensor(0.0), {});
  EXPECT_DOUBLE_EQ(results.epoch_metrics(MetricTarget::kCallback).at("acc"), 0.75);
}

TEST(ResultCollection, StepAndEpochGetLightningSuffixes) {
  ResultCollection results(/*training=*/true);
  LogOptions options;
  options.on_epoch = true;
  options.prog_bar = true;
  results.log("loss", torch::tensor(2.0), options);
  results.log("loss", torch::tensor(4.0), options);
  EXPECT_EQ(results.step_metrics(MetricTarget::kLogger).at("loss_step"), 4.0);
  EXPECT_EQ(results.epoch_metrics(MetricTarget::kLogger).at("loss_epoch"), 3.0);
  const auto callback = results.epoch_metrics(MetricTarget::kCallback);
  EXPECT_EQ(callback.at("loss"), 3.0);
  EXPECT_EQ(callback.at("loss_epoch"), 3.0);
}

TEST(ResultCollection, ReducersOtherThanMean) {
  ResultCollection results(/*training=*/false);
  LogOptions max;
  max.reduce_fx = Reduce::kMax;
  LogOptions sum;
  sum.reduce_fx = Reduce::kSum;
  for (double v : {1.0, 5.0, 2.0}) {
    results.log("max", torch::tensor(v), max);
    results.log("sum", torch::tensor(v), sum);
  }
  const auto epoch = results.epoch_metrics(MetricTarget::kCallback);
  EXPECT_EQ(epoch.at("max"), 5.0);
  EXPECT_EQ(epoch.at("sum"), 8.0);
}

TEST(ResultCollection, ProgBarAndLoggerTargetsFilter) {
  ResultCollection results(/*training=*/true);
  LogOptions hidden;
  hidden.logger = false;
  results.log("a", torch::tensor(1.0), hidden);
  EXPECT_TRUE(results.step_metrics(MetricTarget::kLogger).empty());
  EXPECT_TRUE(results.step_metrics(MetricTarget::kProgBar).empty());
  EXPECT_EQ(results.step_metrics(MetricTarget::kCallback).size(), 1u);
}

TEST(ResultCollection, SyncDistStepValuesGoThroughTheReducer) {
  ResultCollection results(/*training=*/true, [](double v, Reduce) { return v * 2; });
  LogOptions synced;
  synced.sync_dist = true;
  results.log("x", torch::tensor(1.5), synced);
  EXPECT_EQ(results.step_metrics(MetricTarget::kCallback).at("x"), 3.0);
}

TEST(ResultCollection, SyncEpochAddsWeightedAggregatesAcrossProcesses) {
  // Two "processes": this one saw 3 examples with mean 1.0; the other 1 example with 0.0.
  ResultCollection results(/*training=*/false);
  LogOptions synced;
  synced.sync_dist = true;
  results.set_batch_size(3);
  results.log("acc", torch::tensor(1.0), synced);
  results.log("local", torch::tensor(1.0), {});
  results.sync_epoch([](torch::Tensor& t, Reduce op) {
    ASSERT_EQ(op, Reduce::kSum);
    ASSERT_EQ(t.numel(), 2);  // only the sync_dist entry: aggregate and weight
    t.add_(torch::tensor({0.0, 1.0}, torch::kDouble));
  });
  const auto epoch = results.epoch_metrics(MetricTarget::kCallback);
  EXPECT_DOUBLE_EQ(epoch.at("acc"), 0.75);
  EXPECT_DOUBLE_EQ(epoch.at("local"), 1.0);
}

TEST(ResultCollection, NonScalarIsAClearError) {
  ResultCollection results(true);
  EXPECT_THROW(results.log("x", torch::ones({2}), {}), Error);
}

}  // namespace
}  // namespace volt
