// A training checkpoint's model weights as a safetensors file (`volt checkpoint to-safetensors`),
// for tools that read Hugging Face's format rather than torch.save archives (and for anyone who
// would rather not unpickle a file to get at its weights), or as a folder PyTorch 2.x's
// distributed checkpoint loads (`volt checkpoint to-dcp`), each process's pieces as they are.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "volt/checkpoint/safetensors.h"

namespace volt {

/// The "state_dict" of the checkpoint file at `path` (the module's parameters and buffers under the
/// names the checkpoint stores, in its order), as CPU tensors. A sharded checkpoint (strategy='fsdp',
/// state_dict_type='sharded') is consolidated first (consolidate_sharded_checkpoint: its shard files
/// must lie beside it, and the whole model must fit in memory).
///
/// Throws volt::CheckpointError naming `path` with a HINT when the file cannot be read, has no
/// "state_dict", or holds a value there that is not a tensor.
NamedTensors load_checkpoint_state_dict(const std::string& path);

/// Writes load_checkpoint_state_dict(`checkpoint`) to the safetensors file `out`, atomically, with
/// metadata {"format": "pt"} (what transformers and safetensors.torch expect). Returns the number of
/// tensors written. Throws what load_checkpoint_state_dict and save_safetensors throw.
size_t save_state_dict_as_safetensors(const std::string& checkpoint, const std::string& out);

/// A block of a tensor as PyTorch's distributed checkpoint describes a chunk: where it starts in
/// each dimension and its size there.
struct TensorBox {
  std::vector<int64_t> offsets;  ///< per dimension
  std::vector<int64_t> sizes;    ///< per dimension
  int64_t begin = 0;             ///< the row-major index of its first element in the whole tensor
  /// Its number of elements.
  int64_t numel() const;
};

/// The boxes that the row-major elements [begin, end) of a tensor of `shape` make, in order: a
/// partial first row, the whole rows, a partial last row, each partial one cut again in its own
/// dimensions (at most 2 (n - 1) + 1 boxes for n dimensions). Each box's elements are a contiguous
/// run of [begin, end), so fsdp's flat pieces become the chunks a distributed checkpoint holds.
/// Throws volt::Error when not 0 <= begin <= end <= the tensor's element count.
std::vector<TensorBox> flat_range_boxes(const std::vector<int64_t>& shape, int64_t begin, int64_t end);

/// The element ranges of the pieces of each tensor an export writes, checked at the end to tile
/// it exactly: a distributed checkpoint's reader would leave a gap's old values without a word.
class PieceCoverage {
 public:
  /// Elements [begin, end) of tensor `name`, which has `numel` elements.
  void add(const std::string& name, int64_t begin, int64_t end, int64_t numel);
  /// Throws volt::CheckpointError naming checkpoint `path` and the tensor, with a HINT, unless
  /// every tensor's pieces tile it and every name in `expected` (the sharded parameters) has some.
  void check(const std::string& path, const std::vector<std::string>& expected) const;

 private:
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> ranges_;
  std::map<std::string, int64_t> numels_;
};

/// Writes the state_dict of the checkpoint at `path` into the folder `out` in the layout PyTorch
/// 2.x's torch.distributed.checkpoint reads with HuggingFaceStorageReader: safetensors files whose
/// metadata "DCP_SHARDING_INFO" gives each tensor's offsets in the whole. The whole tensors go to
/// `model.safetensors`; the pieces of a sharded checkpoint's parameters (fsdp full_shard,
/// state_dict_type='sharded') stay as each process wrote them, cut into boxes (flat_range_boxes),
/// box k of process r in `shard<r>-<k>.safetensors`: nothing is consolidated, and dcp.load reshards
/// them for any world size. Names are the state_dict's, after `prefix` (e.g. "model." for
/// `dcp.load({"model": model.state_dict()}, ...)`). Returns the number of files written.
///
/// Throws volt::CheckpointError naming the file with a HINT when `out` already holds .safetensors
/// files (the reader would take them as more chunks), a shard is missing or does not match, or the
/// pieces of a parameter do not tile it exactly (the reader would not notice a gap).
size_t save_checkpoint_as_dcp(const std::string& path, const std::string& out, const std::string& prefix = "");

}  // namespace volt
