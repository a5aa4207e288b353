// Fully sharded data parallel. shard_grad_op (ZeRO-2): every process holds the whole model for
// forward and backward, but gradients and optimizer state are split evenly over the processes,
// so the optimizer's memory (Adam: twice the parameters) shrinks to 1/N per process. full_shard
// (ZeRO-3): the parameters of each volt::FsdpUnit are split too, and gathered for the unit's
// forward and backward only.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "volt/options/option_enums.h"
#include "volt/strategies/ddp_strategy.h"
#include "volt/strategies/flat_param_engine.h"
#include "volt/strategies/fsdp_unit.h"
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
  /// full_shard or shard_grad_op. (no_shard is ddp under fsdp's name: make_strategy builds a
  /// DdpStrategy for it, and FsdpStrategy refuses it.)
  ShardingStrategy sharding = ShardingStrategy::kShardGradOp;
  /// full_shard's wrapping policy: a volt::FsdpUnit holding fewer parameter elements than this
  /// is not a unit of its own; its parameters go with the unit around it (or the model's).
  int64_t min_unit_params = 0;
};

/// Lightning's `strategy="fsdp"` with sharding_strategy `full_shard` or `shard_grad_op` (its
/// `no_shard` is a DdpStrategy named "fsdp", built by make_strategy).
///
/// This class is the policy; a volt::FlatParamEngine does the work. The trained parameters live
/// in one flat buffer (each module parameter a view of its place). Each step: backward
/// accumulates whole gradients locally into views of a second flat buffer (no communication on
/// accumulation steps), after_backward reduce-scatters their average so that each process
/// receives the gradients of its chunk (and frees the whole ones), the optimizers update only this
/// process's pieces (views of its chunk), and after_optimizer_step all-gathers the chunks into the
/// flat buffer so every process holds the updated model. When the trained set changes (a callback
/// unfreezes a layer, BackboneFinetuning adds a param group), sync_trainable_parameters lays out
/// the new set, keeping the optimizers' state. Full checkpoints hold the whole optimizer state,
/// gathered on rank 0, in the layout one process writes, so a run resumes under any strategy and
/// process count; sharded ones a piece per process.
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
  /// Throws volt::Error for `fsdp.sharding` no_shard, which is a DdpStrategy (make_strategy).
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
  /// This strategy: its optimizers hold only this process's pieces.
  StateSharding* state_sharding() override { return this; }

 private:
  /// Also makes every unit's parameters whole (full_shard), so the checkpoint reads the model.
  std::vector<c10::IValue> gather_optimizer_states(
      const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) override;
  /// Each optimizer's pieces, marked with this process and the parameters' shapes and ranges.
  std::vector<c10::IValue> local_optimizer_states(
      const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) override;
  /// full_shard with at least one unit.
  bool shards_parameters() const override { return engine_ && engine_->shards_parameters(); }
  /// Each unit parameter's piece in this process's chunk (copies, so the next step does not
  /// change what is being saved).
  ParameterPieces local_parameter_pieces() override;
  /// The name of the parameter whose piece the optimizer holds as `optimized`.
  std::optional<std::string> parameter_name(const torch::Tensor& optimized) const override;
  /// Writes the pieces straight into the units' chunks (nothing is gathered to load them); units
  /// that are whole now (after setup) are gathered again from the loaded chunks.
  void load_parameter_pieces(const ParameterPieces& pieces, const std::string& path) override;
  /// Lays out a param group added since setup first (a resumed fine-tuning run), then cuts a whole
  /// state to this process's pieces, or loads a sharded checkpoint's after checking it is this
  /// process's pieces of parameters shaped as here.
  void load_optimizer_state(torch::optim::Optimizer& optimizer, const c10::IValue& state) override;

  class UnitHooks;
  /// What the policy attached to one unit group of the engine, and its progress in this backward.
  struct UnitState {
    std::shared_ptr<FsdpUnitImpl> unit;
    std::shared_ptr<UnitHooks> hooks;
    /// The unit's autograd accumulators (each a pointer to its AccumulateGrad node: a shared_ptr,
    /// or an intrusive_ptr in newer LibTorch), held so the hooks added to them stay for every step.
    std::vector<std::shared_ptr<void>> accumulators;
    /// Gradients accumulated in this backward, and whether they were reduce-scattered already.
    size_t accumulated = 0;
    bool reduced = false;
  };
  /// The engine, after setup_optimizers (an internal error before).
  FlatParamEngine& engine() const;
  /// The units of `module` that full_shard lays out (after the min_unit_params policy), outermost
  /// first; none under shard_grad_op.
  std::vector<std::shared_ptr<FsdpUnitImpl>> find_units(LightningModule& module) const;
  /// Lays out the parameters that train now, keeping the optimizers' state (a collective).
  void relayout(LightningModule& module);
  /// Attaches hooks to every unit group the engine laid out: gather around its forward, reduce
  /// once autograd accumulated all its gradients.
  void attach_units();
  /// Detaches the hooks from every unit laid out.
  void detach_units();
  /// Called when autograd accumulated a gradient of unit group `g`.
  void on_unit_gradient(size_t g);
  /// Reduce-scatters unit group `g`'s gradients into its pieces and frees its parameters.
  void reduce_unit(size_t g);

  FsdpOptions fsdp_;
  std::unique_ptr<FlatParamEngine> engine_;
  /// units_[g - 1] for the engine's unit group g, while attached.
  std::vector<UnitState> units_;
  /// The module laid out, for a relayout while a checkpoint loads.
  LightningModule* module_ = nullptr;
};

}  // namespace volt
