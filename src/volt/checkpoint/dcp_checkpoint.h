// PyTorch's distributed checkpoints read by Volt: a folder that torch.distributed.checkpoint's
// default writer filled (dcp.save(state, checkpoint_id=folder): `.metadata` plus
// `__<rank>_<n>.distcp` files), at any world size, from FSDP or plain models. Each tensor is
// assembled from the pieces the saving processes held, so Volt reads it at its own world size.
// Trainer::fit resumes from such a folder (its model and optimizer state, dcp_training_checkpoint);
// a module fine-tunes from its weights (DcpWeights).
// The other direction (Volt's checkpoints for dcp.load) is dcp_writer.h.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
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

/// The checkpoint key that marks a value converted from another framework's checkpoint (what
/// dcp_training_checkpoint returns) and names its source. Such a value holds weights and optimizer
/// states only, no loops, callbacks, schedulers or RNG state, so restore_checkpoint resumes it at
/// epoch 0 instead of asking for what it cannot have.
inline constexpr const char* kConvertedFromKey = "volt_converted_from";

/// The dtypes a distributed checkpoint's `.metadata` names as `torch.<name>` globals, each with
/// its ScalarType: PyTorch's canonical names first, then their aliases (torch.float is
/// torch.float32). The one list the unpickler admits, the reader maps and the writer names from.
const std::vector<std::pair<std::string, at::ScalarType>>& dcp_dtype_names();

/// Whether `path` is a folder torch.distributed.checkpoint's default writer filled (it holds a
/// `.metadata` file): what ckpt_path accepts besides Volt's and Lightning's checkpoint files.
bool is_dcp_checkpoint(const std::string& path);

/// The optimizer state a distributed checkpoint holds under `prefix` (dcp.save({"optim":
/// get_optimizer_state_dict(model, optimizer)}): "optim.state.<parameter>.<field>" tensors and
/// "optim.param_groups.<g>.<field>" values) in PyTorch's `optimizer.state_dict()` layout, the one
/// Volt's checkpoints hold (optimizer_state.h), so the same loader checks and restores it:
///
///     {"state": {0: {"step": tensor(2.), "exp_avg": ..., "exp_avg_sq": ...}, 1: {...}},
///      "param_groups": [{"lr": 0.01, "betas": (0.9, 0.999), ..., "params": [0, 1]}, ...]}
///
/// Parameters are numbered across groups in the order of each group's "params" list of names, as
/// PyTorch numbers them. There is no "volt_optimizer" kind (the loader then checks the fields), and
/// the groups keep every field PyTorch saved (the loader reads those its optimizer has). Throws
/// volt::CheckpointError, with a HINT, when there is no optimizer state under `prefix` or its
/// parts do not fit together (no param_groups, state of a parameter no group lists, ...).
c10::IValue dcp_optimizer_state_dict(const DcpCheckpoint& checkpoint, const std::string& prefix = "optim.");

/// A distributed checkpoint as the checkpoint value Trainer::fit resumes from (ckpt_path = the
/// folder) and validate/test load weights from: "state_dict" holds the "model." tensors (named
/// without the prefix), "optimizer_states" the one optimizer of dcp_optimizer_state_dict (left out
/// when the checkpoint has no "optim." entries), "global_step" the optimizer's step count (the
/// largest per-parameter `step`; 0 without one) and kConvertedFromKey the folder. Throws
/// volt::CheckpointError when it holds no "model." tensors.
c10::IValue dcp_training_checkpoint(const DcpCheckpoint& checkpoint);

namespace internal {
/// dcp_optimizer_state_dict over entries already read: `items` maps each flattened key without
/// the prefix ("state.fc1.weight.exp_avg", "param_groups.0.lr") to its tensor or value; `what`
/// names the source in errors. Apart from the folder so that tests can give any combination.
c10::IValue dcp_unflatten_optimizer_state(const std::map<std::string, c10::IValue>& items, const std::string& what);
}  // namespace internal

}  // namespace volt
