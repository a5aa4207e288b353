#include "volt/loops/fit_checkpoints.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "volt/checkpoint/async_writer.h"
#include "volt/checkpoint/hpc_checkpoints.h"
#include "volt/checkpoint/snapshot_memory.h"
#include "volt/core/console.h"
#include "volt/core/error.h"
#include "volt/environments/restarts.h"
#include "volt/loops/metric_router.h"
#include "volt/loops/sharded_commit_plan.h"
#include "volt/metrics/metric.h"
#include "volt/module/lightning_module.h"
#include "volt/strategies/state_sharding.h"
#include "volt/strategies/strategy.h"

namespace volt {

namespace {

/// The file of a sharded checkpoint of `parts`: everything but the optimizer states and the
/// parameters kept in `pieces`, which lie in each process's shard.
StateDict sharded_file_contents(TrainingParts parts, const ParameterPieces& pieces, const FitProgress& progress,
                                CheckpointContents contents) {
  std::vector<std::string> in_pieces;
  for (const auto& [name, piece] : pieces) in_pieces.push_back(name);
  parts.sharded_parameters = &in_pieces;
  StateDict checkpoint = make_checkpoint(parts, progress, contents);
  (void)checkpoint.erase("optimizer_states");
  return checkpoint;
}

}  // namespace

FitCheckpoints::FitCheckpoints(FitCheckpointsOptions options, Strategy& strategy, StateSharding* sharding,
                               Checkpointer& checkpointer, MetricRouter& metrics, Console& console, TrainingParts parts,
                               const FitProgress& progress)
    : options_(std::move(options)),
      strategy_(strategy),
      sharding_(sharding),
      checkpointer_(checkpointer),
      metrics_(metrics),
      console_(console),
      parts_(std::move(parts)),
      progress_(progress) {}

FitCheckpoints::~FitCheckpoints() {
  // A fit that throws ends with its shard's file written, not with the writer waiting for ever.
  open_shard_gate();
}

void FitCheckpoints::set_shard_stage(int stage) {
  const std::lock_guard<std::mutex> lock(shard_gate_mutex_);
  shard_stage_.store(stage);
  shard_gate_changed_.notify_all();
}

void FitCheckpoints::open_shard_gate() {
  const std::lock_guard<std::mutex> lock(shard_gate_mutex_);
  shard_gate_open_ = true;
  shard_gate_changed_.notify_all();
}

void FitCheckpoints::wait_for_shard_in_memory() {
  if (!sharded_write_) return;
  {
    std::unique_lock<std::mutex> lock(shard_gate_mutex_);
    shard_gate_changed_.wait(lock, [this] { return shard_stage_.load() != 0; });
  }
  if (shard_stage_.load() < 0) writer_->wait();  // rethrows why
}

AsyncWriter& FitCheckpoints::writer() {
  if (!writer_) writer_ = std::make_unique<AsyncWriter>();
  return *writer_;
}

void FitCheckpoints::save_in_background(const TrainingParts& parts, const std::string& path,
                                        CheckpointContents contents) {
  // Loggers hear of the file before it once that is complete; the buffers are free then too.
  wait_for_writes();
  const c10::IValue checkpoint = make_checkpoint(parts, progress_, contents);
  if (contents == CheckpointContents::kFull) {
    c10::IValue copy = snapshot_buffers_.copy(checkpoint);
    writer().submit([this, copy = std::move(copy), path] {
      snapshot_buffers_.wait_copied();  // a GPU's copies into them may still be on their way
      checkpointer_.io().save(copy, path);
    });
  } else {
    writer().submit([this, copy = host_copy(checkpoint), path] { checkpointer_.io().save(copy, path); });
  }
  written_unannounced_.push_back(path);
}

void FitCheckpoints::announce_written() {
  for (const std::string& path : written_unannounced_) metrics_.after_save_checkpoint(path);
  written_unannounced_.clear();
}

TrainingParts FitCheckpoints::training_parts() const {
  TrainingParts parts = parts_;
  // State sharding cuts the whole state a checkpoint holds to this process's pieces.
  if (StateSharding* sharding = sharding_) {
    parts.load_optimizer_state = [sharding](torch::optim::Optimizer& optimizer, const c10::IValue& state) {
      sharding->load_optimizer_state(optimizer, state);
    };
    parts.parameter_name = [sharding](const torch::Tensor& optimized) { return sharding->parameter_name(optimized); };
  }
  return parts;
}

bool FitCheckpoints::sharded_checkpoints() const {
  return options_.state_dict_type == StateDictType::kSharded && sharding_ != nullptr;
}

void FitCheckpoints::save(const std::string& path) {
  // Rank 0 writes; the others do not wait here (their callbacks need not agree on every save),
  // so readers synchronize instead: fit ends with a barrier before any rank reads a file.
  if (strategy_.is_global_zero()) {
    std::optional<StateDict> local;
    const TrainingParts parts = parts_for_save(path, local);
    if (sharded_checkpoints()) {
      defer_sharded_save(path, parts, CheckpointContents::kFull);
    } else if (options_.async_checkpointing) {
      save_in_background(parts, path, CheckpointContents::kFull);
    } else {
      checkpointer_.save(parts, progress_, path);
      metrics_.after_save_checkpoint(path);
    }
  }
  note_saved(path);
}

void FitCheckpoints::save_weights(const std::string& path) {
  const bool pieces = sharding_ != nullptr && sharding_->shards_parameters();
  // full_shard's units are whole (or their pieces taken) only at a gather point.
  if (pieces) check_gathered_for_save(path);
  if (strategy_.is_global_zero()) {
    if (sharded_checkpoints() && pieces) {
      defer_sharded_save(path, training_parts(), CheckpointContents::kWeightsOnly);
    } else if (options_.async_checkpointing) {
      save_in_background(training_parts(), path, CheckpointContents::kWeightsOnly);
    } else {
      checkpointer_.save(training_parts(), progress_, path, CheckpointContents::kWeightsOnly);
      metrics_.after_save_checkpoint(path);
    }
  }
  note_saved(path);
}

void FitCheckpoints::remove(const std::string& path) {
  if (!strategy_.is_global_zero()) return;
  const auto pending = std::find_if(pending_saves_.begin(), pending_saves_.end(),
                                    [&path](const PendingSave& save) { return save.path == path; });
  if (pending != pending_saves_.end()) {
    pending_saves_.erase(pending);  // saved and dropped in the same hook: never written
  } else if (local_shard_ && !pending_saves_.empty()) {
    pending_removals_.push_back(path);  // after the commit of the saves that replace it
    return;
  } else if (sharded_write_) {
    sharded_write_->removals.push_back(path);  // after the commit of the write in flight (it may be of this file)
    return;
  } else if (writer_) {
    writer_->then([this, path] { checkpointer_.remove(path); });  // after the writes queued before it
    return;
  }
  checkpointer_.remove(path);
}

void FitCheckpoints::note_saved(const std::string& path) {
  last_saved_ = path;
  if (train_end_saves_ &&
      std::find(train_end_saves_->begin(), train_end_saves_->end(), path) == train_end_saves_->end())
    train_end_saves_->push_back(path);
}

void FitCheckpoints::begin_train_end() { train_end_saves_.emplace(); }

std::vector<std::string> FitCheckpoints::end_train_end() {
  std::vector<std::string> saved = train_end_saves_.value_or(std::vector<std::string>{});
  train_end_saves_.reset();
  return saved;
}

bool FitCheckpoints::needs_gather() const {
  // One process reads its own metric states when it saves; nothing to gather ahead of time.
  const bool metrics = !parts_.module->registered_metrics().empty() && strategy_.collectives().world_size() > 1;
  return metrics || sharding_ != nullptr;
}

void FitCheckpoints::begin_gather_point() { optimizer_states_.reset(); }

void FitCheckpoints::gather() {
  const auto& metrics = parts_.module->registered_metrics();
  Collectives& collectives = strategy_.collectives();
  if (!metrics.empty() && collectives.world_size() > 1) {
    StateDict states = make_state_dict();
    for (const auto& [name, metric] : metrics) states.insert(name, metric->gathered_state_dict(collectives));
    metric_states_ = std::move(states);
  }
  if (sharded_checkpoints()) {
    local_shard_ = LocalShard{.optimizer_states = sharding_->local_optimizer_states(parts_.optimization->optimizers),
                              .parameters = sharding_->local_parameter_pieces()};
  } else if (sharding_ != nullptr) {
    optimizer_states_ = sharding_->gather_optimizer_states(parts_.optimization->optimizers);
  }
}

void FitCheckpoints::after_dispatch() {
  commit_sharded_saves(/*from_callbacks=*/true);
  metric_states_.reset();  // gathered for this dispatch only: the next step changes them
  optimizer_states_.reset();
}

std::string FitCheckpoints::save_hpc() {
  // Numbered after the snapshot being written, and written after it.
  complete_sharded_write();
  wait_for_writes();
  gather();  // every process stopped at the same step
  std::string path;
  if (sharded_checkpoints()) {
    if (strategy_.is_global_zero()) {
      path = next_hpc_checkpoint_path(options_.hpc_checkpoint_dir);
      std::optional<StateDict> local;
      defer_sharded_save(path, parts_for_save(path, local), CheckpointContents::kFull);
    }
    commit_sharded_saves(/*from_callbacks=*/false);  // at once: the job is about to end
    if (strategy_.is_global_zero())
      checkpointer_.prune_hpc_checkpoints(options_.hpc_checkpoint_dir, options_.hpc_checkpoints_to_keep);
  } else if (strategy_.is_global_zero()) {
    std::optional<StateDict> local;
    path = checkpointer_.save_hpc_checkpoint(parts_for_save(options_.hpc_checkpoint_dir, local), progress_,
                                             options_.hpc_checkpoint_dir, options_.hpc_checkpoints_to_keep);
  }
  metric_states_.reset();
  optimizer_states_.reset();
  // Also a barrier: no rank goes on (and exits) before the file is complete.
  return strategy_.collectives().broadcast_string(path);
}

bool FitCheckpoints::save_snapshot(bool skip_when_busy, bool die_mid_write) {
  const bool writes = strategy_.is_global_zero();
  if (skip_when_busy) {
    // Under sharded checkpoints every process writes, and the snapshot peer receives: any writer
    // still at it skips the snapshot.
    bool skip = (writes || sharded_checkpoints() || is_snapshot_peer()) && writer_ && writer_->busy();
    // Every process skips or saves alike: the gather and a sharded commit below are collective.
    Collectives& collectives = strategy_.collectives();
    if (collectives.world_size() > 1) skip = collectives.all_reduce(skip ? 1.0 : 0.0, Reduce::kMax) > 0.5;
    if (skip) {
      ++snapshot_stats_.skipped;
      return false;
    }
  }
  complete_sharded_write();  // its shards are on disk (skip_when_busy found every writer idle) or it waits
  gather();
  const std::string& dir = options_.hpc_checkpoint_dir;
  const int64_t keep = options_.snapshots_to_keep;
  const auto next_path = [&] {
    // The file being written is not on disk yet: count past it, and past the memory tier's
    // snapshot whose file a crash cut short.
    next_snapshot_number_ = std::max(
        {next_snapshot_number_, next_resume_checkpoint_number(dir), newest_memory_snapshot_number(memory_dir_) + 1});
    return snapshot_path(dir, next_snapshot_number_++);
  };
  if (sharded_checkpoints()) {
    save_sharded_snapshot(next_path, die_mid_write);
  } else if (writes) {
    // The copy goes into the buffers the previous snapshot's write reads: it must be done.
    wait_for_writes();
    prepare_memory_tier();
    connect_snapshot_peer();
    const auto start = std::chrono::steady_clock::now();
    const std::string path = next_path();
    const int64_t number = next_snapshot_number_ - 1;
    std::optional<StateDict> local;
    c10::IValue copy =
        snapshot_buffers_.copy(make_checkpoint(parts_for_save(path, local), progress_, CheckpointContents::kFull));
    count_snapshot_copy(start);
    // The older snapshots go only once the new one is complete: a kill in between leaves one
    // more, never none.
    writer().submit([this, copy = std::move(copy), path, dir, keep, die_mid_write, number] {
      snapshot_buffers_.wait_copied();  // a GPU's copies into them may still be on their way
      if (memory_dir_.empty() && !peer_ && !die_mid_write) {
        checkpointer_.io().save(copy, path);
      } else {
        // Serialized once, for the memory tiers first: a crash while the file is written loses
        // the file, not the snapshot.
        save_to_bytes(copy, serialized_);
        const std::vector<char>& bytes = serialized_;
        keep_in_memory(number, bytes);
        send_to_peer(number, bytes);
        if (die_mid_write) {
          // Killed half-way through the real atomic write: what it leaves is its own temporary file.
          write_file_atomically(path, [&bytes](const ByteSink& sink) {
            sink(bytes.data(), bytes.size() / 2);
            die_of_injected_fault();
          });
        }
        checkpointer_.io().save_bytes(bytes, path);
      }
      for (const std::string& old : snapshots_to_prune(dir, keep)) checkpointer_.remove(old);
    });
  } else if (is_snapshot_peer()) {
    wait_for_writes();  // the previous snapshot's receive
    prepare_memory_tier();
    connect_snapshot_peer();
    if (peer_) writer().submit([this] { receive_from_rank0(); });
  }
  metric_states_.reset();
  optimizer_states_.reset();
  ++snapshot_stats_.saved;
  return true;
}

void FitCheckpoints::count_snapshot_copy(std::chrono::steady_clock::time_point start) {
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  snapshot_stats_.copy_seconds += seconds;
  if (snapshot_stats_.saved == 0) snapshot_stats_.first_copy_seconds = seconds;
}

void FitCheckpoints::save_sharded_snapshot(const std::function<std::string()>& next_path, bool die_mid_write) {
  const bool writes = strategy_.is_global_zero();
  const int64_t rank = strategy_.topology().global_rank;
  const int64_t world = strategy_.topology().world_size;
  // The copy goes into the buffers the previous snapshot's writes read (rank 0's commit among them).
  wait_for_writes();
  prepare_memory_tier();
  connect_shard_peers();
  // Rank 0 numbers the snapshot (past its memory tier's too) and draws its save id; every process
  // names its shard after them.
  ShardedCommitPlan plan;
  if (writes) plan = ShardedCommitPlan{.save_id = new_save_id(), .entries = {{.path = next_path()}}};
  plan = decode_sharded_commit_plan(strategy_.collectives().broadcast_string(encode(plan)));
  VOLT_INTERNAL_ASSERT(plan.entries.size() == 1, "a sharded snapshot's plan names {} files", plan.entries.size());
  const std::string path = plan.entries.front().path;
  const auto start = std::chrono::steady_clock::now();
  // One copy to host memory of what the writers read while training goes on: this process's shard
  // and, on rank 0, the snapshot file's contents (the parameters kept in pieces and the optimizer
  // states lie in the shards).
  c10::impl::GenericList state(c10::AnyType::get());
  state.push_back(make_shard(local_shard_->optimizer_states, make_parameter_pieces(local_shard_->parameters),
                             plan.save_id, rank, world));
  if (writes) {
    std::optional<StateDict> local;
    state.push_back(sharded_file_contents(parts_for_save(path, local), local_shard_->parameters, progress_,
                                          CheckpointContents::kFull));
  }
  const c10::IValue copy = snapshot_buffers_.copy(state);
  count_snapshot_copy(start);
  const auto copied = copy.toListRef();
  c10::IValue index;
  if (writes) {
    StateDict contents = copied[1].toGenericDict();
    contents.insert_or_assign(kShardIndexKey, make_shard_index(path, plan.save_id, world));
    index = contents;
  }
  const int64_t number = resume_checkpoint_number(path).value_or(0);
  shard_stage_.store(0);
  {
    const std::lock_guard<std::mutex> lock(shard_gate_mutex_);
    shard_gate_open_ = false;
  }
  sharded_write_ = ShardedWrite{
      .files = {{.path = path, .checkpoint = index}}, .save_id = plan.save_id, .snapshot = true, .number = number};
  writer().submit([this, shard = copied[0], path, save_id = plan.save_id, file = shard_path(path, plan.save_id, rank),
                   index, number, die_mid_write] {
    try {
      snapshot_buffers_.wait_copied();
      if (memory_dir_.empty() && !peer_ && !die_mid_write) {
        set_shard_stage(1);
        checkpointer_.io().save(shard, file);
      } else {
        // Into the memory tiers first (this node's, and the next node's with peer copies), and the
        // file only once every process's shard is there and the snapshot committed in memory:
        // whatever happens to the file then loses nothing.
        save_to_bytes(shard, serialized_);
        const std::vector<char>& bytes = serialized_;
        serialized_index_.clear();
        if (!index.isNone()) save_to_bytes(index, serialized_index_);
        const std::vector<char>& index_bytes = serialized_index_;
        keep_file_in_memory(std::filesystem::path(file).filename().string(), bytes);
        if (!index.isNone()) keep_file_in_memory(pending_memory_index_name(number), index_bytes);
        // Every process votes 1 only once the previous node's copy is in its tier too: the commit
        // in memory finds every copy in place.
        if (peer_) exchange_shard_copies(path, save_id, number, bytes, index_bytes);
        set_shard_stage(1);
        if (!memory_dir_.empty()) {
          std::unique_lock<std::mutex> lock(shard_gate_mutex_);
          shard_gate_changed_.wait(lock, [this] { return shard_gate_open_; });
        }
        if (die_mid_write) {
          write_file_atomically(file, [&bytes](const ByteSink& sink) {
            sink(bytes.data(), bytes.size() / 2);
            die_of_injected_fault();
          });
        }
        checkpointer_.io().save_bytes(bytes, file);
      }
      set_shard_stage(2);
    } catch (...) {
      set_shard_stage(-1);
      throw;
    }
  });
  local_shard_.reset();
}

void FitCheckpoints::advance_sharded_write() {
  if (!sharded_write_) return;
  ShardedWrite& write = *sharded_write_;
  if (write.vote) {
    // The least stage any process reached: 1, every shard is in memory; 2, on disk.
    const double stage = write.vote->wait();
    write.vote.reset();
    if (stage > 0.5) commit_sharded_snapshot_in_memory();
    if (stage > 1.5) {
      commit_sharded_write();
      return;
    }
  }
  // An idle writer is past its shard (or failed); wait() returns at once and rethrows why.
  if (!writer_->busy() || shard_stage_.load() < 0) writer_->wait();
  write.vote = strategy_.collectives().all_reduce_async(static_cast<double>(shard_stage_.load()), Reduce::kMin);
}

void FitCheckpoints::complete_sharded_write() {
  if (!sharded_write_) return;
  // Every process started the same votes: each reads its last one, so the collectives stay paired.
  if (sharded_write_->vote) (void)sharded_write_->vote->wait();
  // Every shard is in memory once every process is past this wait; the commit there lets the
  // writers on to the files, and every shard is on disk once every process is past the second.
  wait_for_shard_in_memory();
  strategy_.collectives().barrier();
  commit_sharded_snapshot_in_memory();
  writer_->wait();
  strategy_.collectives().barrier();
  commit_sharded_write();
}

void FitCheckpoints::commit_sharded_snapshot_in_memory() {
  ShardedWrite& snapshot = *sharded_write_;
  if (snapshot.in_memory) return;
  snapshot.in_memory = true;
  // memory_dir_ is settled: this process's writer is past its memory writes (it voted 1 or more).
  if (!memory_dir_.empty()) {
    // Rank 0 and, on the next node, the process that keeps rank 0's copies: each renames the index
    // in its node's tier.
    const bool copies = copies_shards();
    const bool owns_index = strategy_.is_global_zero() || (copies && shard_copy_source() == 0);
    if (owns_index) {
      std::error_code ec;
      std::filesystem::rename(std::filesystem::path(memory_dir_) / pending_memory_index_name(snapshot.number),
                              snapshot_path(memory_dir_, snapshot.number), ec);
    }
    std::vector<int64_t> ranks{strategy_.topology().global_rank};
    if (copies) ranks.push_back(shard_copy_source());
    prune_memory_shards(memory_dir_, ranks, snapshot.number, snapshot.save_id, owns_index);
  }
  // Only now: the commit in memory is in place before anything happens to the files.
  open_shard_gate();
}

void FitCheckpoints::commit_sharded_write() {
  ShardedWrite write = std::move(*sharded_write_);
  sharded_write_.reset();
  if (!strategy_.is_global_zero()) return;
  // A callback's saves: loggers hear of them once the commit below is done (announce_written).
  if (!write.snapshot)
    for (const ShardedWrite::File& file : write.files) written_unannounced_.push_back(file.path);
  writer().then([this, files = std::move(write.files), save_id = write.save_id, snapshot = write.snapshot,
                 removals = std::move(write.removals), dir = options_.hpc_checkpoint_dir,
                 keep = options_.snapshots_to_keep] {
    CheckpointIO& io = checkpointer_.io();
    for (const ShardedWrite::File& file : files) {
      io.save(file.checkpoint, file.path);
      // The previous save's shards, and those of a save of this path never committed.
      remove_shards(io, file.path, save_id);
    }
    // The older snapshots, and the checkpoints these saves replace, go only once the new files are
    // complete: a kill in between leaves one more, never none.
    if (snapshot)
      for (const std::string& old : snapshots_to_prune(dir, keep)) checkpointer_.remove(old);
    for (const std::string& path : removals) checkpointer_.remove(path);
  });
}

void FitCheckpoints::wait_for_writes() {
  if (!writer_) return;
  writer_->wait();
  announce_written();
}

void FitCheckpoints::prepare_memory_tier() {
  if (!memory_failure_.empty()) {
    console_.warn(
        fmt::format("The newest snapshot is no longer kept in shared memory, only in files: {}", memory_failure_));
    memory_failure_.clear();
  }
  if (memory_prepared_ || options_.snapshot_memory_root.empty()) return;
  memory_prepared_ = true;
  const std::string& root = options_.snapshot_memory_root;
  memory_dir_ = memory_snapshot_dir(root, options_.hpc_checkpoint_dir);
  if (!memory_dir_.empty()) {
    remove_stale_memory_snapshots(root, options_.hpc_checkpoint_dir, memory_dir_);
  } else if (is_snapshot_peer()) {
    // The folder's name comes from the progress marker rank 0 wrote into hpc_checkpoint_dir.
    console_.warn(fmt::format(
        "Rank {} cannot keep rank 0's snapshots in its node's memory: it finds no progress marker in {}. HINT: put "
        "hpc_checkpoint_dir (default_root_dir) on a file system every node sees.",
        options_.snapshot_peer_rank, options_.hpc_checkpoint_dir));
  }
}

bool FitCheckpoints::is_snapshot_peer() const {
  return options_.snapshot_peer_rank > 0 && strategy_.topology().global_rank == options_.snapshot_peer_rank;
}

void FitCheckpoints::warn_of_peer_failure() {
  if (peer_failure_.empty()) return;
  console_.warn(fmt::format("The newest snapshot is no longer copied to another node: {}", peer_failure_));
  peer_failure_.clear();
}

bool FitCheckpoints::copies_shards() const { return sharded_checkpoints() && options_.snapshot_peer_rank > 0; }

int64_t FitCheckpoints::shard_copy_source() const {
  const Topology& topology = strategy_.topology();
  return (topology.global_rank - options_.snapshot_peer_rank + topology.world_size) % topology.world_size;
}

void FitCheckpoints::connect_shard_peers() {
  warn_of_peer_failure();
  if (peer_connected_ || !copies_shards()) return;
  peer_connected_ = true;
  const Topology& topology = strategy_.topology();
  const int64_t next = (topology.global_rank + options_.snapshot_peer_rank) % topology.world_size;
  const int64_t previous = shard_copy_source();
  Collectives& collectives = strategy_.collectives();
  if (next == previous) {
    peer_ = collectives.connect_peer(next);
  } else if ((topology.global_rank / options_.snapshot_peer_rank) % 2 == 0) {
    peer_ = collectives.connect_peer(next);
    peer_back_ = collectives.connect_peer(previous);
  } else {
    peer_back_ = collectives.connect_peer(previous);
    peer_ = collectives.connect_peer(next);
  }
  if (next != previous && (!peer_ || !peer_back_)) {
    peer_.reset();
    peer_back_.reset();
  }
  if (!peer_ && strategy_.is_global_zero()) {
    console_.warn(
        fmt::format("The shards of the newest snapshot are not copied to the next node: strategy='{}' "
                    "offers no channel between two processes.",
                    strategy_.name()));
  }
}

void FitCheckpoints::exchange_shard_copies(const std::string& path, const std::string& save_id, int64_t number,
                                           const std::vector<char>& bytes, const std::vector<char>& index) {
  const int64_t source = shard_copy_source();
  PeerChannel& forwards = *peer_;
  PeerChannel& backwards = peer_back_ ? *peer_back_ : *peer_;
  const auto send = [&] {
    forwards.send(number, bytes);
    if (!index.empty()) forwards.send(number, index);
  };
  const auto receive_one = [&] {
    auto [tag, received] = backwards.receive();
    if (tag != number) {
      throw Error(fmt::format("rank {} sent a copy of snapshot {} where snapshot {}'s was due", source, tag, number));
    }
    return std::move(received);
  };
  const auto receive = [&] {
    keep_file_in_memory(std::filesystem::path(shard_path(path, save_id, source)).filename().string(), receive_one());
    if (source == 0) keep_file_in_memory(pending_memory_index_name(number), receive_one());
  };
  try {
    // A send may wait for the other end's receive, so one end of every pair receives first: odd
    // nodes. (On an odd number of nodes the last, even, node sends to node 0, which receives once
    // its own send to node 1 is through.)
    if ((strategy_.topology().global_rank / options_.snapshot_peer_rank) % 2 == 0) {
      send();
      receive();
    } else {
      receive();
      send();
    }
  } catch (const Error& e) {
    peer_failure_ = e.what();
    peer_.reset();
    peer_back_.reset();
  }
}

void FitCheckpoints::connect_snapshot_peer() {
  warn_of_peer_failure();
  if (peer_connected_ || options_.snapshot_peer_rank <= 0) return;
  peer_connected_ = true;
  const bool zero = strategy_.is_global_zero();
  peer_ = strategy_.collectives().connect_peer(zero ? options_.snapshot_peer_rank : 0);
  if (!peer_ && zero) {
    console_.warn(
        fmt::format("The newest snapshot is not copied to rank {}: strategy='{}' offers no channel "
                    "between two processes.",
                    options_.snapshot_peer_rank, strategy_.name()));
  }
}

void FitCheckpoints::send_to_peer(int64_t number, const std::vector<char>& bytes) {
  if (!peer_) return;
  try {
    peer_->send(number, bytes);
    // The peer answers once the snapshot is in its node's memory: whatever rank 0 does next
    // (dying while it writes the file) cannot lose it.
    (void)peer_->receive();
  } catch (const Error& e) {
    peer_failure_ = e.what();
    peer_.reset();
  }
}

void FitCheckpoints::receive_from_rank0() {
  try {
    const auto [number, bytes] = peer_->receive();
    keep_in_memory(number, bytes);
    peer_->send(number, {});
  } catch (const Error& e) {
    peer_failure_ = e.what();
    peer_.reset();
  }
}

void FitCheckpoints::keep_file_in_memory(const std::string& name, const std::vector<char>& bytes) {
  if (memory_dir_.empty()) return;
  try {
    write_memory_file(memory_dir_, name, bytes);
  } catch (const CheckpointError& e) {
    memory_failure_ = e.what();
    memory_dir_.clear();  // its files stay until the end of the fit: another process of the node may share the folder
  }
}

void FitCheckpoints::keep_in_memory(int64_t number, const std::vector<char>& bytes) {
  if (memory_dir_.empty()) return;
  try {
    write_memory_snapshot(memory_dir_, number, bytes);
  } catch (const CheckpointError& e) {
    // The files still hold every snapshot: the run goes on without the tier.
    memory_failure_ = e.what();
    remove_memory_snapshots(memory_dir_);
    memory_dir_.clear();
  }
}

void FitCheckpoints::release_memory_tier() {
  wait_for_writes();
  // Also when this attempt saved no snapshot: it may have resumed from the tier's.
  // Under sharded checkpoints every process keeps its shard there.
  if (!options_.snapshot_memory_root.empty() &&
      (strategy_.is_global_zero() || is_snapshot_peer() || sharded_checkpoints()))
    remove_memory_snapshots(memory_snapshot_dir(options_.snapshot_memory_root, options_.hpc_checkpoint_dir));
  memory_dir_.clear();
}

SnapshotStats FitCheckpoints::snapshot_stats() const {
  SnapshotStats stats = snapshot_stats_;
  if (writer_) {
    const AsyncWriterStats writer = writer_->stats();
    stats.waited_seconds = writer.waited_seconds;
    stats.write_seconds = writer.write_seconds;
  }
  return stats;
}

TrainingParts FitCheckpoints::parts_for_save(const std::string& path, std::optional<StateDict>& local) {
  TrainingParts parts = training_parts();
  parts.metric_states = metric_states_for_save(local);
  parts.optimizer_states = optimizer_states_for_save(path);
  return parts;
}

void FitCheckpoints::check_gathered_for_save(const std::string& path) const {
  VOLT_CHECK(optimizer_states_.has_value() || local_shard_.has_value(),
             "cannot save checkpoint '{}' at step {}: strategy='{}' shards the optimizer state{} over the processes, "
             "and it is gathered for a checkpoint only before on_validation_end, on_train_epoch_end, on_train_end, "
             "an HPC save, and an on_train_batch_end at which a callback's saves_checkpoint_at_train_batch_end() "
             "is true. HINT: have the callback that saves override saves_checkpoint_at_train_batch_end, or save at "
             "those hooks.",
             path, progress_.global_step, strategy_.name(),
             sharding_ != nullptr && sharding_->shards_parameters() ? " and the units' parameters" : "");
}

const std::vector<c10::IValue>* FitCheckpoints::optimizer_states_for_save(const std::string& path) const {
  if (sharding_ == nullptr) return nullptr;
  check_gathered_for_save(path);
  // Sharded: the checkpoint file holds none; each process writes its own at the commit.
  return optimizer_states_ ? &*optimizer_states_ : nullptr;
}

const StateDict* FitCheckpoints::metric_states_for_save(std::optional<StateDict>& local) {
  const auto& metrics = parts_.module->registered_metrics();
  if (metrics.empty()) return nullptr;
  if (strategy_.collectives().world_size() == 1) {
    local = make_state_dict();
    for (const auto& [name, metric] : metrics) local->insert(name, metric->gathered_state_dict(local_collectives()));
    return &*local;
  }
  if (metric_states_) return &*metric_states_;
  if (!warned_metric_states_) {
    warned_metric_states_ = true;
    console_.warn(fmt::format(
        "A checkpoint saved at step {} holds no states of the registered metrics: under ddp they are gathered "
        "from every process only before on_validation_end, on_train_epoch_end, an HPC save, and an "
        "on_train_batch_end at which a callback's saves_checkpoint_at_train_batch_end() is true; a resume from "
        "it starts the metrics over. HINT: have the callback that saved it override "
        "saves_checkpoint_at_train_batch_end, or save at those hooks.",
        progress_.global_step));
  }
  return nullptr;
}

void FitCheckpoints::defer_sharded_save(const std::string& path, TrainingParts parts, CheckpointContents contents) {
  VOLT_INTERNAL_ASSERT(local_shard_.has_value(), "a sharded save of '{}' outside a gather point", path);
  StateDict checkpoint = sharded_file_contents(std::move(parts), local_shard_->parameters, progress_, contents);
  std::erase_if(pending_saves_, [&path](const PendingSave& pending) { return pending.path == path; });
  pending_saves_.push_back(PendingSave{
      .path = path, .checkpoint = std::move(checkpoint), .weights_only = contents != CheckpointContents::kFull});
}

void FitCheckpoints::write_sharded_saves_in_background(const ShardedCommitPlan& plan) {
  // The copy goes into the buffers the write in flight reads: it is committed first.
  complete_sharded_write();
  wait_for_writes();
  const int64_t rank = strategy_.topology().global_rank;
  const int64_t world = strategy_.topology().world_size;
  const auto weights_only = [](const ShardedCommitPlan::Entry& entry) { return entry.weights_only; };
  const bool any_full = !std::all_of(plan.entries.begin(), plan.entries.end(), weights_only);
  const bool any_weights_only = std::any_of(plan.entries.begin(), plan.entries.end(), weights_only);
  // One copy to host memory of what the writers read while training goes on: this process's shard
  // in each form the saves take (the same for every save of a form) and, on rank 0, each file's
  // contents (pending_saves_, in the plan's order).
  const c10::IValue parameters = make_parameter_pieces(local_shard_->parameters);
  c10::impl::GenericList state(c10::AnyType::get());
  state.push_back(any_full ? make_shard(local_shard_->optimizer_states, parameters, plan.save_id, rank, world)
                           : c10::IValue());
  state.push_back(any_weights_only ? make_shard({}, parameters, plan.save_id, rank, world) : c10::IValue());
  for (const PendingSave& save : pending_saves_) state.push_back(save.checkpoint);
  const c10::IValue copy = snapshot_buffers_.copy(state);
  const auto copied = copy.toListRef();
  ShardedWrite write{.save_id = plan.save_id, .in_memory = true, .removals = std::move(pending_removals_)};
  pending_removals_.clear();
  std::vector<std::pair<std::string, c10::IValue>> shards;
  for (size_t i = 0; i < plan.entries.size(); ++i) {
    const ShardedCommitPlan::Entry& entry = plan.entries[i];
    shards.emplace_back(shard_path(entry.path, plan.save_id, rank), copied[entry.weights_only ? 1 : 0]);
    c10::IValue index;
    if (strategy_.is_global_zero()) {
      StateDict contents = copied[2 + i].toGenericDict();
      contents.insert_or_assign(kShardIndexKey, make_shard_index(entry.path, plan.save_id, world, !entry.weights_only));
      index = contents;
    }
    write.files.push_back({.path = entry.path, .checkpoint = index});
  }
  shard_stage_.store(0);
  sharded_write_ = std::move(write);
  writer().submit([this, shards = std::move(shards)] {
    try {
      snapshot_buffers_.wait_copied();  // a GPU's copies into them may still be on their way
      set_shard_stage(1);               // no memory tier: straight to the files
      for (const auto& [path, shard] : shards) checkpointer_.io().save(shard, path);
      set_shard_stage(2);
    } catch (...) {
      set_shard_stage(-1);
      throw;
    }
  });
}

void FitCheckpoints::commit_sharded_saves(bool from_callbacks) {
  if (!local_shard_) return;  // every process gathered at the same point, or none did
  ShardedCommitPlan plan;
  if (strategy_.is_global_zero() && !pending_saves_.empty()) {
    plan.save_id = new_save_id();
    for (const PendingSave& save : pending_saves_) plan.entries.push_back({save.path, save.weights_only});
  }
  // Rank 0's save id and paths reach every process: each writes its shard of every save, in parallel.
  plan = decode_sharded_commit_plan(strategy_.collectives().broadcast_string(encode(plan)));
  if (from_callbacks && options_.async_checkpointing && !plan.entries.empty()) {
    write_sharded_saves_in_background(plan);
  } else if (!plan.entries.empty()) {
    const int64_t rank = strategy_.topology().global_rank;
    const int64_t world = strategy_.topology().world_size;
    CheckpointIO& io = checkpointer_.io();
    const c10::IValue parameters = make_parameter_pieces(local_shard_->parameters);
    for (const ShardedCommitPlan::Entry& entry : plan.entries) {
      io.save(make_shard(entry.weights_only ? std::vector<c10::IValue>{} : local_shard_->optimizer_states, parameters,
                         plan.save_id, rank, world),
              shard_path(entry.path, plan.save_id, rank));
    }
    // Every shard is on disk before rank 0 commits: a kill before the commit leaves the previous
    // checkpoint (and its shards) in place, after it the complete new set.
    strategy_.collectives().barrier();
    if (strategy_.is_global_zero()) {
      for (PendingSave& save : pending_saves_) {
        save.checkpoint.insert_or_assign(kShardIndexKey,
                                         make_shard_index(save.path, plan.save_id, world, !save.weights_only));
        io.save(save.checkpoint, save.path);
        remove_shards(io, save.path, plan.save_id);  // the previous save's, and those of saves never committed
        // Complete with its shards: a logger may keep them (MLflow's log_model).
        if (from_callbacks) metrics_.after_save_checkpoint(save.path);
      }
    }
  }
  // Removals asked for in the same hook (ModelCheckpoint's old top-k) come after the new
  // checkpoints are complete, as they do when saves are written at once (in the background: they
  // went with the write; here they are left only when the saves were dropped, and wait for a write
  // in flight, which may be of the same file).
  if (strategy_.is_global_zero()) {
    for (const std::string& path : pending_removals_) {
      if (sharded_write_) {
        sharded_write_->removals.push_back(path);
      } else {
        checkpointer_.remove(path);
      }
    }
  }
  pending_saves_.clear();
  pending_removals_.clear();
  local_shard_.reset();
}

FitProgress FitCheckpoints::restore(const LoadedCheckpoint& checkpoint) {
  c10::IValue value = checkpoint.value;
  std::optional<ParameterPieces> sharded_parameters;  // this process's pieces of them
  if (const std::optional<ShardIndex> index = read_shard_index(value, checkpoint.path)) {
    const Topology& topology = strategy_.topology();
    if (sharding_ == nullptr || topology.world_size != index->world_size) {
      throw CheckpointError(fmt::format(
          "checkpoint '{}' is sharded: {} processes of strategy='fsdp' wrote its optimizer state a file each, "
          "and this run is strategy='{}' with {} processes. HINT: resume it with strategy='fsdp' on {} processes, "
          "or write it in one file first (volt::consolidate_sharded_checkpoint) to resume under any strategy.",
          checkpoint.path, index->world_size, strategy_.name(), topology.world_size, index->world_size));
    }
    StateDict top = value.toGenericDict().copy();
    // A snapshot read from rank 0's memory tier: this process's shard is in its own node's tier
    // (same folder name on every node) or, once written, among the files.
    const std::string memory_dir =
        options_.snapshot_memory_root.empty()
            ? std::string()
            : memory_snapshot_dir(options_.snapshot_memory_root, options_.hpc_checkpoint_dir);
    const std::string shard_base = locate_shard(checkpointer_.io(), checkpoint.path, *index, topology.global_rank,
                                                {memory_dir, options_.hpc_checkpoint_dir})
                                       .value_or(checkpoint.path);  // missing: load_shard says so
    // A memory tier is read from the file system whatever the CheckpointIO, as the resume read it.
    TorchCheckpointIO files;
    const std::string own =
        (std::filesystem::path(shard_base).parent_path() / index->files[static_cast<size_t>(topology.global_rank)])
            .string();
    CheckpointIO* shard_io = checkpointer_.io().exists(own) ? &checkpointer_.io() : &files;
    Shard shard = load_shard(*shard_io, shard_base, *index, topology.global_rank);
    if (index->optimizer_states) {
      c10::impl::GenericList states(c10::AnyType::get());
      for (const c10::IValue& state : shard.optimizer_states) states.push_back(state);
      top.insert_or_assign("optimizer_states", states);
    } else {
      (void)top.erase(kShardIndexKey);  // weights only: refused as such below
    }
    if (top.contains(kShardedParametersKey)) sharded_parameters = std::move(shard.parameters);
    value = top;
  }
  TrainingParts parts = training_parts();
  parts.loads_sharded_parameters = sharded_parameters.has_value();
  const FitProgress restored = restore_checkpoint(value, parts, checkpoint.path);
  // After the optimizers' states: a relayout they caused (a fine-tuning run's groups) came first.
  if (sharded_parameters) sharding_->load_parameter_pieces(*sharded_parameters, checkpoint.path);
  restore_metric_states(checkpoint.value, checkpoint.path, restored);
  return restored;
}

void FitCheckpoints::restore_metric_states(const c10::IValue& checkpoint, const std::string& path,
                                           const FitProgress& restored) {
  const auto& metrics = parts_.module->registered_metrics();
  if (metrics.empty() || !checkpoint.isGenericDict()) return;
  const StateDict top = checkpoint.toGenericDict();
  if (!top.contains(kMetricsCheckpointKey)) {
    if (restored.batches_done > 0 && !restored.epoch_done) {
      console_.warn(
          fmt::format("{} holds no metric states ('{}'), so the registered metrics start this epoch "
                      "over from the resumed batch.",
                      path, kMetricsCheckpointKey));
    }
    return;
  }
  const StateDict saved = top.at(kMetricsCheckpointKey).toGenericDict();
  for (const auto& [name, metric] : metrics) {
    if (!saved.contains(name)) {
      console_.warn(fmt::format("{} holds no state of the metric '{}', which starts over.", path, name));
      continue;
    }
    metric->load_gathered_state_dict(saved.at(name).toGenericDict(), strategy_.collectives());
  }
}

}  // namespace volt
