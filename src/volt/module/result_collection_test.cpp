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

TEST(ResultCollection, SyncDistGoesThroughTheReducer) {
  ResultCollection results(false, [](double v, Reduce) { return v * 2; });
  LogOptions synced;
  synced.sync_dist = true;
  results.log("x", torch::tensor(1.5), synced);
  EXPECT_EQ(results.epoch_metrics(MetricTarget::kCallback).at("x"), 3.0);
}

TEST(ResultCollection, NonScalarIsAClearError) {
  ResultCollection results(true);
  EXPECT_THROW(results.log("x", torch::ones({2}), {}), Error);
}

}  // namespace
}  // namespace volt
