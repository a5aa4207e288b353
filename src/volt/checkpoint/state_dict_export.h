// A training checkpoint's model weights as a safetensors file: `volt checkpoint to-safetensors`,
// for tools that read Hugging Face's format rather than torch.save archives (and for anyone who
// would rather not unpickle a file to get at its weights).
#pragma once

#include <string>

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

}  // namespace volt
