#include "volt/checkpoint/state_dict_export.h"

#include <ATen/core/ivalue.h>

#include <optional>
#include <string>

#include "volt/checkpoint/checkpoint_io.h"
#include "volt/checkpoint/sharded_checkpoint.h"
#include "volt/core/error.h"

namespace volt {

NamedTensors load_checkpoint_state_dict(const std::string& path) {
  c10::IValue checkpoint = load_checkpoint_file(path);
  if (!checkpoint.isGenericDict()) {
    throw CheckpointError(
        fmt::format("{} holds a {}, not a checkpoint (a dict with a \"state_dict\"). HINT: pass a .ckpt file a Volt "
                    "(or Lightning) Trainer wrote.",
                    path, checkpoint.tagKind()));
  }
  if (read_shard_index(checkpoint, path)) {
    TorchCheckpointIO io;
    checkpoint = consolidate_sharded_checkpoint(io, path);
  }
  const c10::Dict<c10::IValue, c10::IValue> dict = checkpoint.toGenericDict();
  const auto state = dict.find("state_dict");
  if (state == dict.end() || !state->value().isGenericDict()) {
    throw CheckpointError(fmt::format(
        "{} has no \"state_dict\" dict: it holds no model weights. HINT: pass a checkpoint the Trainer saved "
        "(ModelCheckpoint, or Trainer::save_checkpoint), not a file of other values.",
        path));
  }
  NamedTensors out;
  for (const auto& item : state->value().toGenericDict()) {
    if (!item.key().isString() || !item.value().isTensor()) {
      throw CheckpointError(fmt::format(
          "{}: state_dict entry {} is a {}, not a tensor. HINT: a state_dict maps parameter and buffer names "
          "to tensors; was this file written by a Volt or Lightning Trainer?",
          path, item.key().isString() ? "'" + item.key().toStringRef() + "'" : item.key().tagKind(),
          item.value().tagKind()));
    }
    out.emplace_back(item.key().toStringRef(), item.value().toTensor());
  }
  return out;
}

size_t save_state_dict_as_safetensors(const std::string& checkpoint, const std::string& out) {
  const NamedTensors tensors = load_checkpoint_state_dict(checkpoint);
  save_safetensors(out, tensors, {{"format", "pt"}});
  return tensors.size();
}

}  // namespace volt
