#include "volt/loggers/logger.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "volt/core/error.h"

namespace volt {
namespace {

namespace fs = std::filesystem;

/// A fresh directory under the system temp dir, removed with everything in it at the end.
class LogDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fs::temp_directory_path() / fmt::format("volt_logger_test_{}_{}", info->name(), ::getpid());
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

TEST(LoggerOptions, DefaultsAreLightningsLayout) {
  const LoggerOptions options;
  EXPECT_EQ(options.save_dir, ".");
  EXPECT_EQ(options.name, "lightning_logs");
  EXPECT_FALSE(options.version.has_value());
  EXPECT_FALSE(options.append);
  EXPECT_NE(options.console, nullptr) << "warnings go to stdout and stderr unless a console is given";
}

TEST_F(LogDirTest, FirstVersionIsZeroWhenNothingExists) {
  EXPECT_EQ(resolve_log_dir(options()), (root_ / "lightning_logs" / "version_0").string());
  EXPECT_FALSE(fs::exists(root_ / "lightning_logs")) << "resolving must not create the folder";
}

TEST_F(LogDirTest, NextVersionIsOneMoreThanTheLargestExisting) {
  fs::create_directories(root_ / "lightning_logs" / "version_0");
  fs::create_directories(root_ / "lightning_logs" / "version_7");
  fs::create_directories(root_ / "lightning_logs" / "version_3");
  EXPECT_EQ(resolve_log_dir(options()), (root_ / "lightning_logs" / "version_8").string());
}

TEST_F(LogDirTest, FoldersThatAreNotNumberedVersionsAreIgnored) {
  fs::create_directories(root_ / "lightning_logs" / "version_2");
  fs::create_directories(root_ / "lightning_logs" / "version_9_old");
  fs::create_directories(root_ / "lightning_logs" / "version_");
  fs::create_directories(root_ / "lightning_logs" / "other_5");
  std::ofstream(root_ / "lightning_logs" / "version_20").close();  // a file, not a folder
  EXPECT_EQ(resolve_log_dir(options()), (root_ / "lightning_logs" / "version_3").string());
}

TEST_F(LogDirTest, AStringVersionIsUsedVerbatim) {
  LoggerOptions o = options();
  o.version = "slurm_12345";
  EXPECT_EQ(resolve_log_dir(o), (root_ / "lightning_logs" / "slurm_12345").string());
}

TEST_F(LogDirTest, AnEmptyNamePutsVersionsDirectlyInSaveDir) {
  LoggerOptions o = options();
  o.name = "";
  fs::create_directories(root_ / "version_4");
  EXPECT_EQ(resolve_log_dir(o), (root_ / "version_5").string());
}

TEST_F(LogDirTest, ResolveVersionNamesTheFolderThatResolveLogDirUses) {
  fs::create_directories(root_ / "lightning_logs" / "version_2");
  EXPECT_EQ(resolve_version(options()), "version_3");
  LoggerOptions o = options();
  o.version = resolve_version(o);
  fs::create_directories(resolve_log_dir(o));
  EXPECT_EQ(resolve_log_dir(o), (root_ / "lightning_logs" / "version_3").string())
      << "a resolved version stays put after its folder exists, so loggers can share it";
}

TEST_F(LogDirTest, ACheckpointsFilesAreItselfAndItsShardsInRankOrder) {
  const auto touch = [&](const std::string& name) { std::ofstream(root_ / name) << "x"; };
  for (const char* name : {"last.ckpt", "last.ckpt.0123456789abcdef.shard10", "last.ckpt.0123456789abcdef.shard2",
                           "last.ckpt.0123456789abcdef.shard0",
                           // Not its shards: another checkpoint's, no save id, a temporary file.
                           "last.ckpt.v1", "last.ckpt.v1.0123456789abcdef.shard0", "last.ckpt.shard0",
                           "last.ckpt.0123456789abcdef.shard0.tmp", "last.ckpt.0123456789ABCDEF.shard1"})
    touch(name);
  const std::string last = (root_ / "last.ckpt").string();
  EXPECT_EQ(checkpoint_files(last),
            (std::vector<std::string>{last, (root_ / "last.ckpt.0123456789abcdef.shard0").string(),
                                      (root_ / "last.ckpt.0123456789abcdef.shard2").string(),
                                      (root_ / "last.ckpt.0123456789abcdef.shard10").string()}));
  const std::string plain = (root_ / "last.ckpt.v1").string();
  EXPECT_EQ(checkpoint_files(plain).size(), 2u) << "last.ckpt.v1 has a shard of its own";
  EXPECT_EQ(checkpoint_files((root_ / "gone" / "a.ckpt").string()),
            std::vector<std::string>{(root_ / "gone" / "a.ckpt").string()});
}

TEST(VersionName, IsLightningsFolderForAnIntegerVersion) {
  EXPECT_EQ(version_name(0), "version_0");
  EXPECT_EQ(version_name(12), "version_12");
  EXPECT_THROW(version_name(-1), Error);
}

TEST(ResolveLogDir, RejectsAnEmptyVersionWithAHint) {
  LoggerOptions o;
  o.version = "";
  try {
    resolve_log_dir(o);
    FAIL() << "expected volt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("HINT:"), std::string::npos) << e.what();
  }
}

TEST(LoggerConsole, ANullConsoleIsRefusedWithAHint) {
  LoggerOptions o;
  o.console = nullptr;
  try {
    internal::logger_console(o, "CSVLogger");
    FAIL() << "expected volt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CSVLogger"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("HINT:"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace volt
