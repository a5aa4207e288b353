// Snapshots through the Trainer: a run that crashes resumes from the newest snapshot (a file, or
// the memory tier's copy when the crash cut the file short) and ends bit-identical to one that
// never failed; a snapshot due while the previous one is still being written is skipped when
// asked; async_checkpointing writes what synchronous saves write.
#include <gtest/gtest.h>

#include <future>

#include "volt/checkpoint/hpc_checkpoints.h"
#include "volt/trainer/trainer_testing.h"

namespace volt {
namespace {

using namespace volt::trainer_testing;  // NOLINT: the shared fixture and helpers
namespace fs = std::filesystem;

class SnapshotTest : public TrainerTest {
 protected:
  std::string in_root(const std::string& name) const { return (root_ / name).string(); }
};

/// The snapshot files in the memory tier's folders under `memory_root`.
std::vector<std::string> memory_snapshots(const std::string& memory_root) {
  std::vector<std::string> found;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(memory_root, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (is_snapshot_path(it->path().string())) found.push_back(it->path().filename().string());
  }
  return found;
}

TEST_F(SnapshotTest, ARunThatCrashesResumesFromTheNewestSnapshotAndEndsBitIdentical) {
  const TinyOptions base{
      .train_size = 40, .dropout = 0.3, .optimizer = Optim::kAdam, .lr = 0.01, .scheduler = Interval::kStep};
  auto straight = make_module(base);
  make_trainer({.max_epochs = 2, .seed = 1, .enable_checkpointing = false}).fit(*straight);

  TrainerOptions options{.max_epochs = 2, .seed = 1, .enable_checkpointing = false};
  options.snapshot_every_n_steps = 3;
  options.snapshot_in_memory = false;
  // The crash comes in epoch 1 (10 batches each), one step after the snapshot of step 12.
  TinyOptions crashing = base;
  crashing.crash_at_step = 13;
  auto first = make_module(crashing);
  EXPECT_ANY_THROW(make_trainer(options).fit(*first));
  // Steps 3, 6, 9 and 12: numbers 1 to 4, of which snapshots_to_keep=2 are left.
  EXPECT_EQ(list_snapshots(root_.string()),
            (std::vector<std::string>{in_root("snapshot_4.ckpt"), in_root("snapshot_3.ckpt")}));
  EXPECT_TRUE(memory_snapshots(memory_root()).empty()) << "snapshot_in_memory=false";

  // Another model's fit in the folder finds the snapshot too, and the error says where it came from.
  TinyOptions other = base;
  other.outputs = 2;
  auto wider = make_module(other);
  const std::string message = testing::error_message([&] { make_trainer(options).fit(*wider); });
  EXPECT_NE(message.find("HINT: a run of another model left it in " + root_.string() + " without finishing"),
            std::string::npos)
      << message;

  // The same command again, with other initial weights, which the snapshot replaces.
  auto second = make_module(base, /*init_seed=*/100);
  const FitResult result = make_trainer(options).fit(*second);
  EXPECT_EQ(result.resumed_from, in_root("snapshot_4.ckpt"));
  EXPECT_EQ(result.global_step, 20);
  EXPECT_EQ(result.snapshots.saved, 2) << "steps 15 and 18; the fit ends at 20";
  EXPECT_EQ(result.snapshots.skipped, 0);
  // The first copy is counted apart (it allocates the buffers) and is part of the total.
  EXPECT_GT(result.snapshots.first_copy_seconds, 0.0);
  EXPECT_LT(result.snapshots.first_copy_seconds, result.snapshots.copy_seconds);
  EXPECT_TRUE(bit_identical(parameters_of(*second), parameters_of(*straight)));
}

TEST_F(SnapshotTest, AFinishedRunsSnapshotsServeItsRestartsButNotANewRunInTheFolder) {
  const TinyOptions base{.train_size = 40, .optimizer = Optim::kAdam, .lr = 0.01};
  TrainerOptions options{.max_epochs = 1, .seed = 1, .enable_checkpointing = false};
  options.snapshot_every_n_steps = 3;  // steps 3, 6 and 9 of 10: numbers 1 to 3, the newest 2 kept
  options.snapshot_in_memory = false;
  // A restarted attempt's Trainer (VOLT_RESTART_COUNT, as Volt's launcher and the SLURM script set it).
  const auto restart = [&](TrainerOptions o) {
    return Trainer(quiet(std::move(o)), Env(Env::Vars{{"VOLT_RESTART_COUNT", "1"}}), MachineInfo{1, "/tmp"});
  };
  auto first = make_module(base);
  EXPECT_EQ(make_trainer(options).fit(*first).global_step, 10);
  std::optional<RunBoundary> boundary = read_run_boundary(root_.string());
  ASSERT_TRUE(boundary.has_value());
  EXPECT_TRUE(boundary->finished);
  EXPECT_EQ(boundary->number, 3);

  // Its program failed after the fit (say, in test()) and was restarted: the fit resumes at its end.
  auto restarted = make_module(base, /*init_seed=*/100);
  const FitResult again = restart(options).fit(*restarted);
  EXPECT_EQ(again.resumed_from, in_root("snapshot_3.ckpt"));
  EXPECT_TRUE(bit_identical(parameters_of(*restarted), parameters_of(*first)));

  // A new run in the folder starts anew, says why, and numbers its snapshots past the old ones.
  // It crashes at step 2, before its first snapshot: its restart must not take the old run's files.
  TinyOptions crashing = base;
  crashing.crash_at_step = 2;
  auto crashed = make_module(crashing, /*init_seed=*/7);
  auto console = std::make_shared<RecordingConsole>();
  Trainer fresh = make_trainer(options);
  fresh.set_console(console);
  EXPECT_ANY_THROW(fresh.fit(*crashed));
  const std::string said = fmt::format(
      "Not resuming from {} (2 snapshot and HPC checkpoint files in {}): the run that wrote them finished its fit. "
      "This run starts from the beginning. HINT: to continue that run, pass its last checkpoint or one of those files "
      "as ckpt_path.",
      in_root("snapshot_3.ckpt"), root_.string());
  EXPECT_NE(std::find(console->infos.begin(), console->infos.end(), said), console->infos.end()) << said;
  boundary = read_run_boundary(root_.string());
  ASSERT_TRUE(boundary.has_value());
  EXPECT_FALSE(boundary->finished) << "set aside as an earlier run's";
  auto second = make_module(base, /*init_seed=*/7);
  const FitResult anew = restart(options).fit(*second);
  EXPECT_EQ(anew.resumed_from, "");
  EXPECT_EQ(anew.global_step, 10);
  EXPECT_EQ(list_snapshots(root_.string()),
            (std::vector<std::string>{in_root("snapshot_6.ckpt"), in_root("snapshot_5.ckpt")}));
  EXPECT_EQ(read_run_boundary(root_.string())->number, 6);
  EXPECT_TRUE(read_run_boundary(root_.string())->finished);
}

TEST_F(SnapshotTest, ARunThatSavesSnapshotsRemovesTheTemporaryFilesOfKilledWritesFirst) {
  // What a process killed while it wrote snapshot 2 (and its shard) left in the folder.
  const std::vector<std::string> left{in_root("snapshot_2.ckpt.0123456789abcdef.shard1.tmp.41"),
                                      in_root("snapshot_2.ckpt.tmp.40")};
  fs::create_directories(root_);
  for (const std::string& path : left) ASSERT_TRUE(std::ofstream(path) << "half") << path;
  auto module = make_module({.train_size = 8});
  auto console = std::make_shared<RecordingConsole>();
  Trainer without = make_trainer({.max_epochs = 1, .enable_checkpointing = false});
  without.set_console(console);
  without.fit(*module);
  for (const std::string& path : left) EXPECT_TRUE(fs::exists(path)) << "a run that writes no snapshot leaves " << path;

  TrainerOptions options{.max_epochs = 1, .enable_checkpointing = false};
  options.snapshot_every_n_steps = 1;
  Trainer with = make_trainer(options);
  with.set_console(console);
  with.fit(*module);
  for (const std::string& path : left) EXPECT_FALSE(fs::exists(path)) << path;
  const std::string said =
      fmt::format("Removed 2 temporary files (0.0 MB) that a write killed half-way left in {}: {}, {}", root_.string(),
                  left[0], left[1]);
  EXPECT_NE(std::find(console->infos.begin(), console->infos.end(), said), console->infos.end()) << said;
}

TEST_F(SnapshotTest, TheMemoryTierKeepsTheNewestSnapshotWhoseFileACrashCutShortUntilTheFitEnds) {
  const TinyOptions base{.train_size = 40, .dropout = 0.3, .optimizer = Optim::kAdam, .lr = 0.01};
  auto straight = make_module(base);
  make_trainer({.max_epochs = 2, .seed = 1, .enable_checkpointing = false}).fit(*straight);

  TrainerOptions options{.max_epochs = 2, .seed = 1, .enable_checkpointing = false};
  options.snapshot_every_n_steps = 3;
  TinyOptions crashing = base;
  crashing.crash_at_step = 13;
  auto first = make_module(crashing);
  EXPECT_ANY_THROW(make_trainer(options).fit(*first));
  // The tier holds the newest only; the crash left it in place.
  EXPECT_EQ(memory_snapshots(memory_root()), std::vector<std::string>{"snapshot_4.ckpt"});
  // As if the crash had cut step 12's file short: only the tier still has it.
  fs::remove(in_root("snapshot_4.ckpt"));

  auto second = make_module(base, /*init_seed=*/100);
  const FitResult result = make_trainer(options).fit(*second);
  EXPECT_EQ(fs::path(result.resumed_from).filename(), "snapshot_4.ckpt");
  EXPECT_EQ(fs::path(result.resumed_from).parent_path().parent_path(), fs::path(memory_root())) << result.resumed_from;
  EXPECT_EQ(result.global_step, 20);
  EXPECT_TRUE(bit_identical(parameters_of(*second), parameters_of(*straight)));
  // Numbered past the tier's snapshot: steps 15 and 18 are 5 and 6.
  EXPECT_EQ(list_snapshots(root_.string()),
            (std::vector<std::string>{in_root("snapshot_6.ckpt"), in_root("snapshot_5.ckpt")}));
  EXPECT_TRUE(memory_snapshots(memory_root()).empty()) << "a fit that ended gives its shared memory back";

  // Also a fit that resumed from the tier and saved no snapshot of its own gives it back.
  fs::remove_all(root_);
  options.max_epochs = 1;      // 10 steps: snapshots at 3, 6 and 9
  crashing.crash_at_step = 9;  // in the last batch, after step 9's snapshot
  auto crashed = make_module(crashing);
  EXPECT_ANY_THROW(make_trainer(options).fit(*crashed));
  EXPECT_EQ(memory_snapshots(memory_root()), std::vector<std::string>{"snapshot_3.ckpt"});
  auto third = make_module(base);
  const FitResult resumed = make_trainer(options).fit(*third);
  EXPECT_EQ(resumed.snapshots.saved, 0) << "step 10 ends the fit";
  EXPECT_TRUE(memory_snapshots(memory_root()).empty());
}

TEST_F(SnapshotTest, ATimeIntervalBecomesStepsAtThePaceBetweenSnapshots) {
  // Whatever this machine's pace: a nanosecond is always one step away, and 11 days never come.
  for (const double seconds : {1e-9, 1e6}) {
    TrainerOptions options{.max_steps = 10, .seed = 1, .enable_checkpointing = false};
    options.snapshot_every_n_seconds = seconds;
    auto module = make_module({.train_size = 40});
    const FitResult result = make_trainer(options).fit(*module);
    EXPECT_EQ(result.global_step, 10);
    // The first boundary (step 1) sets the first due step; the stopping step 10 saves none.
    EXPECT_EQ(result.snapshots.saved, seconds < 1 ? 8 : 0) << seconds << " s";
    fs::remove_all(root_);
  }
  // With steps too, whichever comes first.
  TrainerOptions both{.max_steps = 10, .seed = 1, .enable_checkpointing = false};
  both.snapshot_every_n_steps = 4;
  both.snapshot_every_n_seconds = 1e6;
  auto module = make_module({.train_size = 40});
  EXPECT_EQ(make_trainer(both).fit(*module).snapshots.saved, 2) << "steps 4 and 8";
}

/// Checkpoints in memory, where the first snapshot's write blocks until the test releases it.
class BlockingIO : public InMemoryCheckpointIO {
 public:
  void save(const c10::IValue& checkpoint, const std::string& path) override {
    if (path.find("snapshot_") != std::string::npos && !blocked_once_.exchange(true)) released_.wait();
    InMemoryCheckpointIO::save(checkpoint, path);
    if (path.find("snapshot_") != std::string::npos) saved_steps_.push_back(step_of(checkpoint));
  }
  // A snapshot serialized once for the memory tier and its file comes here.
  void save_bytes(const std::vector<char>& bytes, const std::string& path) override {
    save(load_from_bytes(bytes, path), path);
  }
  static int64_t step_of(const c10::IValue& checkpoint) { return checkpoint.toGenericDict().at("global_step").toInt(); }
  void release() { release_.set_value(); }
  std::vector<int64_t> saved_steps() const { return saved_steps_; }

 private:
  std::atomic<bool> blocked_once_{false};
  std::promise<void> release_;
  std::shared_future<void> released_ = release_.get_future().share();
  std::vector<int64_t> saved_steps_;  // written by the writer thread, read after the fit
};

/// Releases the blocked write at the end of step 7.
class Release : public Callback {
 public:
  explicit Release(std::shared_ptr<BlockingIO> io) : io_(std::move(io)) {}
  std::string state_key() const override { return "Release"; }
  Decision on_train_batch_end(const CallbackContext& context, CallbackServices&) override {
    if (context.global_step == 7) io_->release();
    return {};
  }

 private:
  std::shared_ptr<BlockingIO> io_;
};

TEST_F(SnapshotTest, ASnapshotDueWhileThePreviousIsStillBeingWrittenIsSkippedWhenAsked) {
  auto io = std::make_shared<BlockingIO>();
  TrainerOptions options{
      .max_steps = 10, .seed = 1, .callbacks = {std::make_shared<Release>(io)}, .enable_checkpointing = false};
  options.snapshot_every_n_steps = 3;
  options.skip_snapshot_when_busy = true;
  Trainer trainer = make_trainer(options);
  trainer.set_checkpoint_io(io);
  auto module = make_module({.train_size = 40});
  const FitResult result = trainer.fit(*module);
  // Step 3's write blocks until step 7, so step 6's is skipped; step 9's finds the writer free
  // or, on a slow machine, still finishing step 3's.
  const std::vector<int64_t> steps = io->saved_steps();
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps.front(), 3);
  EXPECT_EQ(std::count(steps.begin(), steps.end(), 6), 0);
  EXPECT_GE(result.snapshots.skipped, 1);
  EXPECT_EQ(result.snapshots.saved + result.snapshots.skipped, 3);
  EXPECT_EQ(static_cast<int64_t>(steps.size()), result.snapshots.saved) << "fit waits for the last write";
}

/// Every checkpoint file in `dir` with the tensors of its state_dict.
std::map<std::string, std::map<std::string, torch::Tensor>> checkpoints_in(const fs::path& dir) {
  std::map<std::string, std::map<std::string, torch::Tensor>> found;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const c10::IValue checkpoint = load_checkpoint_file(entry.path().string());
    auto& tensors = found[entry.path().filename().string()];
    for (const auto& item : checkpoint.toGenericDict().at("state_dict").toGenericDict())
      tensors[item.key().toStringRef()] = item.value().toTensor();
  }
  return found;
}

TEST_F(SnapshotTest, AsyncCheckpointingWritesWhatSynchronousSavesWriteAndRemovesTheSameFiles) {
  std::map<std::string, std::map<std::string, torch::Tensor>> written[2];
  for (const bool async : {false, true}) {
    const fs::path dir = root_ / (async ? "async" : "sync");
    // Every 3 steps, the 2 best by training loss and last.ckpt: saves, replacements and removals.
    auto checkpoint = std::make_shared<ModelCheckpoint>(ModelCheckpointOptions{.dirpath = dir.string(),
                                                                               .monitor = "train/loss",
                                                                               .save_top_k = 2,
                                                                               .save_last = true,
                                                                               .every_n_train_steps = 3});
    TrainerOptions options{.max_epochs = 2, .seed = 1, .callbacks = {checkpoint}};
    options.async_checkpointing = async;
    // Snapshots between the saves: background saves share the snapshots' host buffers.
    options.snapshot_every_n_steps = 2;
    options.snapshot_in_memory = false;
    options.hpc_checkpoint_dir = (root_ / (async ? "async_snapshots" : "sync_snapshots")).string();
    auto module = make_module({.train_size = 40, .dropout = 0.3, .optimizer = Optim::kAdam, .lr = 0.01});
    const FitResult result = make_trainer(options).fit(*module);
    EXPECT_EQ(result.global_step, 20);
    EXPECT_EQ(result.snapshots.saved, 10) << "steps 2, 4, ..., 20";
    written[async] = checkpoints_in(dir);  // complete when fit returns
  }
  ASSERT_EQ(written[0].size(), 3u) << "the 2 best and last.ckpt";
  ASSERT_EQ(written[1].size(), written[0].size());
  for (const auto& [name, tensors] : written[0]) {
    ASSERT_EQ(written[1].count(name), 1u) << name;
    EXPECT_TRUE(bit_identical(written[1].at(name), tensors)) << name;
  }
}

}  // namespace
}  // namespace volt
