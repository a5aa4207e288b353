#include "volt/loops/fit_checkpoints.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>

#include "volt/checkpoint/checkpoint_io.h"
#include "volt/checkpoint/hpc_checkpoints.h"
#include "volt/checkpoint/sharded_checkpoint.h"
#include "volt/checkpoint/snapshot_memory.h"
#include "volt/core/console.h"
#include "volt/core/error.h"
#include "volt/core/testing.h"
#include "volt/loggers/logger.h"
#include "volt/loops/metric_router.h"
#include "volt/loops/sharded_commit_plan.h"
#include "volt/module/lightning_module.h"
#include "volt/precision/precision_plugin.h"
#include "volt/strategies/state_sharding.h"
#include "volt/strategies/strategy.h"

namespace volt {
namespace {

struct Regression : LightningModule {
  torch::nn::Linear layer = register_module("layer", torch::nn::Linear(2, 1));
  torch::Tensor training_step(const Batch& batch, int64_t) override {
    return torch::mse_loss(layer(batch.data), batch.target);
  }
  OptimizerConfig configure_optimizers() override { return std::make_shared<torch::optim::SGD>(parameters(), 0.1); }
};

/// Two processes' channel ends as queues of (tag, bytes), one per direction.
struct FakeWire {
  std::mutex mutex;
  std::condition_variable arrived;
  std::deque<std::pair<int64_t, std::vector<char>>> to[2];
  bool closed = false;  // receives fail once the queue is empty, as from a process that is gone
  // Set: a send returns only once the other end took the message, as Gloo's may, or fails after
  // 10 s (two ends that both send first wait for each other: the test sees the copies missing).
  bool synchronous = false;
  int64_t taken[2] = {0, 0};  // messages taken from to[end] so far
  int64_t posted[2] = {0, 0};
};

/// End `end` (0 or 1) of a FakeWire.
class FakeChannel : public PeerChannel {
 public:
  FakeChannel(std::shared_ptr<FakeWire> wire, int end) : wire_(std::move(wire)), end_(end) {}
  void send(int64_t tag, const std::vector<char>& bytes) override {
    std::unique_lock<std::mutex> lock(wire_->mutex);
    if (wire_->closed) throw Error("could not send to the peer: gone");
    wire_->to[1 - end_].emplace_back(tag, bytes);
    const int64_t number = ++wire_->posted[1 - end_];
    wire_->arrived.notify_all();
    if (wire_->synchronous &&
        !wire_->arrived.wait_for(lock, std::chrono::seconds(10), [&] { return wire_->taken[1 - end_] >= number; }))
      throw Error("could not send to the peer: it never received");
  }
  std::pair<int64_t, std::vector<char>> receive() override {
    std::unique_lock<std::mutex> lock(wire_->mutex);
    wire_->arrived.wait(lock, [&] { return !wire_->to[end_].empty() || wire_->closed; });
    if (wire_->to[end_].empty()) throw Error("could not receive from the peer: gone");
    auto message = std::move(wire_->to[end_].front());
    wire_->to[end_].pop_front();
    ++wire_->taken[end_];
    wire_->arrived.notify_all();
    return message;
  }

 private:
  std::shared_ptr<FakeWire> wire_;
  int end_;
};

/// Checkpoints kept in memory whose shard files wait at a gate until it opens: a file system
/// slower than the steps, so a test sees a sharded snapshot between its commit in memory and the
/// one in the files.
class GatedIO : public InMemoryCheckpointIO {
 public:
  void save_bytes(const std::vector<char>& bytes, const std::string& path) override {
    if (path.find(".shard") != std::string::npos) {
      std::unique_lock<std::mutex> lock(mutex_);
      ++waiting_;
      changed_.notify_all();
      changed_.wait(lock, [&] { return open_; });
    }
    InMemoryCheckpointIO::save_bytes(bytes, path);
  }
  /// Blocks until `n` shard writes reached the gate.
  void wait_for(int n) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return waiting_ >= n; });
  }
  void open() {
    const std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int waiting_ = 0;
  bool open_ = false;
};

/// One rank of `world` processes, as its collectives see them: broadcast_string records what it
/// sends and returns `reply` (rank 0's message) when set, else what it sent (rank 0 itself);
/// barriers are counted; reductions keep this rank's values, gathers repeat them.
class FakeCollectives : public Collectives {
 public:
  using Collectives::all_reduce;
  FakeCollectives(int64_t rank, int64_t world) : rank_(rank), world_(world) {}
  int64_t world_size() const override { return world_; }
  int64_t rank() const override { return rank_; }
  void all_reduce(torch::Tensor&, Reduce) override {}
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor) override {
    return std::vector<torch::Tensor>(static_cast<size_t>(world_), tensor);
  }
  double all_reduce(double value, Reduce op) override {
    ++reductions;
    if (results.empty()) return value;
    const double result = results.front();
    results.pop_front();
    return result;
  }
  void barrier() override { ++barriers; }
  std::string broadcast_string(const std::string& value) override {
    sent.push_back(value);
    return reply.value_or(value);
  }
  std::unique_ptr<PeerChannel> connect_peer(int64_t peer) override {
    if (network) {
      const std::lock_guard<std::mutex> lock(network->mutex);
      std::shared_ptr<FakeWire>& pair = network->wires[{std::min(rank_, peer), std::max(rank_, peer)}];
      if (!pair) {
        pair = std::make_shared<FakeWire>();
        pair->synchronous = true;
      }
      return std::make_unique<FakeChannel>(pair, rank_ < peer ? 0 : 1);
    }
    if (!wire) return nullptr;
    return std::make_unique<FakeChannel>(wire, rank_ == 0 ? 0 : 1);
  }

  std::vector<std::string> sent;
  std::optional<std::string> reply;
  int barriers = 0;
  int reductions = 0;
  // What the next one-number reductions return (the other processes' say), instead of this rank's value.
  std::deque<double> results;
  // Set: connect_peer returns this rank's end of it (rank 0's, or the other's).
  std::shared_ptr<FakeWire> wire;
  // Set instead: a synchronous wire between every two ranks that connect, shared by all.
  struct Network {
    std::mutex mutex;
    std::map<std::pair<int64_t, int64_t>, std::shared_ptr<FakeWire>> wires;
  };
  std::shared_ptr<Network> network;

 private:
  int64_t rank_;
  int64_t world_;
};

/// One rank of `world` processes over FakeCollectives.
class FakeStrategy : public Strategy {
 public:
  FakeStrategy(int64_t rank, int64_t world) : group(rank, world) {
    topology_ = Topology{.world_size = world, .global_rank = rank};
  }
  std::string name() const override { return "fsdp"; }
  const Topology& topology() const override { return topology_; }
  StateSharding* state_sharding() override { return sharding; }
  Collectives& collectives() override { return group; }

  StateSharding* sharding = nullptr;
  FakeCollectives group;

 private:
  Topology topology_;
};

/// A rank's shard of one optimizer: its state is {"rank": rank}; with `pieces`, it keeps
/// "layer.weight" in pieces (full_shard).
class FakeSharding : public StateSharding {
 public:
  FakeSharding(int64_t rank, bool pieces) : rank_(rank), pieces_(pieces) {}
  std::vector<c10::IValue> gather_optimizer_states(
      const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) override {
    ++gathers;
    return {state("whole")};
  }
  std::vector<c10::IValue> local_optimizer_states(
      const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) override {
    return {state("piece")};
  }
  bool shards_parameters() const override { return pieces_; }
  ParameterPieces local_parameter_pieces() override {
    if (!pieces_) return {};
    return {{"layer.weight", ParameterPiece{.values = torch::full({1}, static_cast<float>(rank_)),
                                            .shape = {1, 2},
                                            .begin = rank_,
                                            .end = rank_ + 1}}};
  }
  void load_parameter_pieces(const ParameterPieces& pieces, const std::string& path) override {
    loaded_pieces = pieces;
  }
  void load_optimizer_state(torch::optim::Optimizer& optimizer, const c10::IValue& state) override {
    loaded_states.push_back(state);
  }

  /// {"kind": kind, "rank": this rank}.
  c10::IValue state(const std::string& kind) const {
    StateDict dict = make_state_dict();
    dict.insert("kind", kind);
    dict.insert("rank", rank_);
    return dict;
  }

  int gathers = 0;
  std::vector<c10::IValue> loaded_states;
  std::optional<ParameterPieces> loaded_pieces;

 private:
  int64_t rank_;
  bool pieces_;
};

/// The checkpoints loggers heard of (after_save_checkpoint), in order.
class SavesLogger : public Logger {
 public:
  std::string name() const override { return "saves"; }
  std::string log_dir() const override { return ""; }
  void log_hyperparams(const nlohmann::json&) override {}
  void log_metrics(const std::map<std::string, double>&, int64_t) override {}
  void after_save_checkpoint(const std::string& path) override { saved.push_back(path); }
  std::vector<std::string> saved;
};

std::string field(const c10::IValue& dict, const std::string& key) {
  return dict.toGenericDict().at(key).toStringRef();
}

/// The options of a process on `node` whose snapshots go to `hpc` and whose node's memory tier is
/// the folder `node` in `tmp` (made here): `type` checkpoints, `peer` the snapshot_peer_rank.
FitCheckpointsOptions node_options(const testing::TempDir& tmp, const std::string& hpc, const std::string& node,
                                   StateDictType type, int64_t peer = -1) {
  std::filesystem::create_directories(tmp.file(node));
  return FitCheckpointsOptions{.state_dict_type = type,
                               .hpc_checkpoint_dir = hpc,
                               .snapshot_memory_root = tmp.file(node),
                               .snapshot_peer_rank = peer};
}

/// One simulated process of a 2-process (or 1-process) fsdp run, sharing `io` with the others.
struct Rank {
  Rank(int64_t rank, int64_t world, std::shared_ptr<InMemoryCheckpointIO> io, bool pieces,
       StateDictType type = StateDictType::kSharded)
      : Rank(rank, world, std::move(io), pieces, {.state_dict_type = type, .hpc_checkpoint_dir = "hpc"}) {}
  Rank(int64_t rank, int64_t world, std::shared_ptr<InMemoryCheckpointIO> io, bool pieces,
       FitCheckpointsOptions options)
      : strategy(rank, world),
        sharding(rank, pieces),
        checkpointer(std::move(io)),
        router(callback_metrics, {logger}),
        optimization(module.configure_optimizers()),
        checkpoints(std::move(options), strategy, &sharding, checkpointer, router, console,
                    TrainingParts{&module, &optimization, &callbacks, precision.get()}, progress) {
    strategy.sharding = &sharding;
    progress.global_step = 7;
  }

  FakeStrategy strategy;
  FakeSharding sharding;
  Checkpointer checkpointer;
  std::map<std::string, double> callback_metrics;
  std::shared_ptr<SavesLogger> logger = std::make_shared<SavesLogger>();
  MetricRouter router;
  RecordingConsole console;
  Regression module;
  OptimizerConfig optimization;
  std::vector<std::shared_ptr<Callback>> callbacks;
  std::unique_ptr<PrecisionPlugin> precision = make_precision_plugin(Precision::k32True, c10::DeviceType::CPU);
  FitProgress progress;
  FitCheckpoints checkpoints;
};

/// Rank 1 of 2 (full_shard) restores sharded checkpoint `path` from `io`: the step Rank saves at,
/// its own piece of the parameters and its own optimizer state, from its shard.
void expect_rank_one_resumes_its_shard(const std::shared_ptr<InMemoryCheckpointIO>& io, const std::string& path) {
  Rank resumed(1, 2, io, /*pieces=*/true);
  EXPECT_EQ(resumed.checkpoints.restore({path, io->load(path)}).global_step, 7);
  ASSERT_TRUE(resumed.sharding.loaded_pieces.has_value());
  EXPECT_EQ(resumed.sharding.loaded_pieces->at("layer.weight").begin, 1) << "rank 1's piece, from its shard";
  ASSERT_EQ(resumed.sharding.loaded_states.size(), 1u);
  EXPECT_EQ(field(resumed.sharding.loaded_states[0], "kind"), "piece");
}

TEST(FitCheckpointsTest, ShardedSaveIsWrittenAtTheCommitByEveryRank) {
  auto io = std::make_shared<InMemoryCheckpointIO>();
  Rank zero(0, 2, io, /*pieces=*/false);
  zero.checkpoints.begin_gather_point();
  ASSERT_TRUE(zero.checkpoints.needs_gather());
  zero.checkpoints.gather();
  zero.checkpoints.save("ckpts/a.ckpt");
  EXPECT_TRUE(io->paths().empty()) << "nothing is written before the commit";
  EXPECT_EQ(zero.checkpoints.last_saved(), "ckpts/a.ckpt");
  EXPECT_TRUE(zero.logger->saved.empty());

  zero.checkpoints.after_dispatch();
  EXPECT_EQ(zero.logger->saved, std::vector<std::string>{"ckpts/a.ckpt"}) << "complete, with its shards";
  ASSERT_EQ(zero.strategy.group.sent.size(), 1u);
  const ShardedCommitPlan plan = decode_sharded_commit_plan(zero.strategy.group.sent[0]);
  ASSERT_EQ(plan.entries.size(), 1u);
  EXPECT_EQ(plan.entries[0], (ShardedCommitPlan::Entry{.path = "ckpts/a.ckpt", .weights_only = false}));
  EXPECT_EQ(zero.strategy.group.barriers, 1) << "every shard is written before rank 0 commits";

  // Rank 1 receives rank 0's plan and writes its own shard of the same save.
  Rank one(1, 2, io, /*pieces=*/false);
  one.strategy.group.reply = zero.strategy.group.sent[0];
  one.checkpoints.gather();
  one.checkpoints.save("ckpts/a.ckpt");  // only rank 0 builds the file
  one.checkpoints.after_dispatch();
  EXPECT_EQ(decode_sharded_commit_plan(one.strategy.group.sent[0]).entries.size(), 0u) << "rank 1 announces nothing";

  std::vector<std::string> files{"ckpts/a.ckpt", shard_path("ckpts/a.ckpt", plan.save_id, 0),
                                 shard_path("ckpts/a.ckpt", plan.save_id, 1)};
  std::sort(files.begin(), files.end());
  EXPECT_EQ(io->paths(), files);
  const c10::IValue top = io->load("ckpts/a.ckpt");
  EXPECT_FALSE(top.toGenericDict().contains("optimizer_states")) << "they are in the shards";
  const std::optional<ShardIndex> index = read_shard_index(top, "ckpts/a.ckpt");
  ASSERT_TRUE(index.has_value());
  EXPECT_EQ(index->save_id, plan.save_id);
  EXPECT_EQ(index->world_size, 2);
  EXPECT_TRUE(index->optimizer_states);
  for (int64_t rank : {0, 1}) {
    const Shard shard = load_shard(*io, "ckpts/a.ckpt", *index, rank);
    ASSERT_EQ(shard.optimizer_states.size(), 1u);
    EXPECT_EQ(field(shard.optimizer_states[0], "kind"), "piece");
    EXPECT_EQ(shard.optimizer_states[0].toGenericDict().at("rank").toInt(), rank);
  }
  EXPECT_EQ(zero.sharding.gathers, 0) << "a sharded save gathers nothing";
  const std::string hpc = zero.checkpoints.save_hpc();
  EXPECT_TRUE(io->exists(hpc)) << hpc;
  EXPECT_EQ(zero.logger->saved, std::vector<std::string>{"ckpts/a.ckpt"}) << "an HPC save is not announced";

  // Rank 1 resumes from its shard.
  Rank resumed(1, 2, io, /*pieces=*/false);
  const FitProgress progress = resumed.checkpoints.restore({"ckpts/a.ckpt", io->load("ckpts/a.ckpt")});
  EXPECT_EQ(progress.global_step, 7);
  ASSERT_EQ(resumed.sharding.loaded_states.size(), 1u);
  EXPECT_EQ(resumed.sharding.loaded_states[0].toGenericDict().at("rank").toInt(), 1);
}

TEST(FitCheckpointsTest, AShardedSnapshotIsWrittenInTheBackgroundAndCommittedOnceEveryShardIsOnDisk) {
  auto io = std::make_shared<InMemoryCheckpointIO>();
  Rank zero(0, 2, io, /*pieces=*/true);
  Rank one(1, 2, io, /*pieces=*/true);
  ASSERT_TRUE(zero.checkpoints.save_snapshot(/*skip_when_busy=*/false));
  one.strategy.group.reply = zero.strategy.group.sent.at(0);
  ASSERT_TRUE(one.checkpoints.save_snapshot(/*skip_when_busy=*/false));
  const ShardedCommitPlan plan = decode_sharded_commit_plan(zero.strategy.group.sent.at(0));
  ASSERT_EQ(plan.entries.size(), 1u);
  const std::string path = plan.entries[0].path;
  EXPECT_TRUE(is_snapshot_path(path)) << path;
  zero.checkpoints.wait_for_writes();
  one.checkpoints.wait_for_writes();
  std::vector<std::string> shards{shard_path(path, plan.save_id, 0), shard_path(path, plan.save_id, 1)};
  std::sort(shards.begin(), shards.end());
  EXPECT_EQ(io->paths(), shards) << "each process's shard, and no snapshot file before the commit";
  EXPECT_EQ(zero.strategy.group.barriers + one.strategy.group.barriers, 0) << "no process waits for another";

  // The first boundary asks; another process's writer still at it answers no, and nothing is committed.
  zero.strategy.group.results = {0.0};
  zero.checkpoints.advance_sharded_write();
  zero.checkpoints.advance_sharded_write();  // reads the no, asks again
  zero.checkpoints.wait_for_writes();
  EXPECT_FALSE(io->exists(path));
  zero.checkpoints.advance_sharded_write();  // every shard is on disk: rank 0 commits
  zero.checkpoints.wait_for_writes();
  ASSERT_TRUE(io->exists(path));
  EXPECT_EQ(zero.strategy.group.reductions, 2);
  zero.checkpoints.advance_sharded_write();
  EXPECT_EQ(zero.strategy.group.reductions, 2) << "nothing left to commit: no collective";

  const std::optional<ShardIndex> index = read_shard_index(io->load(path), path);
  ASSERT_TRUE(index.has_value());
  EXPECT_EQ(index->save_id, plan.save_id);
  EXPECT_EQ(index->world_size, 2);
  expect_rank_one_resumes_its_shard(io, path);
}

TEST(FitCheckpointsTest, AShardedSnapshotStillBeingWrittenIsCommittedBeforeTheNextAndAtTheEnd) {
  auto io = std::make_shared<InMemoryCheckpointIO>();
  Rank zero(0, 1, io, /*pieces=*/false);
  ASSERT_TRUE(zero.checkpoints.save_snapshot(/*skip_when_busy=*/false));
  zero.checkpoints.advance_sharded_write();  // a vote in flight, read by the next save
  ASSERT_TRUE(zero.checkpoints.save_snapshot(/*skip_when_busy=*/false));
  const std::string first = decode_sharded_commit_plan(zero.strategy.group.sent.at(0)).entries.at(0).path;
  const std::string second = decode_sharded_commit_plan(zero.strategy.group.sent.at(1)).entries.at(0).path;
  EXPECT_NE(first, second);
  EXPECT_EQ(zero.strategy.group.barriers, 2) << "the first was committed once every shard was in memory, then on disk";
  EXPECT_EQ(zero.strategy.group.reductions, 1);
  zero.checkpoints.wait_for_writes();
  EXPECT_TRUE(io->exists(first));
  EXPECT_FALSE(io->exists(second));
  zero.checkpoints.complete_sharded_write();  // the end of the fit
  zero.checkpoints.wait_for_writes();
  EXPECT_TRUE(io->exists(second));
  EXPECT_EQ(zero.strategy.group.barriers, 4);
  EXPECT_EQ(zero.checkpoints.snapshot_stats().saved, 2);
  zero.checkpoints.complete_sharded_write();
  EXPECT_EQ(zero.strategy.group.barriers, 4) << "nothing left to commit";
}

TEST(FitCheckpointsTest, RankZerosNewestSnapshotIsCopiedIntoThePeersNodeMemory) {
  testing::TempDir tmp;
  const std::string hpc = tmp.file("hpc");
  ProgressMarker marker(progress_marker_path(hpc));  // rank 0's, on a file system both nodes see
  std::filesystem::create_directories(tmp.file("node0"));
  std::filesystem::create_directories(tmp.file("node1"));
  const auto options = [&](const std::string& node) {
    return node_options(tmp, hpc, node, StateDictType::kFull, /*peer=*/2);
  };
  auto io = std::make_shared<InMemoryCheckpointIO>();
  auto wire = std::make_shared<FakeWire>();
  Rank zero(0, 4, io, /*pieces=*/false, options("node0"));
  Rank bystander(1, 4, io, /*pieces=*/false, options("node0"));
  Rank peer(2, 4, io, /*pieces=*/false, options("node1"));
  zero.strategy.group.wire = peer.strategy.group.wire = bystander.strategy.group.wire = wire;
  for (int snapshot = 0; snapshot < 2; ++snapshot) {
    for (Rank* rank : {&zero, &bystander, &peer}) ASSERT_TRUE(rank->checkpoints.save_snapshot(false));
    for (Rank* rank : {&zero, &bystander, &peer}) rank->checkpoints.wait_for_writes();
  }
  const std::string kept = memory_snapshot_dir(tmp.file("node1"), hpc);
  ASSERT_FALSE(kept.empty());
  const std::vector<std::string> copies = list_snapshots(kept);
  ASSERT_EQ(copies.size(), 1u) << "the newest only";
  const std::string path = io->paths().back();
  EXPECT_EQ(std::filesystem::path(copies[0]).filename(), std::filesystem::path(path).filename());
  EXPECT_EQ(load_checkpoint_file(copies[0]).toGenericDict().at("global_step").toInt(), 7);
  EXPECT_EQ(list_snapshots(memory_snapshot_dir(tmp.file("node0"), hpc)).size(), 1u) << "rank 0's own tier";
  EXPECT_TRUE(peer.console.warnings.empty());

  // Rank 0's process is gone: the peer's receive fails, it warns at the next snapshot and goes on without copies.
  {
    const std::lock_guard<std::mutex> lock(wire->mutex);
    wire->closed = true;
  }
  wire->arrived.notify_all();
  ASSERT_TRUE(peer.checkpoints.save_snapshot(false));
  peer.checkpoints.wait_for_writes();
  ASSERT_TRUE(peer.checkpoints.save_snapshot(false));
  ASSERT_EQ(peer.console.warnings.size(), 1u);
  EXPECT_NE(peer.console.warnings[0].find("no longer copied to another node"), std::string::npos);
  peer.checkpoints.release_memory_tier();
  EXPECT_FALSE(std::filesystem::exists(kept)) << "the peer gives its node's memory back";
}

TEST(FitCheckpointsTest, AShardedSnapshotIsCommittedInMemoryOnceEveryShardIsThereThenInTheFiles) {
  testing::TempDir tmp;
  const std::string hpc = tmp.file("hpc");
  ProgressMarker marker(progress_marker_path(hpc));
  const auto options = [&](const std::string& node) { return node_options(tmp, hpc, node, StateDictType::kSharded); };
  auto io = std::make_shared<GatedIO>();
  Rank zero(0, 2, io, /*pieces=*/true, options("node0"));
  Rank one(1, 2, io, /*pieces=*/true, options("node1"));
  struct OpenAtExit {  // destroyed before the ranks, whose writers would wait at the gate for ever
    GatedIO& io;
    ~OpenAtExit() { io.open(); }
  } open_at_exit{*io};
  ASSERT_TRUE(zero.checkpoints.save_snapshot(/*skip_when_busy=*/false));
  one.strategy.group.reply = zero.strategy.group.sent.at(0);
  ASSERT_TRUE(one.checkpoints.save_snapshot(/*skip_when_busy=*/false));
  zero.checkpoints.wait_for_shard_in_memory();
  one.checkpoints.wait_for_shard_in_memory();
  const ShardedCommitPlan plan = decode_sharded_commit_plan(zero.strategy.group.sent.at(0));
  const std::string path = plan.entries.at(0).path;
  const int64_t number = resume_checkpoint_number(path).value();
  const std::filesystem::path memory0 = memory_snapshot_dir(tmp.file("node0"), hpc);
  const std::filesystem::path memory1 = memory_snapshot_dir(tmp.file("node1"), hpc);
  const std::string index_name = std::filesystem::path(path).filename().string();
  EXPECT_TRUE(std::filesystem::exists(memory0 / pending_memory_index_name(number)));
  EXPECT_FALSE(std::filesystem::exists(memory0 / index_name)) << "not before every process's shard is in memory";
  EXPECT_TRUE(io->paths().empty()) << "no file is written before the commit in memory";

  for (Rank* rank : {&zero, &one}) {
    rank->checkpoints.advance_sharded_write();  // asks: every process answers 1, in memory
    rank->checkpoints.advance_sharded_write();  // commits in memory, asks again
  }
  io->wait_for(2);  // the commit let both writers on to the files, where the gate holds them
  ASSERT_TRUE(std::filesystem::exists(memory0 / index_name)) << "committed in memory";
  EXPECT_FALSE(std::filesystem::exists(memory0 / pending_memory_index_name(number)));
  EXPECT_TRUE(std::filesystem::exists(memory1 / std::filesystem::path(shard_path(path, plan.save_id, 1)).filename()));
  EXPECT_FALSE(io->exists(path)) << "the files wait for every shard on disk";

  // A restart now resumes from memory: rank 1 gets rank 0's index and reads its shard in its own node's tier.
  Rank resumed(1, 2, std::make_shared<InMemoryCheckpointIO>(), /*pieces=*/true, options("node1"));
  const std::string in_memory = (memory0 / index_name).string();
  const FitProgress progress = resumed.checkpoints.restore({in_memory, load_checkpoint_file(in_memory)});
  EXPECT_EQ(progress.global_step, 7);
  ASSERT_TRUE(resumed.sharding.loaded_pieces.has_value());
  EXPECT_EQ(resumed.sharding.loaded_pieces->at("layer.weight").begin, 1);

  io->open();
  for (Rank* rank : {&zero, &one}) {
    rank->checkpoints.wait_for_writes();
    rank->checkpoints.advance_sharded_write();  // reads the vote started before the shards were on disk
    rank->checkpoints.advance_sharded_write();  // every shard on disk: rank 0 commits the file
    rank->checkpoints.wait_for_writes();
  }
  EXPECT_TRUE(io->exists(path));
  zero.checkpoints.release_memory_tier();
  one.checkpoints.release_memory_tier();
  EXPECT_FALSE(std::filesystem::exists(memory0));
  EXPECT_FALSE(std::filesystem::exists(memory1)) << "every process gives its node's memory back";
}

TEST(FitCheckpointsTest, WithPeerCopiesEveryShardIsAlsoKeptInTheNextNodesMemory) {
  testing::TempDir tmp;
  const std::string hpc = tmp.file("hpc");
  ProgressMarker marker(progress_marker_path(hpc));
  const auto options = [&](const std::string& node) {  // two nodes of one process each
    return node_options(tmp, hpc, node, StateDictType::kSharded, /*peer=*/1);
  };
  auto io = std::make_shared<InMemoryCheckpointIO>();
  auto wire = std::make_shared<FakeWire>();
  Rank zero(0, 2, io, /*pieces=*/true, options("node0"));
  Rank one(1, 2, io, /*pieces=*/true, options("node1"));
  zero.strategy.group.wire = one.strategy.group.wire = wire;
  const std::filesystem::path memory0 = memory_snapshot_dir(tmp.file("node0"), hpc);
  const std::filesystem::path memory1 = memory_snapshot_dir(tmp.file("node1"), hpc);
  const auto name = [](const std::string& path) { return std::filesystem::path(path).filename().string(); };
  std::vector<ShardedCommitPlan> plans;
  for (int snapshot = 0; snapshot < 2; ++snapshot) {
    ASSERT_TRUE(zero.checkpoints.save_snapshot(/*skip_when_busy=*/false));
    plans.push_back(decode_sharded_commit_plan(zero.strategy.group.sent.back()));
    one.strategy.group.reply = zero.strategy.group.sent.back();
    ASSERT_TRUE(one.checkpoints.save_snapshot(/*skip_when_busy=*/false));
    zero.checkpoints.wait_for_shard_in_memory();
    one.checkpoints.wait_for_shard_in_memory();
    const std::string path = plans.back().entries.at(0).path;
    const int64_t number = resume_checkpoint_number(path).value();
    // In memory (vote 1) only with the previous node's copy in place: rank 1 holds rank 0's shard
    // and index, rank 0 rank 1's shard.
    EXPECT_TRUE(std::filesystem::exists(memory1 / name(shard_path(path, plans.back().save_id, 0))));
    EXPECT_TRUE(std::filesystem::exists(memory1 / pending_memory_index_name(number)));
    EXPECT_TRUE(std::filesystem::exists(memory0 / name(shard_path(path, plans.back().save_id, 1))));
    for (Rank* rank : {&zero, &one}) {
      rank->checkpoints.advance_sharded_write();  // asks
      rank->checkpoints.advance_sharded_write();  // every process answers 1 or 2: committed in memory
    }
    EXPECT_TRUE(std::filesystem::exists(memory1 / name(path))) << "node 1 renames its copy of the index too";
    EXPECT_FALSE(std::filesystem::exists(memory1 / pending_memory_index_name(number)));
    for (Rank* rank : {&zero, &one}) rank->checkpoints.wait_for_writes();
  }
  // The older snapshot's copies are gone from both nodes: each tier holds the newest set only.
  for (const std::filesystem::path& memory : {memory0, memory1}) {
    std::vector<std::string> files;
    for (const auto& entry : std::filesystem::directory_iterator(memory)) files.push_back(entry.path().filename());
    std::sort(files.begin(), files.end());
    const std::string path = plans.back().entries.at(0).path;
    std::vector<std::string> expected{name(path), name(shard_path(path, plans.back().save_id, 0)),
                                      name(shard_path(path, plans.back().save_id, 1))};
    EXPECT_EQ(files, expected) << memory;
  }
  EXPECT_TRUE(zero.console.warnings.empty() && one.console.warnings.empty());
  zero.checkpoints.release_memory_tier();
  one.checkpoints.release_memory_tier();
  EXPECT_FALSE(std::filesystem::exists(memory1)) << "the copies go back with the fit's end";
}

TEST(FitCheckpointsTest, OnThreeNodesTheShardCopiesGoRoundTheRingWithoutWaitingInACircle) {
  testing::TempDir tmp;
  const std::string hpc = tmp.file("hpc");
  ProgressMarker marker(progress_marker_path(hpc));
  const auto options = [&](int64_t node) {
    return node_options(tmp, hpc, fmt::format("node{}", node), StateDictType::kSharded, /*peer=*/1);
  };
  auto io = std::make_shared<InMemoryCheckpointIO>();
  auto network = std::make_shared<FakeCollectives::Network>();
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int64_t rank = 0; rank < 3; ++rank) {
    ranks.push_back(std::make_unique<Rank>(rank, 3, io, /*pieces=*/true, options(rank)));
    ranks.back()->strategy.group.network = network;
  }
  ASSERT_TRUE(ranks[0]->checkpoints.save_snapshot(/*skip_when_busy=*/false));
  const ShardedCommitPlan plan = decode_sharded_commit_plan(ranks[0]->strategy.group.sent.back());
  for (int64_t rank = 1; rank < 3; ++rank) {
    ranks[rank]->strategy.group.reply = ranks[0]->strategy.group.sent.back();
    ASSERT_TRUE(ranks[rank]->checkpoints.save_snapshot(/*skip_when_busy=*/false));
  }
  for (auto& rank : ranks) rank->checkpoints.wait_for_shard_in_memory();
  const std::string path = plan.entries.at(0).path;
  for (int64_t node = 0; node < 3; ++node) {
    const std::filesystem::path memory = memory_snapshot_dir(tmp.file(fmt::format("node{}", node)), hpc);
    const int64_t source = (node + 2) % 3;  // the previous node's process
    EXPECT_TRUE(
        std::filesystem::exists(memory / std::filesystem::path(shard_path(path, plan.save_id, source)).filename()))
        << "node " << node << " keeps rank " << source << "'s shard";
    EXPECT_EQ(std::filesystem::exists(memory / pending_memory_index_name(resume_checkpoint_number(path).value())),
              node <= 1)
        << "rank 0's index on node 0 and on node 1 only; node " << node;
  }
  for (int round = 0; round < 2; ++round) {
    for (auto& rank : ranks) rank->checkpoints.advance_sharded_write();  // the commit in memory opens the gates
  }
  for (auto& rank : ranks) {
    rank->checkpoints.wait_for_writes();
    EXPECT_TRUE(rank->console.warnings.empty()) << rank->console.warnings.front();
  }
}

TEST(FitCheckpointsTest, ARemovalWaitsForTheCommitOfTheSavesThatReplaceIt) {
  auto io = std::make_shared<InMemoryCheckpointIO>();
  io->save(c10::IValue(int64_t{1}), "old.ckpt");
  io->save(c10::IValue(int64_t{2}), "older.ckpt");
  Rank zero(0, 1, io, /*pieces=*/false);
  zero.checkpoints.begin_gather_point();
  zero.checkpoints.gather();
  zero.checkpoints.save("new.ckpt");
  zero.checkpoints.remove("old.ckpt");
  EXPECT_TRUE(io->exists("old.ckpt")) << "removed only once new.ckpt is complete";
  zero.checkpoints.save("dropped.ckpt");
  zero.checkpoints.remove("dropped.ckpt");  // saved and removed in the same hook
  zero.checkpoints.after_dispatch();

  const ShardedCommitPlan plan = decode_sharded_commit_plan(zero.strategy.group.sent.at(0));
  ASSERT_EQ(plan.entries.size(), 1u) << "dropped.ckpt is never written";
  EXPECT_EQ(plan.entries[0].path, "new.ckpt");
  EXPECT_FALSE(io->exists("old.ckpt"));
  EXPECT_FALSE(io->exists("dropped.ckpt"));
  EXPECT_TRUE(io->exists("new.ckpt"));

  // Outside a gather point nothing is pending: a removal happens at once.
  zero.checkpoints.remove("older.ckpt");
  EXPECT_FALSE(io->exists("older.ckpt"));
}

/// A sharded fsdp process whose callbacks' saves are written in the background.
FitCheckpointsOptions async_sharded() {
  return {.state_dict_type = StateDictType::kSharded, .hpc_checkpoint_dir = "hpc", .async_checkpointing = true};
}

TEST(FitCheckpointsTest, UnderAsyncCheckpointingShardedSavesAreWrittenInTheBackgroundAndCommittedAtABoundary) {
  auto io = std::make_shared<InMemoryCheckpointIO>();
  io->save(c10::IValue(int64_t{1}), "old.ckpt");
  Rank zero(0, 2, io, /*pieces=*/true, async_sharded());
  Rank one(1, 2, io, /*pieces=*/true, async_sharded());
  const torch::Tensor saved_bias = zero.module.layer->bias.detach().clone();
  zero.checkpoints.begin_gather_point();
  zero.checkpoints.gather();
  zero.checkpoints.save("a.ckpt");
  zero.checkpoints.save_weights("w.ckpt");
  zero.checkpoints.remove("old.ckpt");  // replaced by a.ckpt (ModelCheckpoint's old top-k)
  zero.checkpoints.after_dispatch();
  one.strategy.group.reply = zero.strategy.group.sent.at(0);
  one.checkpoints.begin_gather_point();
  one.checkpoints.gather();
  one.checkpoints.after_dispatch();
  const ShardedCommitPlan plan = decode_sharded_commit_plan(zero.strategy.group.sent.at(0));
  ASSERT_EQ(plan.entries.size(), 2u);
  // Training goes on: what the files hold was copied at the save.
  {
    const torch::NoGradGuard no_grad;
    zero.module.layer->bias.add_(1.0);
  }

  zero.checkpoints.wait_for_writes();
  one.checkpoints.wait_for_writes();
  std::vector<std::string> files{"old.ckpt"};
  for (const char* path : {"a.ckpt", "w.ckpt"})
    for (int64_t rank : {0, 1}) files.push_back(shard_path(path, plan.save_id, rank));
  std::sort(files.begin(), files.end());
  EXPECT_EQ(io->paths(), files) << "every process's shards, and no file before the commit";
  EXPECT_EQ(zero.strategy.group.barriers + one.strategy.group.barriers, 0) << "no process waits for another";

  zero.strategy.group.results = {0.0};  // rank 1's writer is still at it
  zero.checkpoints.advance_sharded_write();
  zero.checkpoints.advance_sharded_write();
  zero.checkpoints.wait_for_writes();
  EXPECT_FALSE(io->exists("a.ckpt"));
  EXPECT_TRUE(io->exists("old.ckpt")) << "removed only once a.ckpt is complete";
  EXPECT_TRUE(zero.logger->saved.empty()) << "loggers hear of a checkpoint once it is complete";
  zero.checkpoints.advance_sharded_write();  // every shard is on disk: rank 0 commits
  zero.checkpoints.wait_for_writes();
  EXPECT_EQ(zero.logger->saved, (std::vector<std::string>{"a.ckpt", "w.ckpt"}));
  ASSERT_TRUE(io->exists("a.ckpt"));
  ASSERT_TRUE(io->exists("w.ckpt"));
  EXPECT_FALSE(io->exists("old.ckpt"));

  const c10::IValue top = io->load("a.ckpt");
  EXPECT_TRUE(
      torch::equal(top.toGenericDict().at("state_dict").toGenericDict().at("layer.bias").toTensor(), saved_bias));
  const std::optional<ShardIndex> weights = read_shard_index(io->load("w.ckpt"), "w.ckpt");
  ASSERT_TRUE(weights.has_value());
  EXPECT_FALSE(weights->optimizer_states);
  EXPECT_TRUE(load_shard(*io, "w.ckpt", *weights, 1).optimizer_states.empty());
  expect_rank_one_resumes_its_shard(io, "a.ckpt");
}

TEST(FitCheckpointsTest, ABackgroundShardedSaveInFlightIsCommittedBeforeTheNextAndRemovalsWaitForIt) {
  auto io = std::make_shared<InMemoryCheckpointIO>();
  Rank zero(0, 1, io, /*pieces=*/false, async_sharded());
  zero.checkpoints.begin_gather_point();
  zero.checkpoints.gather();
  zero.checkpoints.save("last.ckpt");
  zero.checkpoints.after_dispatch();
  const std::string first_id = decode_sharded_commit_plan(zero.strategy.group.sent.at(0)).save_id;
  // Outside a gather point, while last.ckpt is in flight: its removal waits for its commit.
  zero.checkpoints.remove("last.ckpt");
  zero.checkpoints.wait_for_writes();
  EXPECT_EQ(io->paths(), std::vector<std::string>{shard_path("last.ckpt", first_id, 0)});

  // The next save of the same file commits the first (and its removal) before its own copy.
  zero.checkpoints.begin_gather_point();
  zero.checkpoints.gather();
  zero.checkpoints.save("last.ckpt");
  zero.checkpoints.after_dispatch();
  EXPECT_EQ(zero.strategy.group.barriers, 2) << "the first write was committed, waiting for its shards";
  const std::string second_id = decode_sharded_commit_plan(zero.strategy.group.sent.at(1)).save_id;
  zero.checkpoints.wait_for_writes();
  EXPECT_FALSE(io->exists("last.ckpt")) << "the first was committed, then removed; the second is not yet";
  zero.checkpoints.complete_sharded_write();  // the end of the fit
  zero.checkpoints.wait_for_writes();
  EXPECT_EQ(io->paths(), (std::vector<std::string>{"last.ckpt", shard_path("last.ckpt", second_id, 0)}))
      << "the first save's shards went with it";
  EXPECT_EQ(read_shard_index(io->load("last.ckpt"), "last.ckpt")->save_id, second_id);
}

TEST(FitCheckpointsTest, AWeightsOnlyShardHoldsOnlyTheParametersPieces) {
  auto io = std::make_shared<InMemoryCheckpointIO>();
  Rank zero(0, 1, io, /*pieces=*/true);
  zero.checkpoints.begin_gather_point();
  zero.checkpoints.gather();
  zero.checkpoints.save_weights("w.ckpt");
  zero.checkpoints.after_dispatch();

  const ShardedCommitPlan plan = decode_sharded_commit_plan(zero.strategy.group.sent.at(0));
  ASSERT_EQ(plan.entries.size(), 1u);
  EXPECT_TRUE(plan.entries[0].weights_only);
  const c10::IValue top = io->load("w.ckpt");
  EXPECT_FALSE(top.toGenericDict().at("state_dict").toGenericDict().contains("layer.weight"))
      << "the piece is in the shard";
  EXPECT_TRUE(top.toGenericDict().at("state_dict").toGenericDict().contains("layer.bias"));
  const std::optional<ShardIndex> index = read_shard_index(top, "w.ckpt");
  ASSERT_TRUE(index.has_value());
  EXPECT_FALSE(index->optimizer_states);
  const Shard shard = load_shard(*io, "w.ckpt", *index, 0);
  EXPECT_TRUE(shard.optimizer_states.empty());
  ASSERT_EQ(shard.parameters.count("layer.weight"), 1u);
  EXPECT_EQ(shard.parameters.at("layer.weight").shape, (std::vector<int64_t>{1, 2}));
}

TEST(FitCheckpointsTest, ASaveOutsideAGatherPointNamesThePathAndTheHooks) {
  auto io = std::make_shared<InMemoryCheckpointIO>();
  Rank zero(0, 1, io, /*pieces=*/true);
  zero.checkpoints.begin_gather_point();
  const std::string message = testing::error_message([&] { zero.checkpoints.save_weights("late.ckpt"); });
  EXPECT_NE(message.find("cannot save checkpoint 'late.ckpt' at step 7"), std::string::npos) << message;
  EXPECT_NE(message.find("saves_checkpoint_at_train_batch_end"), std::string::npos) << message;
  EXPECT_TRUE(io->paths().empty());
}

TEST(FitCheckpointsTest, AFullCheckpointHoldsTheGatheredOptimizerStates) {
  auto io = std::make_shared<InMemoryCheckpointIO>();
  Rank zero(0, 1, io, /*pieces=*/false, StateDictType::kFull);
  zero.checkpoints.begin_gather_point();
  zero.checkpoints.gather();
  zero.checkpoints.save("full.ckpt");
  EXPECT_TRUE(io->exists("full.ckpt")) << "written at once";
  EXPECT_EQ(zero.sharding.gathers, 1);
  const c10::IValue top = io->load("full.ckpt");
  EXPECT_FALSE(read_shard_index(top, "full.ckpt").has_value());
  const auto states = top.toGenericDict().at("optimizer_states").toListRef();
  ASSERT_EQ(states.size(), 1u);
  EXPECT_EQ(field(states[0], "kind"), "whole");
  zero.checkpoints.after_dispatch();
  EXPECT_TRUE(zero.strategy.group.sent.empty()) << "nothing to commit";
}

TEST(FitCheckpointsTest, TrainEndSavesAreListedOnceInOrder) {
  auto io = std::make_shared<InMemoryCheckpointIO>();
  Rank zero(0, 1, io, /*pieces=*/false, StateDictType::kFull);
  zero.checkpoints.begin_gather_point();
  zero.checkpoints.gather();
  zero.checkpoints.save("before.ckpt");
  zero.checkpoints.begin_train_end();
  zero.checkpoints.save("last.ckpt");
  zero.checkpoints.save("timer.ckpt");
  zero.checkpoints.save("last.ckpt");
  EXPECT_EQ(zero.checkpoints.end_train_end(), (std::vector<std::string>{"last.ckpt", "timer.ckpt"}));
  EXPECT_EQ(zero.checkpoints.last_saved(), "last.ckpt");
}

TEST(ShardedCommitPlanTest, RoundTripsAnyPath) {
  const ShardedCommitPlan plan{.save_id = "20261128-abc",
                               .entries = {{.path = "runs/a\nb.ckpt", .weights_only = false},
                                           {.path = "runs/W12:x;.ckpt", .weights_only = true},
                                           {.path = "", .weights_only = false}}};
  const std::string bytes = encode(plan);
  EXPECT_EQ(decode_sharded_commit_plan(bytes), plan);
  EXPECT_EQ(decode_sharded_commit_plan(encode(ShardedCommitPlan{})), ShardedCommitPlan{});
}

TEST(ShardedCommitPlanTest, MalformedBytesSayWhatWasExpected) {
  const std::string bytes = encode({.save_id = "id", .entries = {{.path = "a.ckpt", .weights_only = true}}});
  for (const std::string& bad :
       {std::string("W\nFa.ckpt"), bytes.substr(0, bytes.size() - 2), bytes + "x", std::string()}) {
    const std::string message = testing::error_message([&] { (void)decode_sharded_commit_plan(bad); });
    EXPECT_NE(message.find("malformed sharded commit plan"), std::string::npos) << message;
    EXPECT_NE(message.find("expected"), std::string::npos) << message;
  }
  EXPECT_NE(testing::error_message([&] { (void)decode_sharded_commit_plan("W\nFa.ckpt"); }).find("version tag"),
            std::string::npos);
  EXPECT_NE(testing::error_message([&] { (void)decode_sharded_commit_plan(bytes + "x"); }).find("the end"),
            std::string::npos);
}

}  // namespace
}  // namespace volt
