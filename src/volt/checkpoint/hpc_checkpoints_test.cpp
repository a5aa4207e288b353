#include "volt/checkpoint/hpc_checkpoints.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace volt {
namespace {

namespace fs = std::filesystem;

class HpcCheckpoints : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("volt-hpc-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void touch(const std::string& name) const { std::ofstream(dir_ / name) << "x"; }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(HpcCheckpoints, AMissingDirectoryHasNoneAndTheFirstIsNumberOne) {
  EXPECT_TRUE(list_hpc_checkpoints(path("missing")).empty());
  EXPECT_EQ(next_hpc_checkpoint_path(dir_.string()), path("hpc_ckpt_1.ckpt"));
}

TEST_F(HpcCheckpoints, NewestIsTheHighestNumberNotTheLatestName) {
  for (const char* name : {"hpc_ckpt_2.ckpt", "hpc_ckpt_10.ckpt", "hpc_ckpt_9.ckpt"}) touch(name);
  EXPECT_EQ(list_hpc_checkpoints(dir_.string()),
            (std::vector<std::string>{path("hpc_ckpt_10.ckpt"), path("hpc_ckpt_9.ckpt"), path("hpc_ckpt_2.ckpt")}));
  EXPECT_EQ(next_hpc_checkpoint_path(dir_.string()), path("hpc_ckpt_11.ckpt"));
}

TEST_F(HpcCheckpoints, OtherFilesAndTemporaryFilesAreIgnored) {
  for (const char* name : {"hpc_ckpt_3.ckpt", "hpc_ckpt_4.ckpt.tmp.123", "hpc_ckpt_x.ckpt", "last.ckpt",
                           "hpc_ckpt_.ckpt", "my_hpc_ckpt_9.ckpt"})
    touch(name);
  EXPECT_EQ(list_hpc_checkpoints(dir_.string()), (std::vector<std::string>{path("hpc_ckpt_3.ckpt")}));
}

TEST_F(HpcCheckpoints, TheTemporaryFilesOfKilledWritesAreRemovedAndNothingElse) {
  const std::vector<std::string> killed{"hpc_ckpt_2.ckpt.tmp.9", "snapshot_3.ckpt.0123456789abcdef.shard1.tmp.77",
                                        "snapshot_3.ckpt.tmp.123"};
  const std::vector<std::string> kept{"snapshot_3.ckpt",
                                      "snapshot_3.ckpt.0123456789abcdef.shard1",
                                      "snapshot_3.ckpt.tmp",               // no pid: not write_file_atomically's
                                      "model.ckpt.tmp.5",                  // not a snapshot's: ModelCheckpoint's folder
                                      "snapshot_3.ckpt.abc.shard1.tmp.5",  // no save id
                                      "snapshot_3.ckpt.0123456789ABCDEF.shard1.tmp.6",  // not new_save_id's
                                      "volt-progress"};
  for (const auto& names : {killed, kept})
    for (const std::string& name : names) touch(name);
  std::vector<std::string> expected;
  for (const std::string& name : killed) expected.push_back(path(name));
  const auto [removed, bytes] = remove_interrupted_writes(dir_.string());
  EXPECT_EQ(removed, expected);
  EXPECT_EQ(bytes, 3);
  for (const std::string& name : kept) EXPECT_TRUE(fs::exists(dir_ / name)) << name;
  EXPECT_TRUE(remove_interrupted_writes(path("missing")).first.empty());
}

TEST_F(HpcCheckpoints, PruningKeepsTheNewestK) {
  for (const char* name : {"hpc_ckpt_1.ckpt", "hpc_ckpt_2.ckpt", "hpc_ckpt_3.ckpt"}) touch(name);
  EXPECT_EQ(hpc_checkpoints_to_prune(dir_.string(), 2), (std::vector<std::string>{path("hpc_ckpt_1.ckpt")}));
  EXPECT_EQ(hpc_checkpoints_to_prune(dir_.string(), 1),
            (std::vector<std::string>{path("hpc_ckpt_2.ckpt"), path("hpc_ckpt_1.ckpt")}));
  EXPECT_TRUE(hpc_checkpoints_to_prune(dir_.string(), 3).empty());
  EXPECT_EQ(hpc_checkpoints_to_prune(dir_.string(), 0).size(), 2u) << "the newest is always kept";
}

TEST_F(HpcCheckpoints, SnapshotsShareTheSequenceAndTheNewestOfEitherKindComesFirst) {
  for (const char* name : {"hpc_ckpt_1.ckpt", "snapshot_2.ckpt", "snapshot_3.ckpt", "hpc_ckpt_4.ckpt",
                           "snapshot_5.ckpt", "snapshot_6.ckpt.tmp.99", "snapshot_x.ckpt"})
    touch(name);
  EXPECT_EQ(list_snapshots(dir_.string()),
            (std::vector<std::string>{path("snapshot_5.ckpt"), path("snapshot_3.ckpt"), path("snapshot_2.ckpt")}));
  EXPECT_EQ(list_resume_checkpoints(dir_.string()),
            (std::vector<std::string>{path("snapshot_5.ckpt"), path("hpc_ckpt_4.ckpt"), path("snapshot_3.ckpt"),
                                      path("snapshot_2.ckpt"), path("hpc_ckpt_1.ckpt")}));
  EXPECT_EQ(next_resume_checkpoint_number(dir_.string()), 6);
  EXPECT_EQ(next_hpc_checkpoint_path(dir_.string()), path("hpc_ckpt_6.ckpt")) << "after the newest snapshot";
  EXPECT_EQ(snapshot_path(dir_.string(), 6), path("snapshot_6.ckpt"));
  EXPECT_TRUE(is_snapshot_path(path("snapshot_3.ckpt")));
  EXPECT_FALSE(is_snapshot_path(path("hpc_ckpt_4.ckpt")));
  EXPECT_EQ(snapshots_to_prune(dir_.string(), 2), (std::vector<std::string>{path("snapshot_2.ckpt")}));
  EXPECT_EQ(hpc_checkpoints_to_prune(dir_.string(), 1), (std::vector<std::string>{path("hpc_ckpt_1.ckpt")}))
      << "each kind keeps its own count";
}

TEST_F(HpcCheckpoints, TheProgressMarkerHoldsTheLastStepRecorded) {
  const std::string marker = progress_marker_path(path("sub"));
  EXPECT_FALSE(read_progress_marker(marker).has_value());
  {
    ProgressMarker progress(marker);
    progress.record(9);
    progress.record(12);
    EXPECT_EQ(read_progress_marker(marker), 12);
  }
  std::ofstream(marker) << "garbage";
  EXPECT_FALSE(read_progress_marker(marker).has_value());
}

TEST_F(HpcCheckpoints, AFinishedRunsFilesAreSetAsideForANewRunButNotForItsRestarts) {
  const std::string dir = dir_.string();
  EXPECT_EQ(mark_run_finished(dir), 0) << "no files: nothing to record";
  EXPECT_FALSE(fs::exists(progress_marker_path(dir)));
  touch("snapshot_4.ckpt");
  touch("hpc_ckpt_5.ckpt");
  std::optional<std::string> token;
  {
    ProgressMarker progress(progress_marker_path(dir));
    progress.record(40);
    token = read_progress_marker_token(progress_marker_path(dir));
    EXPECT_EQ(mark_run_finished(dir), 5);
    progress.record(41);  // the marker's lines stay apart
  }
  EXPECT_EQ(read_progress_marker(progress_marker_path(dir)), 41);
  EXPECT_EQ(read_progress_marker_token(progress_marker_path(dir)), token);
  ASSERT_TRUE(read_run_boundary(dir).has_value());
  EXPECT_EQ(read_run_boundary(dir)->number, 5);
  EXPECT_TRUE(read_run_boundary(dir)->finished);
  EXPECT_EQ(resume_numbers_set_aside(read_run_boundary(dir), /*restart_attempt=*/0), 5);
  EXPECT_EQ(resume_numbers_set_aside(read_run_boundary(dir), /*restart_attempt=*/1), 0)
      << "a restart of the run that finished";

  // A new run sets them aside for good: a new token, and its own files numbered past them even
  // once they are gone.
  set_aside_finished_run(dir, 5);
  EXPECT_NE(read_progress_marker_token(progress_marker_path(dir)), token);
  EXPECT_FALSE(read_run_boundary(dir)->finished);
  EXPECT_EQ(resume_numbers_set_aside(read_run_boundary(dir), /*restart_attempt=*/1), 5);
  fs::remove(path("snapshot_4.ckpt"));
  fs::remove(path("hpc_ckpt_5.ckpt"));
  EXPECT_EQ(snapshot_path(dir, next_resume_checkpoint_number(dir)), path("snapshot_6.ckpt"));
  EXPECT_EQ(mark_run_finished(dir), 5);
  EXPECT_TRUE(read_run_boundary(dir)->finished);

  std::ofstream(progress_marker_path(dir)) << "00000000000000000001\n0123456789abcdef\nfinished x\n";
  EXPECT_FALSE(read_run_boundary(dir).has_value());
}

}  // namespace
}  // namespace volt
