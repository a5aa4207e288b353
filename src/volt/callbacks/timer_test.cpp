#include "volt/callbacks/timer.h"

#include <gtest/gtest.h>

#include "volt/callbacks/testing_services.h"
#include "volt/core/error.h"

namespace volt {
namespace {

using Seconds = std::chrono::duration<double>;

/// Runs batches of `seconds` each until the Timer stops (or `limit` batches); returns how many ran.
int64_t batches_until_stop(Timer& timer, testing::ManualClock& time, double seconds,
                           testing::RecordingServices& services, int64_t limit = 100) {
  CallbackContext context;
  for (int64_t batch = 1; batch <= limit; ++batch) {
    time.advance(seconds);
    context.global_step = batch;
    if (timer.on_train_batch_end(context, services).stop) return batch;
  }
  return limit;
}

TEST(Timer, StopsAtTheFirstStepPastTheDurationAndSavesACheckpointAtTheTrainEnd) {
  testing::ManualClock time;
  Timer timer({.duration = Seconds(3.5), .dirpath = "ckpts"}, time.clock());
  timer.setup({});
  testing::RecordingServices services;
  timer.on_train_start({}, services);
  EXPECT_EQ(batches_until_stop(timer, time, 1.0, services), 4);  // 4 s >= 3.5 s; 3 s was not
  EXPECT_TRUE(services.saved.empty()) << "the checkpoint waits for the train end";
  timer.on_train_end({}, services);
  ASSERT_EQ(services.saved.size(), 1u);
  EXPECT_EQ(services.saved[0], "ckpts/last.ckpt");
  EXPECT_EQ(timer.checkpoint_path(), "ckpts/last.ckpt");
  EXPECT_DOUBLE_EQ(timer.time_elapsed(), 4.0);
  time.advance(10);  // after the train end the elapsed time stays
  EXPECT_DOUBLE_EQ(timer.time_elapsed(), 4.0);
  EXPECT_DOUBLE_EQ(*timer.time_remaining(), -0.5);
}

TEST(Timer, AFitThatEndsInTimeSavesNothing) {
  testing::ManualClock time;
  Timer timer({.duration = Seconds(100)}, time.clock());
  timer.setup({.root_dir = "root"});
  testing::RecordingServices services;
  timer.on_train_start({}, services);
  EXPECT_EQ(batches_until_stop(timer, time, 1.0, services, /*limit=*/5), 5);
  timer.on_train_end({}, services);
  EXPECT_TRUE(services.saved.empty());
  EXPECT_EQ(services.broadcasts, 5);  // every process asks at every step, stop or not
}

TEST(Timer, RankZerosClockDecidesOnEveryProcess) {
  testing::ManualClock time;
  Timer timer({.duration = Seconds(3.5)}, time.clock());
  timer.setup({});
  testing::RecordingServices services;
  timer.on_train_start({}, services);
  services.rank0_decision = false;  // this process's clock is past the limit, rank 0's is not
  EXPECT_EQ(batches_until_stop(timer, time, 10.0, services, /*limit=*/3), 3);
  services.rank0_decision = true;  // rank 0's time is up before this process's
  Timer early({.duration = Seconds(1000)}, time.clock());
  early.setup({});
  early.on_train_start({}, services);
  EXPECT_EQ(batches_until_stop(early, time, 1.0, services), 1);
}

TEST(Timer, AResumedFitCountsTheTimeItsCheckpointRecorded) {
  testing::ManualClock time;
  Timer first({.duration = Seconds(5)}, time.clock());
  first.setup({});
  testing::RecordingServices services;
  first.on_train_start({}, services);
  EXPECT_EQ(batches_until_stop(first, time, 1.0, services, /*limit=*/3), 3);
  const StateDict saved = first.state_dict();
  EXPECT_DOUBLE_EQ(saved.at("time_elapsed").toGenericDict().at("train").toDouble(), 3.0);

  Timer resumed({.duration = Seconds(5)}, time.clock());
  resumed.setup({});
  resumed.load_state_dict(saved);
  time.advance(1000);  // the time between the two processes does not count
  resumed.on_train_start({}, services);
  EXPECT_EQ(batches_until_stop(resumed, time, 1.0, services), 2);  // 3 + 2 >= 5
}

TEST(Timer, TheEpochIntervalChecksOnlyAtEpochEnds) {
  testing::ManualClock time;
  Timer timer({.duration = Seconds(1), .interval = TimerInterval::kEpoch}, time.clock());
  timer.setup({});
  testing::RecordingServices services;
  timer.on_train_start({}, services);
  EXPECT_EQ(batches_until_stop(timer, time, 5.0, services, /*limit=*/4), 4);
  EXPECT_EQ(services.broadcasts, 0);
  EXPECT_TRUE(timer.on_train_epoch_end({}, services).stop);
}

TEST(Timer, WithoutADurationItOnlyMeasures) {
  testing::ManualClock time;
  Timer timer({}, time.clock());
  timer.setup({});
  testing::RecordingServices services;
  timer.on_train_start({}, services);
  EXPECT_EQ(batches_until_stop(timer, time, 1000.0, services, /*limit=*/3), 3);
  EXPECT_EQ(services.broadcasts, 0);
  EXPECT_DOUBLE_EQ(timer.time_elapsed(), 3000.0);
  EXPECT_FALSE(timer.time_remaining().has_value());
}

TEST(Timer, BadOptionsAreClearErrors) {
  EXPECT_THROW((void)Timer({.duration = Seconds(0)}), Error);
  EXPECT_THROW((void)Timer({.duration = Seconds(-1)}), Error);
  try {
    (void)Timer({.filename = "last"});
    FAIL() << "a file name without .ckpt was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("HINT:"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace volt
