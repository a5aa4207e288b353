// Fully sharded data parallel. shard_grad_op (ZeRO-2): every process holds the whole model for
// forward and backward, but gradients and optimizer state are split evenly over the processes,
// so the optimizer's memory (Adam: twice the parameters) shrinks to 1/N per process. full_shard
// (ZeRO-3): the parameters of each volt::FsdpUnit are split too, and gathered for the unit's
// forward and backward only.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "volt/options/option_enums.h"
#include "volt/strategies/ddp_strategy.h"
#include "volt/strategies/fsdp_unit.h"
#include "volt/strategies/shard_layout.h"
#include "volt/strategies/state_sharding.h"

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace volt {

/// Bytes a process holds for training: what fsdp shards and ddp replicates.
struct TrainingMemory {
  /// The module's parameters (whole under ddp and shard_grad_op; full_shard: the units' shards),
  /// each storage counted once.
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

/// What the fsdp strategy shards and how it groups parameters.
struct FsdpOptions {
  /// full_shard, shard_grad_op, or no_shard (ddp under this name).
  ShardingStrategy sharding = ShardingStrategy::kShardGradOp;
  /// full_shard's wrapping policy: a volt::FsdpUnit holding fewer parameter elements than this
  /// is not a unit of its own; its parameters go with the unit around it (or the model's).
  int64_t min_unit_params = 0;
};

/// Lightning's `strategy="fsdp"` with sharding_strategy `full_shard`, `shard_grad_op` or
/// `no_shard` (ddp under this name).
///
/// The trained parameters live in one flat buffer (each module parameter a view of its place).
/// Each step: backward accumulates whole gradients locally into views of a second flat buffer
/// (no communication on accumulation steps), after_backward reduce-scatters their average so
/// that each process receives the gradients of its chunk (and frees the whole ones), the
/// optimizers update only this process's pieces (views of its chunk), and after_optimizer_step
/// all-gathers the chunks into the flat buffer so every process holds the updated model.
/// When the trained set changes (a callback unfreezes a layer, BackboneFinetuning adds a param
/// group), sync_trainable_parameters lays out the new set, keeping the optimizers' state.
/// Full checkpoints hold the whole optimizer state, gathered on rank 0, in the layout one process
/// writes, so a run resumes under any strategy and process count; sharded ones a piece per process.
///
/// full_shard: the parameters of each volt::FsdpUnit (after the min_unit_params policy) get a
/// flat layout of their own. Each process keeps only its chunk (the optimizer's pieces view it);
/// the unit's hooks all-gather the whole into a buffer for its forward and free that buffer after,
/// a hook on the forward's output gathers it again before the unit's backward, and once autograd
/// has accumulated every gradient of the unit they are reduce-scattered into the pieces and the
/// buffer is freed (so at most the units in flight are whole). Parameters outside every unit train
/// as under shard_grad_op. Between gathers a unit's parameters are empty tensors; the strategy
/// makes them whole for full checkpoints and for whatever follows the fit, while a sharded
/// checkpoint takes each process's pieces as they are.
class FsdpStrategy : public DdpStrategy, private StateSharding {
 public:
  /// `fsdp.sharding` no_shard is exactly DdpStrategy.
  FsdpStrategy(Topology topology, DdpOptions options, Env env, FsdpOptions fsdp);
  ~FsdpStrategy() override;

  std::string name() const override { return "fsdp"; }
  void setup_module(LightningModule& module) override;
  void setup_optimizers(LightningModule& module,
                        const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) override;
  void sync_trainable_parameters(LightningModule& module) override;
  void before_forward(LightningModule& module) override;
  void before_backward(const torch::Tensor& loss, bool synchronize) override;
  void after_backward(bool synchronize) override;
  void after_optimizer_step() override;
  void finish_fit(LightningModule& module, bool completed) override;
  /// This strategy under shard_grad_op and full_shard; nullptr under no_shard (ddp).
  StateSharding* state_sharding() override { return shard_ ? this : nullptr; }

 private:
  /// Also makes every unit's parameters whole (full_shard), so the checkpoint reads the model.
  std::vector<c10::IValue> gather_optimizer_states(
      const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) override;
  /// Each optimizer's pieces, marked with this process and the parameters' shapes and ranges.
  std::vector<c10::IValue> local_optimizer_states(
      const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) override;
  /// full_shard with at least one unit.
  bool shards_parameters() const override { return groups_.size() > 1; }
  /// Each unit parameter's piece in this process's chunk (copies, so the next step does not
  /// change what is being saved).
  ParameterPieces local_parameter_pieces() override;
  /// Writes the pieces straight into the units' chunks (nothing is gathered to load them); units
  /// that are whole now (after setup) are gathered again from the loaded chunks.
  void load_parameter_pieces(const ParameterPieces& pieces, const std::string& path) override;
  /// Cuts a whole state to this process's pieces; a state marked by local_optimizer_states (a
  /// sharded checkpoint's) is loaded as it is, after checking it is this process's pieces of
  /// parameters shaped as here.
  void load_optimizer_state(torch::optim::Optimizer& optimizer, const c10::IValue& state) override;

  class UnitHooks;
  /// One optimized parameter: the module's tensor and this process's piece of it.
  struct Entry {
    std::string name;
    torch::Tensor param;
    torch::Tensor piece;
    /// The piece's place in its group's layout.
    ShardPiece range;
    /// Its group: 0 for the parameters outside every unit, else 1 + the unit's index.
    size_t group = 0;
    /// Its place in the group's layout (the index into Group::entries).
    size_t slot = 0;
    /// The parameter's shape (a unit's parameter is empty between gathers).
    std::vector<int64_t> shape;
  };
  /// Parameters laid out together: the model's outside every unit (group 0, whole on every
  /// process) or one full_shard unit's (whole only while gathered).
  struct Group {
    /// The unit; null for group 0.
    std::shared_ptr<FsdpUnitImpl> unit;
    /// Indexes into entries_.
    std::vector<size_t> entries;
    std::optional<ShardLayout> layout;
    /// The padded whole, each parameter a view of its place while gathered. A unit's keeps its
    /// storage object (autograd's saved views of the parameters point into it) but holds memory
    /// only while gathered.
    torch::Tensor full;
    /// A unit's chunk, owned (the pieces view it); group 0's chunk is a view of `full`.
    torch::Tensor shard;
    /// Each entry's view of `full`, shaped like its parameter (units).
    std::vector<torch::Tensor> views;
    /// Whether `full` holds the whole parameters now.
    bool gathered = true;
    /// Whether the whole was handed out for more than a forward or backward (after setup, for a
    /// checkpoint, a load or the end of fit), so that what was written into it must go back to the
    /// chunk when it is freed.
    bool handed_out = true;
    /// The units' autograd accumulators (each a pointer to its AccumulateGrad node: a shared_ptr,
    /// or an intrusive_ptr in newer LibTorch), held so the hooks added to them stay for every step.
    std::vector<std::shared_ptr<void>> accumulators;
    /// Gradients accumulated in this backward, and whether they were reduce-scattered already.
    size_t accumulated = 0;
    bool reduced = false;
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
  /// The units of `module` that full_shard lays out (after the min_unit_params policy), outermost
  /// first.
  std::vector<std::shared_ptr<FsdpUnitImpl>> find_units(LightningModule& module) const;
  /// Makes unit group `g`'s parameters whole (an all-gather of the chunks); nothing when they are.
  void gather_unit(size_t g);
  /// Frees unit group `g`'s whole parameters, first keeping this process's chunk of them when they
  /// were handed out (what a checkpoint loaded while they were whole is kept).
  void release_unit(size_t g);
  /// Makes every unit whole (a collective), until the next training forward.
  void gather_all_units();
  /// Adds `mine` (this process's reduced chunk of `group`'s gradients) to its pieces' gradients.
  void add_to_pieces(const torch::Tensor& mine, const Group& group);
  /// Reduce-scatters unit group `g`'s gradients into its pieces and frees its parameters.
  void reduce_unit(size_t g);
  /// Called when autograd accumulated a gradient of unit group `g`.
  void on_unit_gradient(size_t g);
  /// Detaches the hooks from every unit laid out.
  void detach_units();

  bool shard_;
  FsdpOptions fsdp_;
  std::vector<Entry> entries_;
  /// Group 0 (outside every unit), then the units in the order find_units gives.
  std::vector<Group> groups_;
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
  /// The hooks attached to the units; they hold a pointer to this strategy until detached.
  std::vector<std::shared_ptr<UnitHooks>> hooks_;
};

}  // namespace volt
