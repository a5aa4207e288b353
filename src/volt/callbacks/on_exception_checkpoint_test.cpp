#include "volt/callbacks/on_exception_checkpoint.h"

#include <gtest/gtest.h>

#include <stdexcept>

#include "volt/callbacks/testing_services.h"
#include "volt/core/error.h"

namespace volt {
namespace {

TEST(OnExceptionCheckpoint, SavesToItsPathWhenFitFails) {
  OnExceptionCheckpoint callback({.dirpath = "out"});
  const std::vector<std::shared_ptr<torch::optim::Optimizer>> optimizers;
  CallbackContext fit;
  fit.optimizers = &optimizers;
  testing::RecordingServices services;
  callback.on_exception(fit, std::runtime_error("step failed"), services);
  EXPECT_EQ(services.saved, std::vector<std::string>{"out/on_exception.ckpt"});
}

TEST(OnExceptionCheckpoint, SavesNothingOutsideFit) {
  OnExceptionCheckpoint callback({.dirpath = "out", .filename = "crash"});
  EXPECT_EQ(callback.checkpoint_path(), "out/crash.ckpt");
  testing::RecordingServices services;
  callback.on_exception(CallbackContext{}, std::runtime_error("test_step failed"), services);
  EXPECT_TRUE(services.saved.empty());
}

TEST(OnExceptionCheckpoint, RefusesAnEmptyDirpathOrFilename) {
  EXPECT_THROW((void)OnExceptionCheckpoint({}), Error);
  EXPECT_THROW((void)OnExceptionCheckpoint({.dirpath = "out", .filename = ""}), Error);
}

}  // namespace
}  // namespace volt
