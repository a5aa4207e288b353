#include "volt/loggers/csv_logger.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "volt/core/error.h"

namespace volt {
namespace {

namespace fs = std::filesystem;
using Table = std::vector<std::vector<std::string>>;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// A small RFC 4180 reader: quoted fields, doubled quotes, "\r\n" or "\n" line ends.
Table parse_csv(const std::string& text) {
  Table rows(1);
  std::string cell;
  bool quoted = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        cell += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cell += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      rows.back().push_back(cell);
      cell.clear();
    } else if (c == '\n') {
      rows.back().push_back(cell);
      cell.clear();
      rows.emplace_back();
    } else if (c != '\r') {
      cell += c;
    }
  }
  rows.pop_back();  // after the last line end
  return rows;
}

class CSVLoggerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fs::temp_directory_path() / fmt::format("volt_csv_logger_test_{}_{}", info->name(), ::getpid());
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  LoggerOptions options() const {
    LoggerOptions o;
    o.save_dir = root_.string();
    o.name = "exp";
    return o;
  }
  Table metrics(const CSVLogger& logger) const {
    return parse_csv(read_file(fs::path(logger.log_dir()) / "metrics.csv"));
  }

  fs::path root_;
};

TEST_F(CSVLoggerTest, EveryValueReadsBackExactly) {
  CSVLogger logger(options());
  const std::vector<double> losses = {0.1, 1.0 / 3.0, 1e-05, 3.0, 123456.789, -2.5e-300};
  for (std::size_t i = 0; i < losses.size(); ++i) {
    logger.log_metrics({{"train/loss", losses[i]}, {"lr", 0.01 * static_cast<double>(i)}},
                       static_cast<int64_t>(10 * i));
  }
  logger.save();

  const Table table = metrics(logger);
  ASSERT_EQ(table.size(), losses.size() + 1);
  EXPECT_EQ(table[0], (std::vector<std::string>{"lr", "step", "train/loss"}));
  for (std::size_t i = 0; i < losses.size(); ++i) {
    ASSERT_EQ(table[i + 1].size(), 3u);
    EXPECT_EQ(std::stod(table[i + 1][0]), 0.01 * static_cast<double>(i));
    EXPECT_EQ(table[i + 1][1], std::to_string(10 * i));
    EXPECT_EQ(std::stod(table[i + 1][2]), losses[i]) << table[i + 1][2];
  }
  // Python's repr() forms, which Lightning's csv.DictWriter writes.
  EXPECT_EQ(table[1][0], "0.0");
  EXPECT_EQ(table[3][2], "1e-05");
  EXPECT_EQ(table[4][2], "3.0");
}

TEST_F(CSVLoggerTest, TheFileIsByteForByteWhatLightningWrites) {
  CSVLogger logger(options());
  logger.log_metrics({{"loss", 0.5}}, 0);
  logger.log_metrics({{"loss", 0.25}, {"val,acc", 1.0}}, 1);
  logger.finalize("success");
  EXPECT_EQ(read_file(fs::path(logger.log_dir()) / "metrics.csv"), "loss,step,\"val,acc\"\r\n0.5,0,\r\n0.25,1,1.0\r\n");
}

TEST_F(CSVLoggerTest, MissingKeysLeaveEmptyCells) {
  CSVLogger logger(options());
  logger.log_metrics({{"loss", 1.5}}, 0);
  logger.log_metrics({{"val_acc", 0.75}}, 0);
  logger.save();
  const Table table = metrics(logger);
  ASSERT_EQ(table.size(), 3u);
  EXPECT_EQ(table[1], (std::vector<std::string>{"1.5", "0", ""}));
  EXPECT_EQ(table[2], (std::vector<std::string>{"", "0", "0.75"}));
}

TEST_F(CSVLoggerTest, ANewKeyAfterRowsWereWrittenRewritesTheFileUnderTheWiderHeader) {
  CSVLogger logger(options(), /*flush_logs_every_n_steps=*/1);
  logger.log_metrics({{"loss", 0.5}}, 0);
  logger.log_metrics({{"loss", 0.4}}, 1);
  ASSERT_EQ(metrics(logger)[0], (std::vector<std::string>{"loss", "step"}));

  // "acc" sorts before the existing columns, so every old cell moves.
  logger.log_metrics({{"loss", 0.3}, {"acc", 0.9}}, 2);
  const Table table = metrics(logger);
  ASSERT_EQ(table.size(), 4u);
  EXPECT_EQ(table[0], (std::vector<std::string>{"acc", "loss", "step"}));
  EXPECT_EQ(table[1], (std::vector<std::string>{"", "0.5", "0"}));
  EXPECT_EQ(table[2], (std::vector<std::string>{"", "0.4", "1"}));
  EXPECT_EQ(table[3], (std::vector<std::string>{"0.9", "0.3", "2"}));
  EXPECT_FALSE(fs::exists(fs::path(logger.log_dir()) / "metrics.csv.tmp"));
}

TEST_F(CSVLoggerTest, AnAppendingLoggerContinuesTheFileAnEarlierRunLeft) {
  // A requeued job logs into the same (job id) version folder after its restart.
  LoggerOptions o = options();
  o.version = "4242";
  {
    CSVLogger first(o);
    first.log_metrics({{"loss", 0.5}, {"val,acc", 0.25}}, 0);
  }
  o.append = true;
  CSVLogger second(o);
  second.log_metrics({{"loss", 0.4}}, 1);
  second.log_metrics({{"acc", 0.9}}, 2);  // a new column still rewrites the whole file
  second.save();
  const Table table = metrics(second);
  ASSERT_EQ(table.size(), 4u);
  EXPECT_EQ(table[0], (std::vector<std::string>{"acc", "loss", "step", "val,acc"}));
  EXPECT_EQ(table[1], (std::vector<std::string>{"", "0.5", "0", "0.25"}));
  EXPECT_EQ(table[2], (std::vector<std::string>{"", "0.4", "1", ""}));
  EXPECT_EQ(table[3], (std::vector<std::string>{"0.9", "", "2", ""}));

  // Without append, the same folder starts over, as Lightning's CSVLogger does.
  o.append = false;
  CSVLogger third(o);
  third.log_metrics({{"loss", 0.1}}, 3);
  third.save();
  EXPECT_EQ(metrics(third).size(), 2u);
}

TEST_F(CSVLoggerTest, AppendingToAFileThisLoggerDidNotWriteIsAnError) {
  LoggerOptions o = options();
  o.version = "v";
  o.append = true;
  fs::create_directories(root_ / "exp" / "v");
  std::ofstream(root_ / "exp" / "v" / "metrics.csv") << "b,a\r\n1,2\r\n";
  CSVLogger logger(o);
  logger.log_metrics({{"loss", 0.1}}, 0);
  try {
    logger.save();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("HINT: move the file away"), std::string::npos) << e.what();
  }
}

TEST_F(CSVLoggerTest, RowsAreBufferedUntilEveryNthCall) {
  CSVLogger logger(options(), /*flush_logs_every_n_steps=*/3);
  EXPECT_FALSE(fs::exists(logger.log_dir())) << "the constructor must not create the log dir";
  logger.log_metrics({{"loss", 1.0}}, 0);
  logger.log_metrics({{"loss", 2.0}}, 1);
  EXPECT_FALSE(fs::exists(fs::path(logger.log_dir()) / "metrics.csv"));
  logger.log_metrics({{"loss", 3.0}}, 2);
  EXPECT_EQ(metrics(logger).size(), 4u);
  logger.log_metrics({{"loss", 4.0}}, 3);
  EXPECT_EQ(metrics(logger).size(), 4u);
  logger.finalize("success");
  EXPECT_EQ(metrics(logger).size(), 5u);
}

TEST_F(CSVLoggerTest, TheDestructorWritesBufferedRows) {
  std::string log_dir;
  {
    CSVLogger logger(options());
    logger.log_metrics({{"loss", 1.0}}, 0);
    log_dir = logger.log_dir();
  }
  EXPECT_EQ(parse_csv(read_file(fs::path(log_dir) / "metrics.csv")).size(), 2u);
}

TEST_F(CSVLoggerTest, RowsTheDestructorCannotWriteAreAWarningOnTheConsole) {
  // A file where the log directory should be: nothing can be written under it.
  fs::create_directories(root_);
  std::ofstream(root_ / "exp") << "not a folder";
  const auto console = std::make_shared<RecordingConsole>();
  LoggerOptions o = options();
  o.console = console;
  {
    CSVLogger logger(o);
    logger.log_metrics({{"loss", 1.0}}, 0);
  }
  ASSERT_EQ(console->warnings.size(), 1u);
  EXPECT_EQ(console->warnings[0].rfind("CSVLogger lost 1 metric rows: ", 0), 0u) << console->warnings[0];
}

TEST_F(CSVLoggerTest, VersionsIncrementAcrossRuns) {
  for (int run = 0; run < 3; ++run) {
    CSVLogger logger(options());
    EXPECT_EQ(logger.log_dir(), (root_ / "exp" / fmt::format("version_{}", run)).string());
    EXPECT_EQ(logger.name(), "exp");
    logger.log_metrics({{"loss", 1.0}}, 0);
    logger.finalize("success");
  }
  EXPECT_TRUE(fs::is_directory(root_ / "exp" / "version_2"));
}

TEST_F(CSVLoggerTest, AReusedVersionReplacesTheOldMetricsFile) {
  LoggerOptions o = options();
  o.version = "fixed";
  {
    CSVLogger logger(o);
    logger.log_metrics({{"old", 1.0}}, 0);
  }
  CSVLogger logger(o);
  logger.log_metrics({{"new", 2.0}}, 0);
  logger.save();
  const Table table = metrics(logger);
  ASSERT_EQ(table.size(), 2u);
  EXPECT_EQ(table[0], (std::vector<std::string>{"new", "step"}));
}

TEST_F(CSVLoggerTest, StepWinsOverAMetricNamedStep) {
  CSVLogger logger(options());
  logger.log_metrics({{"step", 99.0}, {"loss", 1.0}}, 7);
  logger.save();
  EXPECT_EQ(metrics(logger)[1], (std::vector<std::string>{"1.0", "7"}));
}

TEST_F(CSVLoggerTest, HyperparametersAreMergedIntoHparamsYaml) {
  CSVLogger logger(options());
  logger.log_hyperparams({{"lr", 0.001}, {"model", {{"hidden", 128}}}});
  logger.log_hyperparams({{"batch_size", 32}, {"lr", 0.01}});
  const YAML::Node yaml = YAML::LoadFile((fs::path(logger.log_dir()) / "hparams.yaml").string());
  EXPECT_EQ(yaml.size(), 3u);
  EXPECT_EQ(yaml["lr"].as<double>(), 0.01);
  EXPECT_EQ(yaml["batch_size"].as<int>(), 32);
  EXPECT_EQ(yaml["model"]["hidden"].as<int>(), 128);
}

TEST_F(CSVLoggerTest, HyperparametersMustBeAnObject) {
  CSVLogger logger(options());
  EXPECT_THROW(logger.log_hyperparams(nlohmann::json::array({1, 2})), Error);
}

TEST(CSVLogger, RejectsAFlushIntervalBelowOne) { EXPECT_THROW(CSVLogger(LoggerOptions{}, 0), Error); }

}  // namespace
}  // namespace volt
