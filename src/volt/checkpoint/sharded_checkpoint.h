// The sharded checkpoint form (strategy='fsdp', state_dict_type='sharded'): every process writes
// its own shard of the optimizer state (and, under full_shard, its pieces of the units'
// parameters) to a file of its own, in parallel, and rank 0 then writes the checkpoint file itself
// with everything else and an index of the shards in place of "optimizer_states". Nothing is
// gathered on one process, so a model whose state does not fit one process still checkpoints.
//
// Complete or absent as a set: shard files are named after their save (a random id), all of them
// are on disk before rank 0 renames the checkpoint file into place (the commit), and a reader
// checks every shard against the index. A save interrupted before the commit leaves the previous
// checkpoint and its shards as they were; the orphaned shards are removed by the next commit of
// that path. consolidate_sharded_checkpoint turns the set into Volt's one-file form.
#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace volt {

class CheckpointIO;

/// The checkpoint key of the shard index (it replaces "optimizer_states").
inline constexpr const char* kShardIndexKey = "sharded_optimizer_states";
/// The checkpoint key listing the parameters whose values lie in the shard files (fsdp
/// full_shard's units, each process's piece in its own file) instead of in "state_dict".
inline constexpr const char* kShardedParametersKey = "volt_sharded_parameters";
/// The key of the marker a process's optimizer state carries in a shard (which process's piece
/// of which parameters, and which state fields are elementwise).
inline constexpr const char* kShardMarkerKey = "volt_shard";

/// Where `rank`'s shard of checkpoint `path` from save `save_id` lies: `<path>.<save_id>.shard<rank>`.
std::string shard_path(const std::string& path, const std::string& save_id, int64_t rank);

/// A fresh save id (16 hex digits from std::random_device); rank 0 draws it for all processes.
std::string new_save_id();

/// What the shard index of a checkpoint says.
struct ShardIndex {
  /// The save the shards belong to.
  std::string save_id;
  /// How many processes wrote shards (one file each).
  int64_t world_size = 0;
  /// The shard files' names, relative to the checkpoint's directory, by rank.
  std::vector<std::string> files;
  /// Whether the shards hold the optimizer states (false: a weights-only checkpoint's).
  bool optimizer_states = true;
};

/// The index rank 0 writes into the checkpoint at `path` for `world_size` shards of `save_id`;
/// `optimizer_states` false for a weights-only checkpoint, whose shards hold only parameters.
c10::IValue make_shard_index(const std::string& path, const std::string& save_id, int64_t world_size,
                             bool optimizer_states = true);

/// The shard index of `checkpoint`, or nullopt when it holds its optimizer states itself. Throws
/// volt::CheckpointError naming `path` when the index is malformed.
std::optional<ShardIndex> read_shard_index(const c10::IValue& checkpoint, const std::string& path);

/// What a process's optimizer state in a shard says about itself (kShardMarkerKey): which
/// process's pieces these are, of parameters shaped how, and which state fields are cut
/// element by element. Written by fsdp, checked when it loads, read by consolidation.
struct ShardMarker {
  /// The process whose pieces these are.
  int64_t rank = 0;
  /// How many processes the state was cut for.
  int64_t world_size = 0;
  /// Each of the optimizer's parameters' shapes, in its parameter order; nullopt for one that is
  /// kept whole (it does not train).
  std::vector<std::optional<std::vector<int64_t>>> shapes;
  /// The state fields cut element by element (exp_avg, momentum_buffer, ...).
  std::vector<std::string> elementwise;
  /// Each parameter's elements [begin, end) that this process holds ({0, 0} for one kept whole),
  /// which depend on how the parameters were grouped (shard_grad_op's one flat buffer, full_shard's
  /// one per unit). Empty in shards written before Volt recorded it: not checked then.
  std::vector<std::pair<int64_t, int64_t>> pieces;
};

/// `optimizer_state` (an optimizer.state_dict() layout) with `marker` added.
c10::IValue mark_shard(const c10::IValue& optimizer_state, const ShardMarker& marker);

/// The marker of `optimizer_state` and the state without it; nullopt marker for an unmarked
/// (whole) state, returned as it is.
std::pair<std::optional<ShardMarker>, c10::IValue> split_shard_marker(const c10::IValue& optimizer_state);

/// A process's piece of one parameter in a shard: its elements [begin, end) in row-major order.
struct ParameterPiece {
  /// The elements, flat (empty when this process holds none of the parameter).
  at::Tensor values;
  /// The whole parameter's shape.
  std::vector<int64_t> shape;
  /// Which elements of the whole these are.
  int64_t begin = 0;
  int64_t end = 0;
};

/// Parameters' pieces by name, as a shard holds them.
using ParameterPieces = std::map<std::string, ParameterPiece>;

/// `pieces` as a shard file holds them (a dict by name).
c10::IValue make_parameter_pieces(const ParameterPieces& pieces);

/// The pieces a shard file (`file`) holds; an empty map for none. Throws volt::CheckpointError
/// with a HINT when they are malformed.
ParameterPieces read_parameter_pieces(const c10::IValue& value, const std::string& file);

/// A shard file's contents: `rank`'s optimizer states (one per optimizer, each carrying its
/// kShardMarkerKey) and its pieces of the sharded parameters (make_parameter_pieces; an empty dict
/// when none are) for save `save_id` of `world_size` processes.
c10::IValue make_shard(const std::vector<c10::IValue>& optimizer_states, const c10::IValue& parameters,
                       const std::string& save_id, int64_t rank, int64_t world_size);

/// What one process's shard file holds.
struct Shard {
  /// Its optimizer states, one per optimizer (none in a weights-only checkpoint's shard).
  std::vector<c10::IValue> optimizer_states;
  /// Its pieces of the parameters listed under kShardedParametersKey (none under shard_grad_op).
  ParameterPieces parameters;
};

/// `rank`'s shard of the checkpoint at `path` (whose index is `index`), read through `io`. Throws
/// volt::CheckpointError with a HINT when the file is missing, unreadable, or belongs to another
/// save, rank or process count.
Shard load_shard(CheckpointIO& io, const std::string& path, const ShardIndex& index, int64_t rank);

/// Where `rank`'s shard of the checkpoint at `path` (with `index`) lies: beside it, or else in the
/// first of `folders` ("" skipped) that holds a file of its name. A snapshot read from another
/// node's memory tier finds this process's shard in its own node's tier or among the files so.
/// Returns the path to give load_shard for it (the checkpoint's file name in that folder), or
/// nullopt when none holds it. Looks through `io`, and the file system for what `io` lacks.
std::optional<std::string> locate_shard(const CheckpointIO& io, const std::string& path, const ShardIndex& index,
                                        int64_t rank, const std::vector<std::string>& folders);

/// Removes the shard files of `path` except those of `keep_save_id` ("" removes all of them).
/// Needs CheckpointIO::list; an IO that lists nothing leaves them.
void remove_shards(CheckpointIO& io, const std::string& path, const std::string& keep_save_id);

/// The sharded checkpoint at `path` in Volt's one-file form: every shard read through `io`, each
/// optimizer's elementwise state (exp_avg, momentum_buffer, ...) and each sharded parameter
/// concatenated back into whole tensors, as strategy='fsdp' with state_dict_type='full' would
/// have written it. So a run resumes
/// it under any strategy and process count, and Python reads its optimizer states. Needs memory
/// for the whole state: run it where that fits. Throws volt::CheckpointError for a shard missing
/// or not matching.
c10::IValue consolidate_sharded_checkpoint(CheckpointIO& io, const std::string& path);

}  // namespace volt
