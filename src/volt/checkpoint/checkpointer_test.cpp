#include "volt/checkpoint/checkpointer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "volt/core/console.h"
#include "volt/core/error.h"

namespace volt {
namespace {

namespace fs = std::filesystem;

class LastCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("volt_last_ckpt_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  /// Creates `relative` under the root; `age_seconds` back-dates it.
  std::string touch(const std::string& relative, int age_seconds = 0) {
    const fs::path path = root_ / relative;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << "x";
    fs::last_write_time(path, fs::file_time_type::clock::now() - std::chrono::seconds(age_seconds));
    return path.string();
  }

  fs::path root_;
};

TEST_F(LastCheckpointTest, TheHighestVersionWithACheckpointWinsNumerically) {
  touch("lightning_logs/version_2/checkpoints/epoch=1-step=10.ckpt", 5);
  const std::string ten = touch("lightning_logs/version_10/checkpoints/epoch=0-step=5.ckpt", 100);
  fs::create_directories(root_ / "lightning_logs/version_11/checkpoints");  // this run's, still empty
  EXPECT_EQ(find_last_checkpoint({.root_dir = root_.string()}), ten);
}

TEST_F(LastCheckpointTest, AnotherProgramsNewerFileElsewhereUnderTheRootIsNotPicked) {
  const std::string mine = touch("lightning_logs/version_0/checkpoints/epoch=2-step=30.ckpt", 60);
  touch("other_experiment/deep/folder/newer.ckpt", 0);
  touch("lightning_logs/version_0/newer-but-not-a-checkpoint-folder.ckpt", 0);
  EXPECT_EQ(find_last_checkpoint({.root_dir = root_.string()}), mine);
}

TEST_F(LastCheckpointTest, LastCkptBeatsNewerCheckpointsOfTheSameRun) {
  const std::string last = touch("lightning_logs/version_0/checkpoints/last.ckpt", 30);
  touch("lightning_logs/version_0/checkpoints/epoch=3-step=40.ckpt", 0);
  EXPECT_EQ(find_last_checkpoint({.root_dir = root_.string()}), last);
}

TEST_F(LastCheckpointTest, AnExplicitDirpathIsTheOnlyFolderSearched) {
  touch("lightning_logs/version_0/checkpoints/last.ckpt");
  EXPECT_EQ(find_last_checkpoint({.checkpoint_dir = (root_ / "mine").string(), .root_dir = root_.string()}), "");
  const std::string old = touch("mine/epoch=0.ckpt", 50);
  const std::string newer = touch("mine/epoch=1.ckpt", 10);
  EXPECT_EQ(find_last_checkpoint({.checkpoint_dir = (root_ / "mine").string(), .root_dir = root_.string()}), newer);
  (void)old;
}

TEST_F(LastCheckpointTest, ASlurmJobsOwnVersionFolderComesFirst) {
  touch("lightning_logs/version_7/checkpoints/last.ckpt", 0);
  const std::string job = touch("lightning_logs/4242/checkpoints/last.ckpt", 100);
  EXPECT_EQ(find_last_checkpoint({.root_dir = root_.string(), .version = "4242"}), job);
}

TEST_F(LastCheckpointTest, RunsWithoutALoggerSaveUnderTheRoot) {
  const std::string plain = touch("checkpoints/epoch=0-step=4.ckpt");
  EXPECT_EQ(find_last_checkpoint({.root_dir = root_.string()}), plain);
}

TEST(Checkpointer, ResolveBestWithoutABestCheckpointIsAClearError) {
  Checkpointer checkpointer(std::make_shared<InMemoryCheckpointIO>());
  RecordingConsole console;
  try {
    checkpointer.resolve("best", {}, console);
    FAIL() << "expected volt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("HINT:"), std::string::npos) << e.what();
  }
  checkpointer.remember("/runs/best.ckpt", "/runs/last.ckpt");
  EXPECT_EQ(checkpointer.resolve("best", {}, console), "/runs/best.ckpt");
  EXPECT_EQ(checkpointer.resolve("last", {}, console), "/runs/last.ckpt");
}

TEST(Checkpointer, ResolveLastWithNothingSavedWarnsAndStartsFresh) {
  Checkpointer checkpointer(std::make_shared<InMemoryCheckpointIO>());
  RecordingConsole console;
  EXPECT_EQ(checkpointer.resolve("last", {.root_dir = "/nonexistent/volt"}, console), "");
  ASSERT_EQ(console.warnings.size(), 1u);
  EXPECT_NE(console.warnings[0].find("starting from scratch"), std::string::npos);
}

}  // namespace
}  // namespace volt
