// The fit's checkpoints: what a save gathers from every process, how it is written (at once, or
// under sharded checkpoints in a two-phase commit), what was saved, and how a fit restores one.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "volt/base/collectives.h"
#include "volt/checkpoint/async_writer.h"
#include "volt/checkpoint/checkpoint_state.h"
#include "volt/checkpoint/checkpointer.h"
#include "volt/checkpoint/sharded_checkpoint.h"
#include "volt/loops/fit_result.h"
#include "volt/options/option_enums.h"

namespace volt {

class Console;
class MetricRouter;
class StateSharding;
class Strategy;
struct ShardedCommitPlan;

/// The plan's fields FitCheckpoints uses (RunPlan's, resolved).
struct FitCheckpointsOptions {
  /// kSharded (under a strategy with state sharding): each process writes its shard of every
  /// checkpoint beside rank 0's file, which holds their index; kFull: rank 0 writes one file.
  StateDictType state_dict_type = StateDictType::kFull;
  /// Where HPC checkpoints (hpc_ckpt_<N>.ckpt) go, e.g. "/runs/x/hpc".
  std::string hpc_checkpoint_dir;
  /// HPC checkpoints kept after each HPC save.
  int64_t hpc_checkpoints_to_keep = 2;
  /// Snapshots (snapshot_<N>.ckpt, beside the HPC checkpoints) kept after each one completes.
  int64_t snapshots_to_keep = 2;
  /// The checkpoints that callbacks save are written by the background writer too (under sharded
  /// checkpoints every process's writer writes its shards, and rank 0 commits in the background).
  bool async_checkpointing = false;
  /// The tmpfs (e.g. "/dev/shm") where rank 0 keeps the newest snapshot in memory too
  /// (snapshot_memory.h); "" none.
  std::string snapshot_memory_root;
  /// The rank that keeps a copy of rank 0's newest snapshot in its node's memory tier (rank 0's
  /// writer sends it over a PeerChannel, the peer's writer receives it); -1 none. It is the number
  /// of processes per node: under sharded snapshots every process r sends its shard to rank
  /// (r + snapshot_peer_rank) % world, the same local rank on the next node, and rank 0 its index too.
  int64_t snapshot_peer_rank = -1;
};

/// Saves and restores a fit's checkpoints for FitLoop (which forwards its CallbackServices here).
///
/// Every process calls the same methods at the same points. A checkpoint saved from a callback
/// needs states that live on every process (the registered metrics' under several processes, the
/// optimizers' under state sharding); the loop calls gather() where every process is (a gather
/// point, before a dispatch) and after_dispatch() after it. Rank 0 writes; under sharded
/// checkpoints it only builds its file at save time, and after_dispatch() commits: every process
/// writes its shard of each checkpoint rank 0 announced (a ShardedCommitPlan), then rank 0 writes
/// the files and removes the checkpoints whose removal waited for them. Under async_checkpointing
/// the writers do so in the background, committed as sharded snapshots are (advance_sharded_write).
class FitCheckpoints {
 public:
  /// Borrows everything: `sharding` is strategy.state_sharding() (nullptr: nothing sharded),
  /// `parts` what a checkpoint holds (the module, optimizers, callbacks, precision, config), and
  /// `progress` where the fit stands whenever it saves.
  FitCheckpoints(FitCheckpointsOptions options, Strategy& strategy, StateSharding* sharding, Checkpointer& checkpointer,
                 MetricRouter& metrics, Console& console, TrainingParts parts, const FitProgress& progress);
  /// Lets a snapshot being written finish (see AsyncWriter).
  ~FitCheckpoints();

  /// Saves a full checkpoint to `path` (rank 0 writes; sharded: at the commit). Throws
  /// volt::Error when it needs states that were not gathered at this point.
  void save(const std::string& path);
  /// Saves a weights-only checkpoint to `path` (CheckpointContents::kWeightsOnly).
  void save_weights(const std::string& path);
  /// Removes checkpoint `path` (rank 0): at once, or after the commit of the sharded saves that
  /// replace it (or of the sharded write in flight); a save of `path` not yet committed is
  /// dropped instead.
  void remove(const std::string& path);

  /// Whether a checkpoint needs states gathered ahead from every process: registered metrics
  /// under several processes, or state sharding.
  bool needs_gather() const;
  /// At a gather point, before deciding whether to gather: what an earlier point gathered is
  /// stale now, since a checkpoint from here on needs this step's.
  void begin_gather_point();
  /// Collective: gathers the registered metrics' states and the optimizers' (or, under sharded
  /// checkpoints, takes this process's shard) for the saves of the dispatch that follows.
  void gather();
  /// Collective, after every dispatch: commits the sharded saves since the gather point (a no-op
  /// when nothing was gathered; under async_checkpointing, in the background) and forgets what was
  /// gathered (the next step changes it).
  void after_dispatch();

  /// Collective, where every process stopped at the same step: gathers, saves an HPC checkpoint
  /// into options.hpc_checkpoint_dir, keeps the newest hpc_checkpoints_to_keep, and returns its
  /// path on every process once the file is complete.
  std::string save_hpc();

  /// Collective, at a step boundary where every process is: saves a snapshot,
  /// snapshot_<N>.ckpt beside the HPC checkpoints, numbered in their sequence. Rank 0 copies the
  /// state to host memory, and a background thread serializes it, keeps it in the memory tier
  /// (options.snapshot_memory_root), sends it to the snapshot peer (whose writer keeps it in its
  /// node's tier), writes the file and then deletes all but the newest snapshots_to_keep. A
  /// memory tier or a peer copy that fails is dropped with a warning.
  /// Under sharded checkpoints every process copies its shard and its writer writes it, into the
  /// memory tier first (with peer copies, the next node's too); the set is committed in memory
  /// once every shard and copy is there, and in the
  /// files once every shard is on disk (advance_sharded_write). A snapshot due while
  /// the previous one is still being written waits for it or, with `skip_when_busy`, is skipped
  /// (on every process, as any writer's state finds). Returns whether it was saved.
  /// `die_mid_write` (an injected fault): rank 0's writer leaves half a temporary file and kills
  /// the process, as a crash while writing would.
  bool save_snapshot(bool skip_when_busy, bool die_mid_write = false);
  /// Collective, once per optimizer step boundary: moves a sharded write in the background (a
  /// snapshot's, or under async_checkpointing the saves of a dispatch) towards its commit without
  /// waiting. Every process says how far its shards are (in memory, on disk) in an asynchronous
  /// all-reduce that the next boundary reads; once all are in memory, a snapshot is committed
  /// there, and once all are on disk, rank 0's writer writes each file with its shard index (the
  /// commit) and then removes what waited for it. A no-op otherwise.
  void advance_sharded_write();
  /// Collective: commits the sharded write still in flight, waiting for every process's shards.
  /// Before another snapshot, another background save or an HPC save, and at the end of the fit.
  void complete_sharded_write();
  /// Blocks until this process's writer has put its shard of the sharded snapshot in flight into
  /// the memory tier (or past it, without one); throws what made it fail. A no-op without one in
  /// flight. complete_sharded_write waits so; a test does to see the commit in memory.
  void wait_for_shard_in_memory();
  /// Waits for what the background writer has queued (snapshots, and checkpoints under
  /// async_checkpointing, with the removals behind them); rethrows a write's error
  /// (volt::CheckpointError).
  void wait_for_writes();
  /// What the snapshots cost so far (the writer's seconds include async_checkpointing's saves).
  SnapshotStats snapshot_stats() const;
  /// The fit is over and its files complete: waits for the writer and removes the memory tier
  /// (rank 0's, the snapshot peer's, every process's when sharded): its memory goes back.
  void release_memory_tier();

  /// From now until end_train_end(), records the checkpoints saved (those of on_train_end).
  void begin_train_end();
  /// The checkpoints saved since begin_train_end(), each once, in the order of their first save.
  std::vector<std::string> end_train_end();
  /// The checkpoint saved last ("" when none).
  const std::string& last_saved() const { return last_saved_; }

  /// Restores module, optimizers, callbacks and the registered metrics from `checkpoint` (a
  /// sharded one with this process's shard) and returns where it stood. Throws
  /// volt::CheckpointError when it does not fit.
  FitProgress restore(const LoadedCheckpoint& checkpoint);

 private:
  TrainingParts training_parts() const;
  bool sharded_checkpoints() const;
  /// What a checkpoint saved now to `path` holds: the registered metrics' states (in `local` or
  /// metric_states_) and the gathered optimizer states (none when sharded into files).
  TrainingParts parts_for_save(const std::string& path, std::optional<StateDict>& local);
  /// The registered metrics' states for a checkpoint saved now, in `local` or metric_states_;
  /// nullptr when the module registered none, or (with a warning) when they were not gathered.
  const StateDict* metric_states_for_save(std::optional<StateDict>& local);
  /// The optimizers' gathered states for a checkpoint saved now (nullptr without state sharding
  /// or under sharded checkpoints); throws volt::Error when they were not gathered at this point.
  const std::vector<c10::IValue>* optimizer_states_for_save(const std::string& path) const;
  /// Throws volt::Error naming `path` when a checkpoint saved now would need states that are
  /// gathered (or taken for the shards) only at a gather point, and none came before it.
  void check_gathered_for_save(const std::string& path) const;
  /// Rank 0, sharded checkpoints: builds the checkpoint of `parts` for `path`, without optimizer
  /// states and the parameters kept in pieces, to be committed by commit_sharded_saves.
  void defer_sharded_save(const std::string& path, TrainingParts parts, CheckpointContents contents);
  /// Sharded checkpoints, on every process: writes this process's shard of each checkpoint rank 0
  /// built since the gather point, then rank 0 commits each by writing its file with the shard
  /// index, and removes what waited for the commit. `from_callbacks`: the saves of a dispatch,
  /// announced to the loggers once committed and, under async_checkpointing, written in the
  /// background (after the write in flight is committed, every process copies its shard, and rank
  /// 0 the files' contents, to host memory and its writer writes them; the commit follows at a
  /// later boundary: advance_sharded_write). Else an HPC save: at once, and not announced, as a
  /// full HPC checkpoint is not.
  void commit_sharded_saves(bool from_callbacks);
  /// commit_sharded_saves' background form, once rank 0's `plan` reached every process.
  void write_sharded_saves_in_background(const ShardedCommitPlan& plan);
  void note_saved(const std::string& path);
  /// The background writer, started at its first use.
  AsyncWriter& writer();
  /// Rank 0, async_checkpointing: copies the checkpoint of `parts` with `contents` to host memory
  /// and has the writer write it to `path`. A full checkpoint holds the tensors a snapshot holds, in the same order: it
  /// goes into the snapshots' buffers (pinned for a GPU's tensors and copied without blocking; no fresh pages), free
  /// once the writes before it are done. A weights-only one, shorter, is copied afresh.
  void save_in_background(const TrainingParts& parts, const std::string& path, CheckpointContents contents);
  /// Tells the loggers of the files written in the background since the last call (the writer is
  /// idle): a logger that uploads checkpoints reads only complete files.
  void announce_written();
  /// Rank 0, the snapshot peer and (sharded) every process, main thread, writer idle: finds the memory tier's
  /// folder at the first snapshot (removing what earlier runs left) and warns once if a write to it failed.
  void prepare_memory_tier();
  /// Writer thread: keeps snapshot `number` in the memory tier; a failure drops the tier.
  void keep_in_memory(int64_t number, const std::vector<char>& bytes);
  /// Writer thread: keeps the file `name` (a shard, a pending index) in the memory tier; a failure
  /// drops the tier.
  void keep_file_in_memory(const std::string& name, const std::vector<char>& bytes);
  /// Whether this process keeps rank 0's snapshots for it (options.snapshot_peer_rank).
  bool is_snapshot_peer() const;
  /// Rank 0 and the peer, main thread, at their first snapshot: connects the two (they reach it
  /// at the same step); a warning when the collectives offer no channel.
  void connect_snapshot_peer();
  /// Sharded snapshots copied to peers, every process, main thread, at the first snapshot:
  /// connects to the processes it sends to (the next node's) and receives from (the previous
  /// node's; the same one on two nodes). Even nodes connect forwards first, odd ones backwards, so
  /// that the ring of pairwise connections never waits in a circle.
  void connect_shard_peers();
  /// Warns, once, of the failed transfer that ended the copies to another node.
  void warn_of_peer_failure();
  /// Whether this process copies its shards of sharded snapshots to the next node's process.
  bool copies_shards() const;
  /// The rank whose shards this process keeps copies of (the previous node's, same local rank).
  int64_t shard_copy_source() const;
  /// Writer thread: sends this process's shard `bytes` of snapshot `number` (and rank 0's `index`)
  /// to the next node's process, and keeps what the previous node's process sends in this node's
  /// memory tier; even nodes send first, odd nodes receive first. A failed transfer ends the
  /// copies as send_to_peer's does.
  void exchange_shard_copies(const std::string& path, const std::string& save_id, int64_t number,
                             const std::vector<char>& bytes, const std::vector<char>& index);
  /// Writer thread: rank 0 sends snapshot `number` to the peer and waits for its answer; the peer
  /// receives one, keeps it in its memory tier and answers. A failed transfer ends the copies with a warning at the
  /// next snapshot: the other end failed too (its process is gone), and the run goes on without them.
  void send_to_peer(int64_t number, const std::vector<char>& bytes);
  void receive_from_rank0();
  void restore_metric_states(const c10::IValue& checkpoint, const std::string& path, const FitProgress& restored);
  /// Sharded checkpoints, every process, after gather(): copies this process's shard of the
  /// snapshot rank 0 numbers (and, on rank 0, the snapshot file's contents) to host memory; the
  /// writer puts it into the memory tier and, once committed there, writes its file.
  void save_sharded_snapshot(const std::function<std::string()>& next_path, bool die_mid_write);
  /// Adds the copy to host memory that began at `start` to snapshot_stats_ (the first one apart).
  void count_snapshot_copy(std::chrono::steady_clock::time_point start);
  /// Rank 0: has the writer write each file of the sharded write with its shard index (every shard
  /// is on disk), then prune the older snapshots (a snapshot's) and remove what waited for the
  /// commit. Every process forgets the write.
  void commit_sharded_write();
  /// Every shard of the sharded snapshot is in its node's memory tier: rank 0 renames its pending
  /// index into place there (the snapshot is resumable from memory from now on), every process
  /// removes its memory files of older snapshots, and the writers go on to the files. Once per
  /// snapshot.
  void commit_sharded_snapshot_in_memory();
  /// Writer thread: shard_stage_ = `stage` (-1: the write failed), told to a waiting thread.
  void set_shard_stage(int stage);
  /// Lets the writer go on to the shard's file (the commit in memory, or the end of the fit).
  void open_shard_gate();

  FitCheckpointsOptions options_;
  Strategy& strategy_;
  StateSharding* sharding_;
  Checkpointer& checkpointer_;
  MetricRouter& metrics_;
  Console& console_;
  TrainingParts parts_;
  const FitProgress& progress_;

  std::string last_saved_;
  // The checkpoints saved during on_train_end, printed with where the fit stopped; unset outside it.
  std::optional<std::vector<std::string>> train_end_saves_;
  // Every process's metric states, gathered for the dispatch that follows.
  std::optional<StateDict> metric_states_;
  bool warned_metric_states_ = false;
  // The optimizers' whole states (state sharding), gathered with metric_states_; reset at the next
  // gather point, so a checkpoint never holds the state of an earlier step.
  std::optional<std::vector<c10::IValue>> optimizer_states_;
  // Sharded checkpoints: this process's shard, taken at the gather point for the saves that follow.
  struct LocalShard {
    std::vector<c10::IValue> optimizer_states;
    ParameterPieces parameters;
  };
  std::optional<LocalShard> local_shard_;
  // Rank 0, sharded checkpoints: the saves since the gather point, built but not yet committed.
  struct PendingSave {
    std::string path;
    StateDict checkpoint;
    bool weights_only = false;  // its shards hold only the parameters' pieces
  };
  std::vector<PendingSave> pending_saves_;
  // Rank 0, sharded checkpoints: checkpoints to remove once pending_saves_ are committed.
  std::vector<std::string> pending_removals_;
  // Snapshots: the number of the next one (0: not known yet), their costs so far, and the host
  // memory rank 0 copies them (and, under async_checkpointing, full checkpoints) into.
  int64_t next_snapshot_number_ = 0;
  SnapshotStats snapshot_stats_;
  HostBuffers snapshot_buffers_;
  // Writer thread: the archive of the snapshot (or shard) being written, serialized once for the
  // memory tier, the peer and the file, and rank 0's index of a sharded snapshot (the whole model
  // under shard_grad_op); kept from one snapshot to the next, as the host buffers are, so that
  // serializing writes into pages already there (save_to_bytes).
  std::vector<char> serialized_;
  std::vector<char> serialized_index_;
  // Rank 0, the snapshot peer and, under sharded checkpoints, every process: the memory tier's
  // folder ("" none or dropped), whether it was looked for, and why a write to it failed (set by
  // the writer thread, read once the writer is idle or past its memory writes).
  std::string memory_dir_;
  bool memory_prepared_ = false;
  std::string memory_failure_;
  // A sharded write whose shards are being written, not committed to the files yet: a snapshot, or
  // under async_checkpointing the saves of one dispatch. Its save, its files with (rank 0) the copy
  // of each file's contents with the index, the vote in flight on how far every process's shards
  // are (started at one step boundary, read at the next), and whether it was committed in memory.
  struct ShardedWrite {
    struct File {
      std::string path;
      c10::IValue checkpoint;  // rank 0: the file's contents, with the shard index
    };
    std::vector<File> files;
    std::string save_id;
    bool snapshot = false;
    int64_t number = 0;  // a snapshot's
    std::optional<ReduceWork> vote;
    // Committed in the memory tier: every shard is there, and rank 0's index. A callback's save has
    // no memory tier: true from the start.
    bool in_memory = false;
    std::vector<std::string> removals;  // rank 0: checkpoints to remove once the files are committed
  };
  std::optional<ShardedWrite> sharded_write_;
  // How far this process's writer is with its shards of sharded_write_: 0 copying, 1 in the
  // memory tier (or past it, without one), 2 on disk, -1 failed. Set by the writer thread, voted
  // on by this one. With a memory tier the writer waits at the gate between 1 and the file until
  // the commit in memory opens it.
  std::atomic<int> shard_stage_{0};
  std::mutex shard_gate_mutex_;
  std::condition_variable shard_gate_changed_;
  bool shard_gate_open_ = true;
  // Rank 0 and the snapshot peer (sharded: every process): their channel (nullptr: none, or ended by a failed transfer,
  // whose reason the writer thread leaves for the next snapshot to warn of) and whether the first
  // snapshot connected it.
  std::unique_ptr<PeerChannel> peer_;
  // Sharded snapshots on more than two nodes: peer_ leads to the next node's process, this one
  // from the previous node's (on two nodes peer_ does both).
  std::unique_ptr<PeerChannel> peer_back_;
  bool peer_connected_ = false;
  std::string peer_failure_;
  // Rank 0: files written in the background whose loggers have not heard of them yet.
  std::vector<std::string> written_unannounced_;
  // Rank 0, the snapshot peer and, under sharded checkpoints, every process: writes snapshots (and,
  // under async_checkpointing, checkpoints) in the background.
  // Declared last, so destroyed first: its queued tasks use the members above.
  std::unique_ptr<AsyncWriter> writer_;
};

}  // namespace volt
