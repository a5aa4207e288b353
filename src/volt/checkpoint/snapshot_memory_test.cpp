#include "volt/checkpoint/snapshot_memory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "volt/checkpoint/hpc_checkpoints.h"
#include "volt/core/error.h"

namespace volt {
namespace {

namespace fs = std::filesystem;

class SnapshotMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::temp_directory_path() / ("volt-memory-tier-" + std::to_string(getpid()));
    fs::remove_all(base_);
    fs::create_directories(root());
    fs::create_directories(hpc());
  }
  void TearDown() override { fs::remove_all(base_); }
  std::string root() const { return (base_ / "shm").string(); }
  std::string hpc() const { return (base_ / "run").string(); }
  fs::path base_;
};

TEST_F(SnapshotMemory, ARunWithoutAProgressMarkerHasNoTier) { EXPECT_EQ(memory_snapshot_dir(root(), hpc()), ""); }

TEST_F(SnapshotMemory, TheTierBelongsToTheRunThatCreatedTheMarker) {
  { ProgressMarker marker(progress_marker_path(hpc())); }
  const std::string dir = memory_snapshot_dir(root(), hpc());
  ASSERT_NE(dir, "");
  EXPECT_EQ(fs::path(dir).parent_path(), fs::path(root()));
  EXPECT_EQ(fs::path(dir).filename().string().rfind("volt-snapshots-", 0), 0U) << dir;
  // The same run opening its marker again (a restart) finds the same folder.
  {
    ProgressMarker again(progress_marker_path(hpc()));
    again.record(7);
  }
  EXPECT_EQ(memory_snapshot_dir(root(), hpc()), dir);
  EXPECT_EQ(read_progress_marker(progress_marker_path(hpc())), 7);
  // A new run in the emptied folder: a new token, so the old tier is not its.
  fs::remove(progress_marker_path(hpc()));
  { ProgressMarker fresh(progress_marker_path(hpc())); }
  EXPECT_NE(memory_snapshot_dir(root(), hpc()), dir);
  // Another folder: another tier.
  const std::string other = (base_ / "other").string();
  { ProgressMarker marker(progress_marker_path(other)); }
  EXPECT_NE(memory_snapshot_dir(root(), other), memory_snapshot_dir(root(), hpc()));
}

TEST_F(SnapshotMemory, KeepsTheNewestSnapshotOnly) {
  { ProgressMarker marker(progress_marker_path(hpc())); }
  const std::string dir = memory_snapshot_dir(root(), hpc());
  EXPECT_EQ(newest_memory_snapshot_number(dir), 0);
  write_memory_snapshot(dir, 3, {'a', 'b'});
  write_memory_snapshot(dir, 4, {'c'});
  EXPECT_EQ(list_snapshots(dir), std::vector<std::string>{snapshot_path(dir, 4)});
  EXPECT_EQ(newest_memory_snapshot_number(dir), 4);
  std::ifstream in(snapshot_path(dir, 4), std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "c");
  remove_memory_snapshots(dir);
  EXPECT_FALSE(fs::exists(dir));
}

TEST_F(SnapshotMemory, EarlierRunsTiersOfTheSameFolderAreRemovedOthersKept) {
  { ProgressMarker marker(progress_marker_path(hpc())); }
  const std::string old = memory_snapshot_dir(root(), hpc());
  write_memory_snapshot(old, 1, {'x'});
  const std::string other = (base_ / "other").string();
  { ProgressMarker marker(progress_marker_path(other)); }
  const std::string others = memory_snapshot_dir(root(), other);
  write_memory_snapshot(others, 1, {'y'});
  fs::remove(progress_marker_path(hpc()));
  { ProgressMarker fresh(progress_marker_path(hpc())); }
  const std::string current = memory_snapshot_dir(root(), hpc());
  write_memory_snapshot(current, 1, {'z'});
  remove_stale_memory_snapshots(root(), hpc(), current);
  EXPECT_FALSE(fs::exists(old));
  EXPECT_TRUE(fs::exists(current));
  EXPECT_TRUE(fs::exists(others));
}

TEST_F(SnapshotMemory, AWriteThatFailsNamesTheFileAndHowToMakeRoom) {
  // A file where the tier's folder should be: the write cannot create its temporary file.
  const std::string blocked = (base_ / "blocked").string();
  std::ofstream(blocked) << "x";
  try {
    write_memory_snapshot(blocked + "/tier", 1, {'a'});
    FAIL() << "a write into a folder that cannot exist succeeded";
  } catch (const CheckpointError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("snapshot_1.ckpt"), std::string::npos) << what;
    EXPECT_NE(what.find("HINT:"), std::string::npos) << what;
    EXPECT_NE(what.find("--no-snapshot-in-memory"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace volt
