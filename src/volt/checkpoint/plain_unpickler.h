// A pickle reader for checkpoints: plain values and tensors, nothing else.
//
// LibTorch's own Unpickler (behind torch::pickle_load) cannot read what Python's torch.save writes
// for a module's state_dict in LibTorch 1.13: it turns `collections.OrderedDict` into None (it
// expects one only as a tensor's empty backward hooks) and then fails on the OrderedDict's items
// and its `_metadata` BUILD. Newer LibTorch releases differ again. This reader accepts the same
// subset as Python's `torch.load(weights_only=True)` restricted to plain values, behaves the same
// on every LibTorch version, and says which global or opcode it refused.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/core/Allocator.h>

#include <cstddef>
#include <functional>
#include <string>
#include <utility>

namespace volt::internal {

/// Returns the bytes of the archive's tensor record `key` (the "data/<key>" entry) and their size.
using ReadRecord = std::function<std::pair<at::DataPtr, size_t>(const std::string& key)>;

/// Unpickles the `data.pkl` of a torch.save archive into plain values: dicts (also
/// `collections.OrderedDict`) load as generic dicts, lists as generic lists, tuples as tuples,
/// and tensors (`torch._utils._rebuild_tensor_v2`, `_rebuild_parameter`) as CPU tensors whose
/// storages come from `read_record`; tensors that shared a storage still share it.
///
/// Throws volt::CheckpointError, starting with `what`, for any other global (a pickled class),
/// an unsupported opcode, or a stream that is cut short.
c10::IValue unpickle_plain(const char* data, size_t size, const ReadRecord& read_record, const std::string& what);

/// Unpickles the `.metadata` file of a PyTorch distributed checkpoint (torch.distributed.checkpoint,
/// FileSystemWriter): instances of its dataclasses (Metadata, TensorStorageMetadata,
/// ChunkStorageMetadata, TensorProperties, BytesStorageMetadata, MetadataIndex, StorageMeta,
/// _StorageInfo) load as generic dicts of their fields plus "__class__" (the class's name), with
/// TensorProperties' pickled tuple under "__state__"; `torch.Size` loads as a tuple of ints, a
/// dtype (`torch.float32`) as its name ("float32"), a path as a string, and a MetadataIndex
/// used as a dict key as the string "<fqn>@<offsets joined by commas>" ("<fqn>@" without one).
/// Any other global is refused: nothing is imported or called.
///
/// Throws volt::CheckpointError, starting with `what`, for another global, an unsupported
/// opcode, or a stream that is cut short.
c10::IValue unpickle_dcp_metadata(const char* data, size_t size, const std::string& what);

}  // namespace volt::internal
