#include "volt/checkpoint/checkpointer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "volt/base/testing_collectives.h"
#include "volt/checkpoint/hpc_checkpoints.h"
#include "volt/checkpoint/sharded_checkpoint.h"
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

/// Resume candidates written as real checkpoint files: each holds {"n": its number, "where": ...}.
class ResumeCheckpointTest : public LastCheckpointTest {
 protected:
  std::string dir() const { return (root_ / "run").string(); }
  std::string memory(const std::string& node = "node0") const { return (root_ / "shm" / node).string(); }
  static void write(const std::string& path, int64_t n, const std::string& where) {
    fs::create_directories(fs::path(path).parent_path());
    c10::impl::GenericDict value(c10::StringType::get(), c10::AnyType::get());
    value.insert("n", n);
    value.insert("where", where);
    save_checkpoint_file(value, path);
  }
  static std::string where(const LoadedCheckpoint& loaded) {
    return loaded.value.toGenericDict().at("where").toStringRef();
  }
  /// What each of two ranks (threads; rank r with node r's memory tier) resumes from, and warned.
  struct Resumed {
    std::optional<LoadedCheckpoint> found[2];
    std::vector<std::string> warnings[2];
    std::vector<std::string> infos[2];
  };
  Resumed resume_on_two_nodes() {
    Resumed resumed;
    testing::ThreadGroup group(2);
    std::vector<std::thread> ranks;
    for (int64_t rank = 0; rank < 2; ++rank) {
      ranks.emplace_back([&, rank] {
        testing::ThreadCollectives collectives(group, rank);
        RecordingConsole console;
        resumed.found[rank] =
            checkpointer_.newest_resume_checkpoint(dir(), memory(rank == 0 ? "node0" : "node1"), collectives, console);
        resumed.warnings[rank] = console.warnings;
        resumed.infos[rank] = console.infos;
      });
    }
    for (std::thread& rank : ranks) rank.join();
    return resumed;
  }
  Checkpointer checkpointer_{std::make_shared<TorchCheckpointIO>()};
};

TEST_F(ResumeCheckpointTest, OfOneNumberTheHpcCheckpointThenTheMemoryTierThenTheFileIsRead) {
  RecordingConsole console;
  write(snapshot_path(dir(), 4), 4, "file");
  write(snapshot_path(memory(), 4), 4, "memory");
  auto found = checkpointer_.newest_resume_checkpoint(dir(), memory(), local_collectives(), console);
  ASSERT_TRUE(found);
  EXPECT_EQ(where(*found), "memory");
  EXPECT_EQ(found->path, snapshot_path(memory(), 4));
  EXPECT_EQ(found->source, "node-local shared memory");
  // A file cut short by a crash: the memory tier's newer snapshot still counts.
  write(snapshot_path(memory(), 5), 5, "memory");
  found = checkpointer_.newest_resume_checkpoint(dir(), memory(), local_collectives(), console);
  EXPECT_EQ(found->path, snapshot_path(memory(), 5));
  // An HPC checkpoint of the same number was saved after the snapshot.
  write((fs::path(dir()) / "hpc_ckpt_5.ckpt").string(), 5, "hpc");
  found = checkpointer_.newest_resume_checkpoint(dir(), memory(), local_collectives(), console);
  EXPECT_EQ(where(*found), "hpc");
  EXPECT_EQ(found->source, "");
  // Without a tier: the files only.
  found = checkpointer_.newest_resume_checkpoint(dir(), "", local_collectives(), console);
  EXPECT_EQ(where(*found), "hpc");
  EXPECT_TRUE(console.warnings.empty());
}

TEST_F(ResumeCheckpointTest, AnUnreadableMemorySnapshotFallsBackToTheFilesWithAWarning) {
  RecordingConsole console;
  write(snapshot_path(dir(), 3), 3, "file");
  fs::create_directories(memory());
  std::ofstream(snapshot_path(memory(), 4)) << "not a checkpoint";
  const auto found = checkpointer_.newest_resume_checkpoint(dir(), memory(), local_collectives(), console);
  ASSERT_TRUE(found);
  EXPECT_EQ(where(*found), "file");
  ASSERT_EQ(console.warnings.size(), 1u);
  EXPECT_NE(console.warnings[0].find("memory tier"), std::string::npos) << console.warnings[0];
}

TEST_F(ResumeCheckpointTest, EveryProcessResumesFromTheNewestAnyFoundAndTakesAPeersCopyWhenItsNodeLacksIt) {
  // Rank 0's node kept snapshot 5 in memory (its file was cut short); rank 1's node has no tier.
  write(snapshot_path(dir(), 4), 4, "file");
  write(snapshot_path(memory("node0"), 5), 5, "memory of node 0");
  const Resumed resumed = resume_on_two_nodes();
  const auto& found = resumed.found;
  ASSERT_TRUE(found[0] && found[1]);
  EXPECT_EQ(where(*found[0]), "memory of node 0");
  EXPECT_EQ(found[0]->source, "node-local shared memory");
  EXPECT_EQ(where(*found[1]), "memory of node 0");
  EXPECT_EQ(found[1]->source, "received from rank 0");
  EXPECT_EQ(found[1]->path, snapshot_path(memory("node1"), 5)) << "the tier's folder name, on this node";
}

TEST_F(ResumeCheckpointTest, ASnapshotSomeProcessLacksItsShardOfIsPassedOverUnlessAnotherNodeHoldsACopy) {
  // Sharded snapshot 5 was committed in rank 0's memory; none of the files hold rank 1's shard of
  // it. Snapshot 4 is complete among the files.
  write(snapshot_path(dir(), 4), 4, "file");
  const std::string five = snapshot_path(memory("node0"), 5);
  c10::impl::GenericDict index(c10::StringType::get(), c10::AnyType::get());
  index.insert("n", int64_t{5});
  index.insert("where", std::string("memory of node 0"));
  index.insert(kShardIndexKey, make_shard_index(five, "s5", 2));
  fs::create_directories(memory("node0"));
  save_checkpoint_file(index, five);
  write(shard_path(five, "s5", 0), 5, "shard 0");
  const std::string own = shard_path(snapshot_path(memory("node1"), 5), "s5", 1);
  const std::string copy = shard_path(five, "s5", 1);

  // Nowhere: passed over for snapshot 4.
  Resumed resumed = resume_on_two_nodes();
  ASSERT_TRUE(resumed.found[0] && resumed.found[1]);
  for (int64_t rank : {0, 1}) EXPECT_EQ(where(*resumed.found[rank]), "file") << rank;
  ASSERT_EQ(resumed.warnings[1].size(), 1u);
  EXPECT_NE(resumed.warnings[1][0].find("lacks rank 1's shard"), std::string::npos) << resumed.warnings[1][0];
  EXPECT_TRUE(resumed.warnings[0].empty());

  // Node 1 lost its memory, and node 0 holds the copy it kept for rank 1 (snapshot_peer_copy):
  // rank 1 receives it into its own node's tier, and both resume from snapshot 5.
  write(copy, 5, "shard 1");
  resumed = resume_on_two_nodes();
  ASSERT_TRUE(resumed.found[0] && resumed.found[1]);
  for (int64_t rank : {0, 1}) EXPECT_EQ(where(*resumed.found[rank]), "memory of node 0") << rank;
  EXPECT_TRUE(resumed.warnings[0].empty() && resumed.warnings[1].empty());
  ASSERT_TRUE(fs::exists(own)) << "rank 1's node holds its shard again";
  EXPECT_EQ(load_checkpoint_file(own).toGenericDict().at("where").toStringRef(), "shard 1");
  ASSERT_EQ(resumed.infos[1].size(), 1u);
  EXPECT_NE(resumed.infos[1][0].find("Rank 1's shard of snapshot_5.ckpt came from the copy in rank 0's node's memory"),
            std::string::npos)
      << resumed.infos[1][0];

  // Its own node's tier has it now: taken as it is, nothing sent.
  fs::remove(copy);
  resumed = resume_on_two_nodes();
  ASSERT_TRUE(resumed.found[1]);
  EXPECT_EQ(where(*resumed.found[1]), "memory of node 0");
  EXPECT_TRUE(resumed.infos[1].empty());
}

TEST_F(ResumeCheckpointTest, WhenNoProcessFoundOneNoneResumes) {
  testing::ThreadGroup group(2);
  std::optional<LoadedCheckpoint> found[2] = {LoadedCheckpoint{}, LoadedCheckpoint{}};
  std::vector<std::thread> ranks;
  for (int64_t rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      testing::ThreadCollectives collectives(group, rank);
      RecordingConsole console;
      found[rank] = checkpointer_.newest_resume_checkpoint(dir(), memory(), collectives, console);
    });
  }
  for (std::thread& rank : ranks) rank.join();
  EXPECT_FALSE(found[0]);
  EXPECT_FALSE(found[1]);
}

}  // namespace
}  // namespace volt
