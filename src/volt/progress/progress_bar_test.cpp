#include "volt/progress/progress_bar.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "volt/core/error.h"

namespace volt {
namespace {

/// A bar on an ostringstream with a clock the test moves by hand.
struct Harness {
  explicit Harness(ProgressBarOptions options) : bar(options, out, [this] { return now; }) {}
  int count(const std::string& what) const {
    int n = 0;
    const std::string text = out.str();
    for (auto pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
    return n;
  }
  double now = 0;
  std::ostringstream out;
  ProgressBar bar;
};

ProgressBarOptions tty_options() {
  ProgressBarOptions options;
  options.is_tty = true;
  return options;
}

ProgressBarOptions plain_options() {
  ProgressBarOptions options;
  options.is_tty = false;
  return options;
}

TEST(ProgressBarOptions, DefaultsRedrawTenTimesASecondAndLogTwiceAMinute) {
  const ProgressBarOptions options;
  EXPECT_TRUE(options.enabled);
  EXPECT_FALSE(options.is_tty.has_value());
  EXPECT_EQ(options.refresh_seconds, 0.1);
  EXPECT_EQ(options.plain_line_seconds, 30);
  EXPECT_EQ(options.width, 100);
}

TEST(ProgressBar, TerminalLineHasTqdmsLayout) {
  const std::string left = "Epoch 1:  45%|";
  const std::string right = "| 450/1000 [00:05<00:06, 90.0it/s, loss=0.4123, val/acc=0.8731]";
  ProgressBarOptions options = tty_options();
  options.width = static_cast<int>(left.size() + 10 + right.size());  // a bar of 10 columns
  Harness h(options);
  h.bar.start("Epoch 1", 1, 1000);
  h.out.str("");
  h.now = 5;
  h.bar.update(450, {{"loss", 0.41234}, {"val/acc", 0.873123}});
  EXPECT_EQ(h.out.str(), "\r" + left + "████▌     " + right + "\x1b[K");
}

TEST(ProgressBar, ANoteFollowsTheMetricsUntilCleared) {
  Harness h(plain_options());
  h.bar.start("Epoch 0", 0, 100);
  h.bar.set_note("slow: rank 3 (data)");
  h.now = 31;
  h.bar.update(10, {{"loss", 0.5}});
  EXPECT_NE(h.out.str().find("loss=0.5, slow: rank 3 (data)"), std::string::npos) << h.out.str();
  h.bar.set_note("");
  h.out.str("");
  h.bar.finish({{"loss", 0.5}});
  EXPECT_EQ(h.out.str().find("slow:"), std::string::npos) << h.out.str();
}

TEST(ProgressBar, StartShowsAnEmptyBarOnATerminal) {
  ProgressBarOptions options = tty_options();
  options.width = 49;  // a bar of 10 columns
  Harness h(options);
  h.bar.start("Validation", 0, 8);
  EXPECT_EQ(h.out.str(), "\rValidation:   0%|          | 0/8 [00:00<?, ?it/s]\x1b[K");
}

TEST(ProgressBar, ManyUpdatesWithinTheRefreshIntervalDrawOnce) {
  Harness h(tty_options());
  h.bar.start("Epoch 0", 0, 10000);
  ASSERT_EQ(h.count("\r"), 1);
  for (int i = 1; i <= 99; ++i) {  // all before the first refresh is due
    h.now = 0.001 * i;
    h.bar.update(i, {{"loss", 1.0}});
  }
  EXPECT_EQ(h.count("\r"), 1);
  for (int i = 0; i < 99; ++i) {  // 0.1 <= now < 0.2: one draw
    h.now = 0.1 + 0.001 * i;
    h.bar.update(100 + i, {{"loss", 1.0}});
  }
  EXPECT_EQ(h.count("\r"), 2);
  h.now = 0.2;
  h.bar.update(300, {});
  EXPECT_EQ(h.count("\r"), 3);
}

TEST(ProgressBar, PlainModeWritesAtMostOneLinePerInterval) {
  Harness h(plain_options());
  h.bar.start("Epoch 2", 2, 1000);
  for (int second = 1; second <= 100; ++second) {
    h.now = second;
    h.bar.update(second * 5, {{"loss", 0.5}});
  }
  EXPECT_EQ(h.count("\n"), 3);  // at 30, 60 and 90 seconds
  EXPECT_EQ(h.count("\r"), 0);
  EXPECT_NE(h.out.str().find("Epoch 2: 150/1000 (15%) 5.00 it/s, elapsed 00:30, ETA 02:50, loss=0.5\n"),
            std::string::npos)
      << h.out.str();
}

TEST(ProgressBar, FinishAlwaysWritesTheFinalLine) {
  Harness h(plain_options());
  h.bar.start("Epoch 0", 0, 10);
  h.now = 2;
  h.bar.update(10, {});
  EXPECT_EQ(h.out.str(), "") << "the update was throttled";
  h.bar.finish({{"loss", 0.25}});
  EXPECT_EQ(h.out.str(), "Epoch 0: 10/10 (100%) 5.00 it/s, elapsed 00:02, ETA 00:00, loss=0.25\n");
}

TEST(ProgressBar, PlainModeNeverWritesTheSameStepTwice) {
  // The epoch's last batch comes after the interval: its line is finish()'s alone, though the
  // loop's update (and its forced one at the epoch's end) came first.
  Harness h(plain_options());
  h.bar.start("Epoch 0", 0, 10);
  h.now = 31;
  h.bar.update(10, {{"loss", 0.25}});
  h.bar.update(10, {{"loss", 0.25}});
  h.bar.finish({{"loss", 0.25}, {"val/acc", 0.5}});
  EXPECT_EQ(h.count("Epoch 0: 10/10"), 1) << h.out.str();
  EXPECT_EQ(h.count("val/acc=0.5"), 1) << h.out.str();

  // An epoch cut short (max_steps) ends at the step a tick just wrote, with the same values.
  h.out.str("");
  h.bar.start("Epoch 1", 1, 10);
  h.now = 62;
  h.bar.update(4, {{"loss", 0.5}});
  h.bar.update(4, {{"loss", 0.5}});
  h.now = 93;
  h.bar.update(4, {{"loss", 0.5}});
  h.bar.finish({{"loss", 0.5}});
  EXPECT_EQ(h.count("Epoch 1: 4/10"), 1) << h.out.str();

  // A validation bar's last batch, then its metrics.
  h.out.str("");
  h.bar.start("Validation", 1, 3);
  h.now = 124;
  h.bar.update(3, {});
  h.bar.finish({{"val/loss", 0.125}});
  EXPECT_EQ(h.out.str(), "Validation: 3/3 (100%) 10.3 s/it, elapsed 00:31, ETA 00:00, val/loss=0.125\n");
}

TEST(ProgressBar, FinishEndsTheTerminalLine) {
  ProgressBarOptions options = tty_options();
  options.width = 44;  // a bar of 10 columns
  Harness h(options);
  h.bar.start("", -1, 4);
  h.now = 0.05;
  h.bar.update(4, {});
  h.out.str("");
  h.bar.finish({});
  EXPECT_EQ(h.out.str(), "\r100%|██████████| 4/4 [00:00<00:00, 80.0it/s]\x1b[K\n");
}

TEST(ProgressBar, UnknownTotalShowsCountAndRateOnly) {
  Harness tty(tty_options());
  tty.bar.start("Validation", 1, -1);
  tty.now = 3;
  tty.out.str("");
  tty.bar.update(30, {});
  EXPECT_EQ(tty.out.str(), "\rValidation: 30it [00:03, 10.0it/s]\x1b[K");

  Harness plain(plain_options());
  plain.bar.start("Validation", 1, -1);
  plain.now = 3;
  plain.bar.finish({});
  EXPECT_EQ(plain.out.str(), "Validation: 0 ? it/s, elapsed 00:03\n");
}

TEST(ProgressBar, SlowStepsShowSecondsPerStepAndLongRunsShowHours) {
  Harness h(plain_options());
  h.bar.start("Epoch 0", 0, 4000);
  h.now = 3725;  // 1 h 2 min 5 s
  h.bar.update(1000, {});
  EXPECT_EQ(h.out.str(), "Epoch 0: 1000/4000 (25%) 3.73 s/it, elapsed 1:02:05, ETA 3:06:15\n");
}

TEST(ProgressBar, MetricsShowFourSignificantDigits) {
  Harness h(plain_options());
  h.bar.start("Epoch 0", 0, 1);
  h.now = 1;
  h.bar.finish({{"a", 123456.0}, {"b", 0.000123456}, {"c", 2.0}});
  EXPECT_NE(h.out.str().find(", a=1.235e+05, b=0.0001235, c=2\n"), std::string::npos) << h.out.str();
}

TEST(ProgressBar, PrintClearsTheBarAndRedrawsIt) {
  ProgressBarOptions options = tty_options();
  options.width = 46;  // a bar of 10 columns
  Harness h(options);
  h.bar.start("Epoch 0", 0, 8);
  const std::string bar = "Epoch 0:   0%|          | 0/8 [00:00<?, ?it/s]";
  h.out.str("");
  h.bar.print("checkpoint saved");
  EXPECT_EQ(h.out.str(), "\r\x1b[Kcheckpoint saved\n\r" + bar + "\x1b[K");
}

TEST(ProgressBar, LongLinesAreCutToTheWidth) {
  ProgressBarOptions options = tty_options();
  options.width = 30;
  Harness h(options);
  h.bar.start("Epoch 0", 0, 8);
  h.now = 1;
  h.out.str("");
  h.bar.update(4, {{"a_long_metric_name", 1.0}, {"another_one", 2.0}});
  EXPECT_EQ(h.out.str(), "\rEpoch 0:  50%|▌| 4/8 [00:01<00\x1b[K");
}

TEST(ProgressBar, DisabledBarWritesOnlyPrintedLines) {
  ProgressBarOptions options = tty_options();
  options.enabled = false;
  Harness h(options);
  h.bar.start("Epoch 0", 0, 8);
  h.now = 5;
  h.bar.update(8, {{"loss", 1.0}});
  h.bar.finish({});
  h.bar.print("hello");
  EXPECT_EQ(h.out.str(), "hello\n");
}

TEST(ProgressBar, InvalidOptionsAreRejectedWithAHint) {
  std::ostringstream out;
  ProgressBarOptions options;
  options.width = 3;
  try {
    ProgressBar bar(options, out);
    FAIL() << "expected volt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("HINT:"), std::string::npos) << e.what();
  }
  options = ProgressBarOptions{};
  options.refresh_seconds = -1;
  EXPECT_THROW(ProgressBar(options, out), Error);
}

}  // namespace
}  // namespace volt
