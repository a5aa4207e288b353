// Fully sharded data parallel, shard_grad_op (ZeRO-2): every process holds the whole model for
// forward and backward, but gradients and optimizer state are split evenly over the processes,
// so the optimizer's memory (Adam: twice the parameters) shrinks to 1/N per process.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "volt/strategies/ddp_strategy.h"
#include "volt/strategies/shard_layout.h"

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace volt {

/// Bytes a process holds for training: what fsdp shards and ddp replicates.
struct TrainingMemory {
  /// The module's parameters (whole under ddp and shard_grad_op).
  int64_t parameters = 0;
  /// Gradients: the module's parameters' and, under fsdp, the optimizers' pieces'.
  int64_t gradients = 0;
  /// The optimizers' state tensors (Adam: exp_avg and exp_avg_sq).
  int64_t optimizer_state = 0;
};

/// What this process holds now for `module` and its `optimizers` (for memory reports; it reads
/// every optimizer's state, so call it between steps).
TrainingMemory training_memory(const torch::nn::Module& module,
                               const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers);

/// Lightning's `strategy="fsdp"` with sharding_strategy `shard_grad_op` (or `no_shard`, which
/// is ddp under this name).
///
/// The trained parameters live in one flat buffer (each module parameter a view of its place).
/// Each step: backward accumulates whole gradients locally into views of a second flat buffer
/// (no communication on accumulation steps), after_backward reduce-scatters their average so
/// that each process receives the gradients of its chunk (and frees the whole ones), the
/// optimizers update only this process's pieces (views of its chunk), and after_optimizer_step
/// all-gathers the chunks into the flat buffer so every process holds the updated model.
/// When the trained set changes (a callback unfreezes a layer, BackboneFinetuning adds a param
/// group), sync_trainable_parameters lays out the new set, keeping the optimizers' state.
/// Checkpoints hold the whole optimizer state, gathered on rank 0, in the layout one process
/// writes, so a run resumes under any strategy and process count.
class FsdpStrategy : public DdpStrategy {
 public:
  /// `shard` false is no_shard: exactly DdpStrategy.
  FsdpStrategy(Topology topology, DdpOptions options, Env env, bool shard);

  std::string name() const override { return "fsdp"; }
  void setup_module(LightningModule& module) override;
  void setup_optimizers(LightningModule& module,
                        const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) override;
  void sync_trainable_parameters(LightningModule& module) override;
  void before_backward(const torch::Tensor& loss, bool synchronize) override;
  void after_backward(bool synchronize) override;
  void after_optimizer_step() override;
  bool shards_optimizer_state() const override { return shard_; }
  std::vector<c10::IValue> gather_optimizer_states(
      const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) override;
  std::vector<c10::IValue> local_optimizer_states(
      const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) override;
  /// Cuts a whole state to this process's pieces; a state marked by local_optimizer_states (a
  /// sharded checkpoint's) is loaded as it is, after checking it is this process's pieces of
  /// parameters shaped as here.
  void load_optimizer_state(torch::optim::Optimizer& optimizer, const c10::IValue& state) override;

 private:
  /// One optimized parameter: the module's tensor and this process's piece of it.
  struct Entry {
    std::string name;
    torch::Tensor param;
    torch::Tensor piece;
    ShardPiece range;
  };
  /// The index of `optimizer` in optimizers_ (an internal error when fsdp did not lay it out).
  size_t optimizer_index(const torch::optim::Optimizer& optimizer) const;
  /// Whether the layout covers every parameter the optimizers hold (no group added since).
  bool layout_current() const;
  /// Lays out the parameters that train now, keeping the optimizers' state (a collective).
  void relayout(LightningModule& module);
  /// Each optimizer's whole state (its pieces all-gathered), on every process when `everyone`,
  /// else on rank 0 (the others get none). A collective.
  std::vector<c10::IValue> whole_optimizer_states(bool everyone);
  /// Loads optimizer `k`'s whole `state` cut to this process's pieces.
  void load_whole_optimizer_state(size_t k, const c10::IValue& state);

  bool shard_;
  std::vector<Entry> entries_;
  std::optional<ShardLayout> layout_;
  /// The trained parameters end to end (padded); each module parameter is a view of its place.
  torch::Tensor params_flat_;
  /// Between before_backward and the synchronizing after_backward: the whole gradients, each
  /// module parameter's .grad a view of its place; undefined between steps.
  torch::Tensor grads_flat_;
  std::vector<std::shared_ptr<torch::optim::Optimizer>> optimizers_;
  /// For each optimizer, its parameter numbers (across groups) -> index into entries_ (nullopt:
  /// a parameter that does not train, kept whole).
  std::vector<std::vector<std::optional<size_t>>> ids_;
  /// The names of the parameters laid out (that trained at setup or the last relayout).
  std::vector<std::string> trainable_;
  /// The module laid out, for a relayout while a checkpoint loads.
  LightningModule* module_ = nullptr;
};

}  // namespace volt
