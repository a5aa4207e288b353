#include "volt/options/trainer_options.h"

#include <gtest/gtest.h>

#include "volt/core/testing.h"

namespace volt {
namespace {

using volt::testing::error_message;

TEST(TrainerOptions, DefaultsAreLightningsAndUnsetValuesAreUnset) {
  const TrainerOptions o;
  EXPECT_EQ(o.accelerator, AcceleratorRequest::kAuto);
  EXPECT_TRUE(o.devices.is_auto());
  EXPECT_FALSE(o.gpus.has_value());
  EXPECT_EQ(o.strategy, StrategyRequest::kAuto);
  EXPECT_EQ(o.precision, Precision::k32True);
  EXPECT_FALSE(o.amp_level.has_value());
  EXPECT_EQ(o.num_nodes, 1);
  EXPECT_FALSE(o.num_threads.has_value());
  EXPECT_EQ(o.process_group_backend, ProcessGroupBackend::kAuto);
  EXPECT_FALSE(o.max_epochs.has_value());
  EXPECT_FALSE(o.max_steps.has_value());
  EXPECT_FALSE(o.gradient_clip_val.has_value());
  EXPECT_EQ(o.gradient_clip_algorithm, GradientClipAlgorithm::kNorm);
  EXPECT_FALSE(o.seed.has_value());
  EXPECT_EQ(o.requeue_signal, RequeueSignal::kSigUsr1);
  EXPECT_TRUE(o.auto_requeue);
  EXPECT_EQ(o.min_steps, 0);
  EXPECT_FALSE(o.overfit_batches.has_value());
  EXPECT_FALSE(o.detect_anomaly);
  EXPECT_EQ(o.deterministic.mode(), DeterministicMode::kOff);
  EXPECT_EQ(o.model_summary_max_depth, 1);
}

TEST(Deterministic, TakesLightningsTrueFalseOrWarn) {
  TrainerOptions o{.deterministic = true};
  EXPECT_EQ(o.deterministic.mode(), DeterministicMode::kOn);
  o = {.deterministic = "warn"};
  EXPECT_EQ(o.deterministic.mode(), DeterministicMode::kWarn) << "a string literal must not become `true`";
  o = {.deterministic = false};
  EXPECT_EQ(o.deterministic.mode(), DeterministicMode::kOff);
  EXPECT_EQ(Deterministic(DeterministicMode::kWarn).to_string(), std::string("warn"));
  const std::string message = error_message([] { Deterministic("always"); });
  EXPECT_NE(message.find("deterministic='always' is not supported"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
}

TEST(BatchLimit, CountsAndFractionsResolveLikeLightning) {
  EXPECT_EQ(BatchLimit(10).resolve(100), 10);
  EXPECT_EQ(BatchLimit(10).resolve(3), 3);
  EXPECT_EQ(BatchLimit(0.25).resolve(100), 25);
  EXPECT_EQ(BatchLimit(0.001).resolve(100), 1);
  EXPECT_EQ(BatchLimit(0.0).resolve(100), 0);
  EXPECT_EQ(BatchLimit(1.0).resolve(937), 937);
}

TEST(BatchLimit, ParseTellsCountsFromFractions) {
  EXPECT_FALSE(BatchLimit::parse("10", "x").is_fraction());
  EXPECT_TRUE(BatchLimit::parse("1.0", "x").is_fraction());
  EXPECT_EQ(BatchLimit::parse("1.0", "x").to_string(), "1.0");
  for (const char* bad : {"-1", "2.5", "abc"}) {
    const std::string message = error_message([bad] { BatchLimit::parse(bad, "--limit-val-batches"); });
    EXPECT_NE(message.find(std::string("--limit-val-batches='") + bad + "'"), std::string::npos) << message;
    EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
  }
}

TEST(DeviceRequest, ParsesCountsListsAndAuto) {
  EXPECT_TRUE(DeviceRequest("auto").is_auto());
  EXPECT_EQ(DeviceRequest("2").count(), 2);
  EXPECT_EQ(DeviceRequest("0, 1").indices(), (std::vector<int>{0, 1}));
  EXPECT_EQ(DeviceRequest("[0,1]").to_string(), "[0, 1]");
  for (const std::string& message :
       {error_message([] { DeviceRequest("x"); }), error_message([] { DeviceRequest(-2); }),
        error_message([] { DeviceRequest("-3"); })}) {
    EXPECT_NE(message.find("devices="), std::string::npos) << message;
    EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace volt
