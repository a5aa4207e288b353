#include "volt/loggers/tensorboard_logger.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "volt/core/error.h"
#include "volt/loggers/csv_logger.h"
#include "volt/loggers/tensorboard_event.pb.h"
#include "volt/loggers/tfrecord_test_reader.h"

namespace volt {
namespace {

namespace fs = std::filesystem;
namespace pb = ::volt::tensorboard;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// Every event in the event file at `path`, CRCs checked.
std::vector<pb::Event> read_events(const std::string& path) {
  std::vector<pb::Event> events;
  for (const std::string& record : testing::read_tfrecords(read_file(path))) {
    pb::Event event;
    EXPECT_TRUE(event.ParseFromString(record));
    events.push_back(event);
  }
  return events;
}

/// The event files in `dir`, sorted by name.
std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(TensorBoardLogger::kEventFilePrefix, 0) == 0) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

/// The hparams plugin data of the summaries tagged `tag`, in file order.
std::vector<pb::HParamsPluginData> plugin_data(const std::vector<pb::Event>& events, const std::string& tag) {
  std::vector<pb::HParamsPluginData> found;
  for (const pb::Event& event : events) {
    for (const auto& value : event.summary().value()) {
      if (value.tag() != tag) continue;
      EXPECT_EQ(value.metadata().plugin_data().plugin_name(), "hparams");
      pb::HParamsPluginData data;
      EXPECT_TRUE(data.ParseFromString(value.metadata().plugin_data().content()));
      found.push_back(data);
    }
  }
  return found;
}

class TensorBoardLoggerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fs::temp_directory_path() / fmt::format("volt_tensorboard_test_{}_{}", info->name(), ::getpid());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  LoggerOptions options() const {
    LoggerOptions o;
    o.save_dir = root_.string();
    return o;
  }

  fs::path root_;
};

TEST(TensorBoardOptions, DefaultsAreLightnings) {
  const TensorBoardOptions options;
  EXPECT_EQ(options.flush_secs, 120);
  EXPECT_TRUE(options.default_hp_metric);
  EXPECT_EQ(options.filename_suffix, "");
}

TEST_F(TensorBoardLoggerTest, WritesToTheNextVersionAndCreatesNothingBeforeTheFirstRecord) {
  fs::create_directories(root_ / "lightning_logs" / "version_4");
  TensorBoardLogger logger(options());
  EXPECT_EQ(logger.name(), "lightning_logs");
  EXPECT_EQ(logger.version(), "version_5");
  EXPECT_EQ(logger.log_dir(), (root_ / "lightning_logs" / "version_5").string());
  EXPECT_EQ(logger.event_file_path(), "");
  EXPECT_FALSE(fs::exists(logger.log_dir()));
}

TEST_F(TensorBoardLoggerTest, TheEventFileIsNamedAsTensorBoardsWriterNamesIt) {
  TensorBoardLogger logger(options());
  logger.log_metrics({{"loss", 1.0}}, 0);
  const fs::path path(logger.event_file_path());
  EXPECT_EQ(path.parent_path().string(), logger.log_dir());
  const std::regex pattern(fmt::format(R"(events\.out\.tfevents\.\d{{10}}\.[^.].*\.{}\.\d+)", ::getpid()));
  EXPECT_TRUE(std::regex_match(path.filename().string(), pattern)) << path;
  EXPECT_EQ(event_files(logger.log_dir()), std::vector<fs::path>{path});
}

TEST_F(TensorBoardLoggerTest, TheFirstRecordSaysBrainEvent2) {
  TensorBoardLogger logger(options());
  logger.log_metrics({{"loss", 1.0}}, 0);
  logger.save();
  const auto events = read_events(logger.event_file_path());
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_GT(events[0].wall_time(), 1.6e9) << "seconds since 1970";
}

TEST_F(TensorBoardLoggerTest, EveryMetricIsAFloatScalarAtItsStep) {
  TensorBoardLogger logger(options());
  logger.log_metrics({{"train/loss", 0.25}, {"lr", 1e-3}}, 7);
  logger.log_metrics({{"val/acc", 0.0}, {"epoch", 2}}, 120);
  logger.save();
  const auto events = read_events(logger.event_file_path());
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[1].step(), 7);
  ASSERT_EQ(events[1].summary().value_size(), 2);
  EXPECT_EQ(events[1].summary().value(0).tag(), "lr");
  EXPECT_EQ(events[1].summary().value(0).simple_value(), 1e-3f);
  EXPECT_EQ(events[1].summary().value(1).tag(), "train/loss");
  EXPECT_EQ(events[1].summary().value(1).simple_value(), 0.25f);
  EXPECT_EQ(events[2].step(), 120);
  ASSERT_EQ(events[2].summary().value_size(), 2);
  EXPECT_EQ(events[2].summary().value(0).tag(), "epoch");
  EXPECT_EQ(events[2].summary().value(0).simple_value(), 2.0f);
  EXPECT_EQ(events[2].summary().value(1).tag(), "val/acc");
  EXPECT_TRUE(events[2].summary().value(1).has_simple_value()) << "a zero is still written";
}

TEST_F(TensorBoardLoggerTest, HyperparametersGoToTheHparamsPluginFlattenedAsLightningDoes) {
  TensorBoardLogger logger(options());
  logger.log_hyperparams({{"lr", 0.01}, {"optimizer", {{"name", "adam"}, {"betas", {0.9, 0.99}}}}});
  logger.log_hyperparams({{"batch_size", 64}, {"shuffle", true}, {"note", nullptr}});
  logger.save();
  const auto events = read_events(logger.event_file_path());

  const auto starts = plugin_data(events, "_hparams_/session_start_info");
  ASSERT_EQ(starts.size(), 2u) << "one per call, each with everything logged so far";
  const auto& hparams = starts[1].session_start_info().hparams();
  ASSERT_EQ(hparams.size(), 6u);
  EXPECT_EQ(hparams.at("lr").number_value(), 0.01);
  EXPECT_EQ(hparams.at("batch_size").number_value(), 64);
  EXPECT_EQ(hparams.at("shuffle").bool_value(), true);
  EXPECT_EQ(hparams.at("optimizer/name").string_value(), "adam");
  EXPECT_EQ(hparams.at("optimizer/betas").string_value(), "[0.9,0.99]");
  EXPECT_EQ(hparams.at("note").string_value(), "None");

  const auto experiments = plugin_data(events, "_hparams_/experiment");
  ASSERT_EQ(experiments.size(), 2u);
  const pb::Experiment& experiment = experiments[1].experiment();
  ASSERT_EQ(experiment.hparam_infos_size(), 6);
  for (const pb::HParamInfo& info : experiment.hparam_infos()) {
    if (info.name() == "lr") {
      EXPECT_EQ(info.type(), pb::DATA_TYPE_FLOAT64);
    }
    if (info.name() == "shuffle") {
      EXPECT_EQ(info.type(), pb::DATA_TYPE_BOOL);
      EXPECT_EQ(info.domain_discrete().values_size(), 2);
    }
    if (info.name() == "optimizer/name") {
      EXPECT_EQ(info.type(), pb::DATA_TYPE_STRING);
      ASSERT_EQ(info.domain_discrete().values_size(), 1);
      EXPECT_EQ(info.domain_discrete().values(0).string_value(), "adam");
    }
  }
  ASSERT_EQ(experiment.metric_infos_size(), 1);
  EXPECT_EQ(experiment.metric_infos(0).name().tag(), "hp_metric");

  int hp_metrics = 0;
  for (const pb::Event& event : events) {
    for (const auto& value : event.summary().value()) {
      if (value.tag() != "hp_metric") continue;
      ++hp_metrics;
      EXPECT_EQ(event.step(), 0);
      EXPECT_EQ(value.simple_value(), -1.0f);
    }
  }
  EXPECT_EQ(hp_metrics, 2);
  EXPECT_TRUE(fs::exists(fs::path(logger.log_dir()) / "hparams.yaml"));
}

TEST_F(TensorBoardLoggerTest, TheDefaultHpMetricCanBeTurnedOff) {
  TensorBoardOptions tb;
  tb.default_hp_metric = false;
  TensorBoardLogger logger(options(), tb);
  logger.log_hyperparams({{"lr", 0.01}});
  logger.save();
  const auto events = read_events(logger.event_file_path());
  EXPECT_EQ(plugin_data(events, "_hparams_/experiment").at(0).experiment().metric_infos_size(), 0);
  for (const pb::Event& event : events) {
    for (const auto& value : event.summary().value()) EXPECT_NE(value.tag(), "hp_metric");
  }
}

TEST_F(TensorBoardLoggerTest, FinalizeEndsTheSessionWithItsStatusAndClosesTheFile) {
  const std::vector<std::pair<std::string, pb::Status>> cases = {
      {"success", pb::STATUS_SUCCESS}, {"failed", pb::STATUS_FAILURE}, {"interrupted", pb::STATUS_UNKNOWN}};
  for (const auto& [status, expected] : cases) {
    LoggerOptions o = options();
    o.version = status;
    TensorBoardLogger logger(o);
    logger.log_hyperparams({{"lr", 0.01}});
    logger.finalize(status);
    const auto ends = plugin_data(read_events(logger.event_file_path()), "_hparams_/session_end_info");
    ASSERT_EQ(ends.size(), 1u) << status;
    EXPECT_EQ(ends[0].session_end_info().status(), expected) << status;
    EXPECT_GT(ends[0].session_end_info().end_time_secs(), 1.6e9);
  }
}

TEST_F(TensorBoardLoggerTest, FinalizeWithoutHyperparametersWritesNoSessionEnd) {
  TensorBoardLogger logger(options());
  logger.log_metrics({{"loss", 1.0}}, 1);
  logger.finalize("success");
  EXPECT_TRUE(plugin_data(read_events(logger.event_file_path()), "_hparams_/session_end_info").empty());
}

TEST_F(TensorBoardLoggerTest, ARecordAfterFinalizeStartsANewFile) {
  TensorBoardLogger logger(options());
  logger.log_metrics({{"loss", 1.0}}, 1);
  logger.finalize("success");
  const std::string first = logger.event_file_path();
  logger.log_metrics({{"test/acc", 0.5}}, 2);
  logger.finalize("success");
  EXPECT_NE(logger.event_file_path(), first);
  EXPECT_EQ(event_files(logger.log_dir()).size(), 2u);
  const auto events = read_events(logger.event_file_path());
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
}

TEST_F(TensorBoardLoggerTest, SaveFlushesEverythingLoggedSoFar) {
  TensorBoardLogger logger(options());  // flush_secs 120: nothing is flushed on its own here
  for (int step = 0; step < 50; ++step) logger.log_metrics({{"loss", 1.0 / (step + 1)}}, step);
  logger.save();
  EXPECT_EQ(read_events(logger.event_file_path()).size(), 51u);
}

TEST_F(TensorBoardLoggerTest, ZeroFlushSecsFlushesEveryRecord) {
  TensorBoardOptions tb;
  tb.flush_secs = 0;
  TensorBoardLogger logger(options(), tb);
  logger.log_metrics({{"loss", 1.0}}, 0);
  EXPECT_EQ(read_events(logger.event_file_path()).size(), 2u);
}

TEST_F(TensorBoardLoggerTest, SharesOneVersionFolderWithCSVLoggerThroughResolveVersion) {
  fs::create_directories(root_ / "lightning_logs" / "version_1");
  LoggerOptions o = options();
  o.version = resolve_version(o);
  TensorBoardLogger tensorboard(o);
  tensorboard.log_metrics({{"loss", 1.0}}, 0);  // creates version_2 before CSVLogger resolves
  CSVLogger csv(o);
  EXPECT_EQ(csv.log_dir(), tensorboard.log_dir());
  EXPECT_EQ(tensorboard.version(), "version_2");
}

TEST_F(TensorBoardLoggerTest, AStringVersionSuchAsASlurmJobIdIsUsedVerbatim) {
  LoggerOptions o = options();
  o.version = "12345_3";
  TensorBoardLogger logger(o);
  EXPECT_EQ(logger.log_dir(), (root_ / "lightning_logs" / "12345_3").string());
  o.version = version_name(7);
  EXPECT_EQ(TensorBoardLogger(o).log_dir(), (root_ / "lightning_logs" / "version_7").string());
}

TEST_F(TensorBoardLoggerTest, AnUnwritableSaveDirIsAClearErrorWithAHint) {
  std::ofstream(root_ / "a_file") << "not a directory";
  LoggerOptions o = options();
  o.save_dir = (root_ / "a_file" / "runs").string();
  TensorBoardLogger logger(o);
  try {
    logger.log_metrics({{"loss", 1.0}}, 0);
    FAIL() << "expected volt::Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(o.save_dir), std::string::npos) << message;
    EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
  }
}

TEST_F(TensorBoardLoggerTest, HyperparametersMustBeAnObject) {
  TensorBoardLogger logger(options());
  EXPECT_THROW(logger.log_hyperparams(nlohmann::json::array({1, 2})), Error);
}

TEST(TensorBoardLogger, RejectsANegativeFlushInterval) {
  TensorBoardOptions tb;
  tb.flush_secs = -1;
  try {
    TensorBoardLogger logger(LoggerOptions{}, tb);
    FAIL() << "expected volt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("flush_secs is -1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("HINT:"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace volt
