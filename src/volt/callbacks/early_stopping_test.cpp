#include "volt/callbacks/early_stopping.h"

#include <gtest/gtest.h>

#include <cmath>

#include "volt/callbacks/testing_services.h"
#include "volt/core/error.h"

namespace volt {
namespace {

Decision validate_with(EarlyStopping& stopper, double value, int64_t epoch) {
  const std::map<std::string, double> metrics{{"val/loss", value}};
  CallbackContext context;
  context.epoch = epoch;
  context.metrics = &metrics;
  testing::RecordingServices services;
  return stopper.on_validation_end(context, services);
}

TEST(EarlyStopping, StopsAfterPatienceChecksWithoutImprovement) {
  EarlyStopping stopper({.monitor = "val/loss", .patience = 2});
  stopper.setup({.has_validation = true});
  EXPECT_FALSE(validate_with(stopper, 1.0, 0).stop);
  EXPECT_FALSE(validate_with(stopper, 0.5, 1).stop);
  EXPECT_FALSE(validate_with(stopper, 0.6, 2).stop);
  EXPECT_EQ(stopper.state_dict().at("stopped_epoch").toInt(), 0) << "Lightning's: 0 until it stops";
  const Decision d = validate_with(stopper, 0.7, 3);
  EXPECT_TRUE(d.stop);
  EXPECT_NE(d.reason.find("did not improve in the last 2 records"), std::string::npos) << d.reason;
  EXPECT_EQ(stopper.state_dict().at("stopped_epoch").toInt(), 3);
}

TEST(EarlyStopping, MinDeltaDecidesWhatCountsAsImprovement) {
  EarlyStopping stopper({.monitor = "val/loss", .min_delta = 0.1, .patience = 1});
  stopper.setup({.has_validation = true});
  EXPECT_FALSE(validate_with(stopper, 1.0, 0).stop);
  EXPECT_TRUE(validate_with(stopper, 0.95, 1).stop);
}

TEST(EarlyStopping, ThresholdsAndNonFiniteValuesStopAtOnce) {
  EarlyStopping threshold({.monitor = "val/loss", .stopping_threshold = 0.1});
  threshold.setup({.has_validation = true});
  EXPECT_TRUE(validate_with(threshold, 0.05, 0).stop);
  EarlyStopping nan({.monitor = "val/loss"});
  nan.setup({.has_validation = true});
  EXPECT_TRUE(validate_with(nan, std::nan(""), 0).stop);
  EarlyStopping diverge({.monitor = "val/loss", .divergence_threshold = 10.0});
  diverge.setup({.has_validation = true});
  EXPECT_TRUE(validate_with(diverge, 11.0, 0).stop);
}

TEST(EarlyStopping, StateRoundTripKeepsTheCount) {
  EarlyStopping a({.monitor = "val/loss", .patience = 3});
  a.setup({.has_validation = true});
  validate_with(a, 1.0, 0);
  validate_with(a, 2.0, 1);
  EarlyStopping b({.monitor = "val/loss", .patience = 3});
  b.setup({.has_validation = true});
  b.load_state_dict(a.state_dict());
  EXPECT_EQ(b.wait_count(), 1);
  EXPECT_EQ(b.best_score(), 1.0);
}

TEST(EarlyStopping, MissingMetricNamesTheLoggedOnes) {
  EarlyStopping stopper({.monitor = "val/acc"});
  stopper.setup({.has_validation = true});
  try {
    validate_with(stopper, 1.0, 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'val/loss'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("HINT"), std::string::npos);
  }
}

TEST(EarlyStopping, NoMonitorIsAClearError) { EXPECT_THROW(EarlyStopping({}), Error); }

}  // namespace
}  // namespace volt
