// Volt's checkpoints written as PyTorch's own distributed checkpoint (`volt checkpoint to-dcp`):
// the layout torch.distributed.checkpoint's default writer makes (`.metadata`, a pickle of its
// Metadata, and `__<rank>_0.distcp` files of torch.save archives), so that `dcp.load(state,
// checkpoint_id=folder)` reads the model and the optimizer state into plain or FSDP2 models at any
// world size, and `torch.distributed.checkpoint.format_utils.dcp_to_torch_save` consolidates it.
// A sharded fsdp checkpoint's pieces stay as each process wrote them. The other direction is
// dcp_checkpoint.h; the Hugging Face safetensors layout of the same export is state_dict_export.h.
#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "volt/checkpoint/dcp_checkpoint.h"

namespace volt {

/// The checkpoint key under which make_checkpoint lists, per optimizer, the names of its
/// parameters in its own order (across groups, as its state numbers them): what ties an
/// optimizer's state to the model's parameters by name, as PyTorch's distributed checkpoint and
/// its `get_optimizer_state_dict` key it. Absent when some parameter is not one of the module's.
inline constexpr const char* kOptimizerParameterNamesKey = "volt_optimizer_parameter_names";

/// One entry of a distributed checkpoint as its `.metadata` describes it.
struct DcpEntry {
  /// Its flattened key ("model.fc1.weight", "optim.param_groups.0.lr").
  std::string name;
  /// Its place in the nested state dict (strings and list indices: {"optim", "param_groups", 0,
  /// "lr"}), which dcp_to_torch_save rebuilds the nesting from.
  std::vector<c10::IValue> path;
  /// A tensor's size, dtype and saved pieces; unset for a non-tensor value.
  std::optional<DcpTensor> tensor;
  /// A non-tensor value's place (its offsets and sizes unused).
  DcpChunk value;
};

/// The bytes of a `.metadata` file describing `entries`: a protocol-2 pickle of
/// torch.distributed.checkpoint.metadata.Metadata (TensorStorageMetadata or BytesStorageMetadata
/// per entry, a MetadataIndex to _StorageInfo map, planner_data from each entry's path), which
/// Python's pickle.load turns into PyTorch's own classes and DcpCheckpoint::open reads back.
std::vector<char> dcp_metadata_pickle(const std::vector<DcpEntry>& entries);

/// Writes the checkpoint file at `path` (a Volt or Lightning one; a sharded fsdp one with its shard
/// files beside it) into the folder `out` as PyTorch 2.x's `dcp.save({"model":
/// get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizers)})` would:
/// "model.<name>" for its state_dict, "optim.state.<parameter>.<field>" and
/// "optim.param_groups.<g>.<field>" for its optimizers' states (several optimizers merged as
/// get_optimizer_state_dict merges them; PyTorch 2.x's group fields that LibTorch lacks, such as
/// `foreach`, at their defaults). Each process's pieces go into its own `__<rank>_0.distcp`, cut
/// into boxes (flat_range_boxes); nothing is consolidated. `.metadata` is written last, so a folder
/// without it is no checkpoint, and an export that fails removes the files it wrote. One process's
/// shard and file are in memory at a time. Returns the number of entries written.
///
/// Throws volt::CheckpointError naming the file, with a HINT, when `out` already holds a
/// distributed checkpoint, a shard is missing or its pieces do not tile a tensor, or the checkpoint
/// has optimizer states but no parameter names for them (kOptimizerParameterNamesKey; written
/// before Volt recorded them) and `weights_only` is false.
size_t save_checkpoint_as_dcp_native(const std::string& path, const std::string& out, bool weights_only = false);

}  // namespace volt
