#include "volt/module/result_collection.h"

#include <gtest/gtest.h>

#include "volt/base/testing_collectives.h"
#include "volt/core/error.h"
#include "volt/metrics/confusion_matrix.h"
#include "volt/metrics/mean_squared_error.h"

namespace volt {
namespace {

// This process and one other whose reduced values are `other`: a sum adds them, a mean averages
// with them; max and min keep this process's values (the other logged the same names, so the
// names' check agrees). Counts the tensor reductions.
class OneOtherProcess : public Collectives {
 public:
  using Collectives::all_reduce;
  explicit OneOtherProcess(torch::Tensor other) : other_(std::move(other)) {}
  int64_t world_size() const override { return 2; }
  int64_t rank() const override { return 0; }
  void all_reduce(torch::Tensor& values, Reduce op) override {
    ++reductions;
    if (op == Reduce::kSum || op == Reduce::kMean) values.add_(other_);
    if (op == Reduce::kMean) values.div_(2);
  }
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor) override { return {tensor, tensor}; }
  int reductions = 0;

 private:
  torch::Tensor other_;
};

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
  OneOtherProcess other(torch::tensor({2.5}, torch::kDouble));  // the other process logged 2.5
  ResultCollection results(/*training=*/true, &other);
  LogOptions synced;
  synced.sync_dist = true;
  results.log("x", torch::tensor(1.5), synced);
  EXPECT_EQ(results.step_metrics(MetricTarget::kCallback).at("x"), 2.0);  // reduce_fx's default: the mean
  EXPECT_EQ(other.reductions, 1);
}

TEST(ResultCollection, SyncEpochAddsWeightedAggregatesAcrossProcesses) {
  // Two "processes": this one saw 3 examples with mean 1.0; the other 1 example with 0.0.
  ResultCollection results(/*training=*/false);
  LogOptions synced;
  synced.sync_dist = true;
  results.set_batch_size(3);
  results.log("acc", torch::tensor(1.0), synced);
  results.log("local", torch::tensor(1.0), {});
  // Only the sync_dist entry travels: its aggregate and weight.
  OneOtherProcess other(torch::tensor({0.0, 1.0}, torch::kDouble));
  results.sync_epoch(other);
  EXPECT_EQ(other.reductions, 2);  // the names' check (no Metric logged: nothing) and the sums
  const auto epoch = results.epoch_metrics(MetricTarget::kCallback);
  EXPECT_DOUBLE_EQ(epoch.at("acc"), 0.75);
  EXPECT_DOUBLE_EQ(epoch.at("local"), 1.0);
}

TEST(ResultCollection, LoggedMetricIsComputedOnceAtEpochEndAndReset) {
  ResultCollection results(/*training=*/true);
  MeanSquaredError logged;
  MeanSquaredError direct;
  for (int step = 0; step < 3; ++step) {
    const torch::Tensor preds = torch::rand({4});
    const torch::Tensor target = torch::rand({4});
    logged.update(preds, target);
    direct.update(preds, target);
    results.log_metric("mse", logged, {});  // once per step, as a training_step would
  }
  EXPECT_TRUE(results.step_metrics(MetricTarget::kLogger).empty());  // no per-step value
  results.sync_epoch();
  const double expected = direct.compute().item<double>();
  EXPECT_DOUBLE_EQ(results.epoch_metrics(MetricTarget::kCallback).at("mse"), expected);
  EXPECT_DOUBLE_EQ(results.epoch_metrics(MetricTarget::kLogger).at("mse"), expected);
  EXPECT_EQ(logged.update_count(), 0);  // reset for the next epoch
}

TEST(ResultCollection, LoggedMetricRefusesStepValuesMixingAndVectors) {
  MeanSquaredError mse;
  MeanSquaredError other;
  ResultCollection results(/*training=*/true);
  LogOptions on_step;
  on_step.on_step = true;
  EXPECT_THROW(results.log_metric("mse", mse, on_step), Error);
  results.log_metric("mse", mse, {});
  EXPECT_THROW(results.log("mse", torch::tensor(1.0), {}), Error);  // a value under a Metric's name
  EXPECT_THROW(results.log_metric("mse", other, {}), Error);        // another Metric under the name
  results.log("loss", torch::tensor(1.0), {});
  EXPECT_THROW(results.log_metric("loss", mse, {}), Error);  // a Metric under a value's name

  ResultCollection vector(/*training=*/false);
  MulticlassConfusionMatrix matrix(2);
  matrix.update(torch::tensor({0, 1}), torch::tensor({0, 0}));
  vector.log_metric("cm", matrix, {});
  try {
    vector.sync_epoch();
    FAIL() << "a matrix-valued metric was logged";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("single value"), std::string::npos) << error.what();
  }
}

TEST(ResultCollection, KeptCollectionTakesOverTheMetricsOfAReplayedStep) {
  MeanSquaredError mse;
  ResultCollection kept(/*training=*/true);
  ResultCollection replayed = kept;
  replayed.log_metric("mse", mse, {});
  replayed.log("loss", torch::tensor(5.0), {});
  kept.keep_metrics_from(replayed);
  mse.update(torch::tensor({1.0}), torch::tensor({0.0}));
  kept.sync_epoch();
  const auto epoch = kept.epoch_metrics(MetricTarget::kCallback);
  EXPECT_DOUBLE_EQ(epoch.at("mse"), 1.0);
  EXPECT_EQ(epoch.count("loss"), 0u);  // the replayed step's values stay discarded
}

TEST(ResultCollection, LoggedMetricIsSyncedOverEveryProcess) {
  // Rank r saw errors of r+1 on r+1 examples: the mean over all of them, on every rank.
  std::vector<double> values(3);
  testing::run_ranks(3, [&](int64_t rank, Collectives& collectives) {
    MeanSquaredError mse;
    mse.update(torch::full({rank + 1}, static_cast<float>(rank + 1)), torch::zeros({rank + 1}));
    ResultCollection results(/*training=*/false);
    results.log_metric("mse", mse, {});
    results.sync_epoch(collectives);
    values[static_cast<size_t>(rank)] = results.epoch_metrics(MetricTarget::kCallback).at("mse");
  });
  const double expected = (1.0 * 1 + 4.0 * 2 + 9.0 * 3) / 6.0;
  for (const double value : values) EXPECT_NEAR(value, expected, 1e-6);
}

TEST(ResultCollection, ProcessesThatLoggedOtherMetricsFailInsteadOfWaiting) {
  std::vector<std::string> errors(2);
  testing::run_ranks(2, [&](int64_t rank, Collectives& collectives) {
    MeanSquaredError mse;
    ResultCollection results(/*training=*/false);
    results.log_metric(rank == 0 ? "mse" : "val_mse", mse, {});
    try {
      results.sync_epoch(collectives);
    } catch (const Error& error) {
      errors[static_cast<size_t>(rank)] = error.what();
    }
  });
  for (const std::string& error : errors) EXPECT_NE(error.find("logged different Metrics"), std::string::npos) << error;
}

TEST(ResultCollection, NonScalarIsAClearError) {
  ResultCollection results(true);
  EXPECT_THROW(results.log("x", torch::ones({2}), {}), Error);
}

}  // namespace
}  // namespace volt
