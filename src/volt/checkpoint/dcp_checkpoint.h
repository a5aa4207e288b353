// PyTorch's distributed checkpoints read by Volt: a folder that torch.distributed.checkpoint's
// default writer filled (dcp.save(state, checkpoint_id=folder): `.metadata` plus
// `__<rank>_<n>.distcp` files), at any world size, from FSDP or plain models. Each tensor is
// assembled from the pieces the saving processes held, so Volt reads it at its own world size.
// The other direction (Volt's checkpoints for dcp.load) is state_dict_export.h.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "volt/checkpoint/weight_source.h"

namespace volt {

/// One saved piece of a tensor: the box [offsets, offsets + sizes) of the whole, stored as a
/// torch.save archive at bytes [offset, offset + length) of `file` (relative to the folder).
struct DcpChunk {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  std::string file;
  int64_t offset = 0;
  int64_t length = 0;
};

/// A tensor of a distributed checkpoint: its whole size and dtype, and the pieces it was saved in.
struct DcpTensor {
  std::vector<int64_t> size;
  at::ScalarType dtype = at::kFloat;
  std::vector<DcpChunk> chunks;
};

/// A distributed checkpoint folder written by PyTorch 2.x. Names are DCP's flattened state-dict
/// keys: with `dcp.save({"model": model_sd, "optim": optim_sd})`, "model.fc1.weight",
/// "optim.state.fc1.weight.exp_avg", "optim.param_groups.0.lr". Nothing is imported or executed
/// from its pickles (plain_unpickler.h).
class DcpCheckpoint {
 public:
  /// Reads `dir`/.metadata. Throws volt::CheckpointError naming the folder, with a HINT, when
  /// there is none (or it is not one Volt reads) or when a tensor's pieces do not tile it.
  static DcpCheckpoint open(const std::string& dir);

  /// The folder.
  const std::string& dir() const { return dir_; }
  /// The tensors' names, sorted.
  std::vector<std::string> tensor_names() const;
  /// The names of the non-tensor values (an optimizer's param_groups fields), sorted.
  std::vector<std::string> value_names() const;
  /// Tensor `name`'s size, dtype and pieces; throws volt::CheckpointError naming it (and a
  /// HINT with names the checkpoint holds) when there is no such tensor.
  const DcpTensor& tensor(const std::string& name) const;
  /// Tensor `name` whole, assembled from its pieces (CPU). Throws volt::CheckpointError when a
  /// piece is missing from its file or does not have its box's shape and the dtype.
  at::Tensor read(const std::string& name) const;
  /// Non-tensor value `name` (a torch.save of a Python value, read as torch.load reads it).
  c10::IValue read_value(const std::string& name) const;

 private:
  std::string dir_;
  std::map<std::string, DcpTensor> tensors_;
  std::map<std::string, DcpChunk> values_;
};

/// The weights of a distributed checkpoint, as initial weights for a fit (fine-tuning a model
/// PyTorch trained with FSDP): parameter `p` is the checkpoint's tensor `<prefix>p`. A missing
/// name or a shape that differs is an error naming both, as for Volt's own checkpoints.
class DcpWeights : public WeightSource {
 public:
  /// The tensors of `checkpoint` named `prefix` + a parameter's name ("model." for
  /// dcp.save({"model": ...}); "" for a state dict saved as it is).
  explicit DcpWeights(DcpCheckpoint checkpoint, std::string prefix = "model.");
  /// "the distributed checkpoint <dir>".
  std::string describe() const override;
  /// Elements [begin, end) of the parameter, flat. Reads the tensor once for all its ranges.
  at::Tensor read(const std::string& name, const std::vector<int64_t>& shape, int64_t begin, int64_t end) override;

 private:
  DcpCheckpoint checkpoint_;
  std::string prefix_;
  std::string cached_name_;
  at::Tensor cached_;
};

}  // namespace volt
