// What a strategy that shards the training state over its processes (fsdp) adds for checkpoints.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "volt/checkpoint/sharded_checkpoint.h"

namespace c10 {
struct IValue;
}  // namespace c10
namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace volt {

/// The checkpoint side of a strategy whose optimizers hold only this process's shard of the state
/// and gradients (fsdp's shard_grad_op and full_shard; Strategy::state_sharding returns it). A
/// checkpoint then needs the state gathered (a full one) or each process's piece (a sharded one),
/// and a restore cuts a whole state to this process's pieces.
class StateSharding {
 public:
  virtual ~StateSharding() = default;
  /// Collective: every optimizer's state as one process would hold it (PyTorch's
  /// optimizer.state_dict() layout), complete on global rank 0 and empty elsewhere. fsdp also
  /// makes full_shard's units whole, so a full checkpoint reads the model.
  virtual std::vector<c10::IValue> gather_optimizer_states(
      const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) = 0;
  /// This process's own optimizer states, for a sharded checkpoint (state_dict_type='sharded'):
  /// its pieces, each state marked (kShardMarkerKey) with the process and the parameters' shapes,
  /// so a load checks them and consolidate_sharded_checkpoint reassembles them. No collective.
  virtual std::vector<c10::IValue> local_optimizer_states(
      const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) = 0;
  /// True when some trained parameters are only this process's piece between steps (fsdp
  /// full_shard's units): the module's weights can be read for a checkpoint only at a gather point,
  /// where they are made whole (gather_optimizer_states) or each process takes its pieces.
  virtual bool shards_parameters() const = 0;
  /// This process's pieces of the parameters that shards_parameters keeps in pieces, for its shard
  /// of a sharded checkpoint (rank 0's file leaves them out). No collective.
  virtual ParameterPieces local_parameter_pieces() = 0;
  /// Loads `pieces` (this process's shard of checkpoint `path`, as local_parameter_pieces took
  /// them) into the parameters. Throws volt::CheckpointError with a HINT when they are not this
  /// process's pieces of the parameters laid out here. A collective under fsdp's full_shard: call
  /// it on every process.
  virtual void load_parameter_pieces(const ParameterPieces& pieces, const std::string& path) = 0;
  /// Loads `state` (as gather_optimizer_states returns it, a sharded checkpoint's piece, or a
  /// checkpoint of an unsharded run) into `optimizer`, cut to this process's pieces. No collective.
  virtual void load_optimizer_state(torch::optim::Optimizer& optimizer, const c10::IValue& state) = 0;
  /// The module's name of the parameter whose piece `optimized` is (a tensor an optimizer holds
  /// in its place); nullopt for any other tensor, such as a parameter kept whole, which is the
  /// module's own. What names an optimizer's parameters in a checkpoint (make_checkpoint).
  virtual std::optional<std::string> parameter_name(const torch::Tensor& optimized) const { return std::nullopt; }
};

}  // namespace volt
