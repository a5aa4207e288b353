#include "volt/strategies/fsdp_strategy.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <set>

#include "volt/core/error.h"
#include "volt/module/lightning_module.h"
#include "volt/optim/optimizer_state.h"

namespace volt {

namespace {

int64_t tensor_bytes(const c10::IValue& value) {
  if (value.isTensor()) return value.toTensor().numel() * static_cast<int64_t>(value.toTensor().element_size());
  int64_t bytes = 0;
  if (value.isGenericDict())
    for (const auto& entry : value.toGenericDict()) bytes += tensor_bytes(entry.value());
  return bytes;
}

}  // namespace

/// What a full_shard unit calls around its forward, and autograd after each of its gradients:
/// forwarded to the strategy until detach() (a unit or an autograd graph may outlive it).
class FsdpStrategy::UnitHooks : public FsdpUnitHooks, public std::enable_shared_from_this<UnitHooks> {
 public:
  UnitHooks(FsdpStrategy* strategy, size_t group) : strategy_(strategy), group_(group) {}

  void before_forward() override {
    if (strategy_) strategy_->engine().gather_unit(group_);
  }

  void after_forward(const torch::Tensor& output) override {
    if (!strategy_) return;
    if (torch::GradMode::is_enabled() && output.defined() && output.requires_grad()) {
      // The unit's backward needs its parameters whole again: the gradient reaching its output
      // comes before any of its own backward nodes run.
      std::weak_ptr<UnitHooks> self = weak_from_this();
      output.register_hook([self](const torch::Tensor&) {
        if (auto hooks = self.lock(); hooks && hooks->strategy_) hooks->strategy_->engine().gather_unit(hooks->group_);
      });
    }
    // PyTorch's reshard_after_forward: only the units in flight are whole.
    strategy_->engine().release_unit(group_);
  }

  void accumulated() {
    if (strategy_) strategy_->on_unit_gradient(group_);
  }

  void detach() { strategy_ = nullptr; }

 private:
  FsdpStrategy* strategy_;
  size_t group_;
};

namespace {

/// Runs after autograd accumulated one parameter's gradient (a post hook on its AccumulateGrad).
class AccumulatedHook : public torch::autograd::FunctionPostHook {
 public:
  explicit AccumulatedHook(std::function<void()> on_accumulated) : on_accumulated_(std::move(on_accumulated)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    on_accumulated_();
    return outputs;
  }

 private:
  std::function<void()> on_accumulated_;
};

}  // namespace

FsdpStrategy::FsdpStrategy(Topology topology, DdpOptions options, Env env, FsdpOptions fsdp)
    : DdpStrategy(std::move(topology), std::move(options), std::move(env)), fsdp_(fsdp) {
  VOLT_CHECK(fsdp_.sharding != ShardingStrategy::kNoShard,
             "FsdpStrategy shards, and sharding_strategy='no_shard' shards nothing. HINT: use a DdpStrategy "
             "(make_strategy builds one named 'fsdp' for no_shard).");
}

FsdpStrategy::~FsdpStrategy() { detach_units(); }

FlatParamEngine& FsdpStrategy::engine() const {
  VOLT_INTERNAL_ASSERT(engine_ != nullptr, "fsdp used before setup_optimizers laid out the parameters");
  return *engine_;
}

std::vector<std::shared_ptr<FsdpUnitImpl>> FsdpStrategy::find_units(LightningModule& module) const {
  if (fsdp_.sharding != ShardingStrategy::kFullShard) return {};
  return find_fsdp_units(module, fsdp_.min_unit_params);
}

void FsdpStrategy::attach_units() {
  for (size_t g = 1; g < engine().group_count(); ++g) {
    UnitState state{.unit = engine().unit(g), .hooks = std::make_shared<UnitHooks>(this, g)};
    for (const torch::Tensor& param : engine().parameters(g)) {
      // The accumulator made now, while the parameter is whole, expects whole gradients; held
      // here, it (and the hook on it) serves every step.
      auto accumulator = torch::autograd::impl::grad_accumulator(param);
      std::weak_ptr<UnitHooks> weak = state.hooks;
      accumulator->add_post_hook(std::make_unique<AccumulatedHook>([weak] {
        if (auto h = weak.lock()) h->accumulated();
      }));
      state.accumulators.push_back(std::make_shared<decltype(accumulator)>(std::move(accumulator)));
    }
    state.unit->attach(state.hooks);
    units_.push_back(std::move(state));
  }
}

void FsdpStrategy::detach_units() {
  for (UnitState& state : units_) {
    state.hooks->detach();
    state.unit->attach(nullptr);
  }
  units_.clear();
}

void FsdpStrategy::setup_module(LightningModule& module) {
  // Whole gradients are reduce-scattered after backward instead of all-reduced during it.
  broadcast_module(module);
}

void FsdpStrategy::setup_optimizers(LightningModule& module,
                                    const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) {
  module_ = &module;
  detach_units();
  if (!engine_) engine_ = std::make_unique<FlatParamEngine>(process_group());
  engine_->lay_out(module, optimizers, find_units(module));
  attach_units();
}

void FsdpStrategy::sync_trainable_parameters(LightningModule& module) {
  // Every rank agrees on the set first: a rank that alone re-laid out would pair its pieces with
  // other ranks' different ones in every collective after.
  if (agreed_trainable_parameters(module) != engine().trainable() || !engine().covers_optimizers()) relayout(module);
}

void FsdpStrategy::relayout(LightningModule& module) {
  detach_units();
  // The units are chosen once the engine made the old ones whole: min_unit_params counts the
  // elements a unit holds, which are none between gathers.
  engine().relayout(module, [this, &module] { return find_units(module); });
  attach_units();
}

void FsdpStrategy::before_forward(LightningModule& module) {
  DdpStrategy::before_forward(module);
  // Units made whole for a checkpoint or a load keep this process's chunk of them (what a load
  // wrote) and are freed: each forward gathers its own.
  if (engine_) engine_->release_units();
}

void FsdpStrategy::before_backward(const torch::Tensor& loss, bool synchronize) {
  if (synchronize) start_sync_clock(loss);
  for (UnitState& state : units_) {
    state.accumulated = 0;
    state.reduced = false;
  }
  engine().begin_backward();
}

void FsdpStrategy::after_backward(bool synchronize) {
  // Units that autograd did not reach whole (a parameter left out of the loss, a unit not run):
  // every process reduces them here, in the same order, so the collectives pair up.
  for (size_t g = 1; g <= units_.size(); ++g) {
    if (!units_[g - 1].reduced) reduce_unit(g);
  }
  if (!synchronize) return;
  engine().reduce_root_gradients();
  stop_sync_clock();
}

void FsdpStrategy::after_optimizer_step() { engine().gather_root(); }

void FsdpStrategy::on_unit_gradient(size_t g) {
  UnitState& state = units_[g - 1];
  if (++state.accumulated == state.accumulators.size() && !state.reduced) reduce_unit(g);
}

void FsdpStrategy::reduce_unit(size_t g) {
  // Every backward reduces (also when only accumulating): the whole gradients never outlive the
  // unit's backward.
  engine().reduce_unit(g);
  units_[g - 1].reduced = true;
  engine().release_unit(g);
}

void FsdpStrategy::finish_fit(LightningModule& module, bool completed) {
  // The module is the user's again: whole, and running as it would without fsdp.
  if (completed && engine_) engine_->gather_units();
  detach_units();
}

std::vector<c10::IValue> FsdpStrategy::gather_optimizer_states(
    const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) {
  VOLT_INTERNAL_ASSERT(optimizers.size() == engine().optimizers().size(), "gather of {} optimizers, {} laid out",
                       optimizers.size(), engine().optimizers().size());
  engine().gather_units();
  return engine().whole_optimizer_states(/*everyone=*/false);
}

std::vector<c10::IValue> FsdpStrategy::local_optimizer_states(
    const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) {
  return engine().local_optimizer_states(optimizers);
}

std::optional<std::string> FsdpStrategy::parameter_name(const torch::Tensor& optimized) const {
  return engine_ ? engine_->name_of_piece(optimized) : std::nullopt;
}

ParameterPieces FsdpStrategy::local_parameter_pieces() {
  return engine_ ? engine_->local_parameter_pieces() : ParameterPieces();
}

void FsdpStrategy::load_parameter_pieces(const ParameterPieces& pieces, const std::string& path) {
  engine().load_parameter_pieces(pieces, path);
}

void FsdpStrategy::load_optimizer_state(torch::optim::Optimizer& optimizer, const c10::IValue& state) {
  // A resumed fine-tuning run: BaseFinetuning added its groups back (and set requires_grad) after
  // the layout was made; lay them out before the state, which holds them, is cut.
  if (!engine().covers_optimizers()) relayout(*module_);
  engine().load_optimizer_state(optimizer, state);
}

TrainingMemory training_memory(const torch::nn::Module& module,
                               const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) {
  TrainingMemory memory;
  std::set<const c10::TensorImpl*> counted;
  const auto add_grad = [&memory, &counted](const torch::Tensor& p) {
    if (!p.grad().defined() || !counted.insert(p.unsafeGetTensorImpl()).second) return;
    memory.gradients += p.grad().numel() * static_cast<int64_t>(p.grad().element_size());
  };
  // Parameters by storage: under fsdp the optimizers' pieces are parts of the module's flat
  // buffer (shard_grad_op) or a unit's own chunk (full_shard), whose module parameters are empty.
  std::set<const c10::StorageImpl*> storages;
  const auto add_param = [&memory, &storages](const torch::Tensor& p) {
    if (!p.has_storage() || !storages.insert(p.storage().unsafeGetStorageImpl()).second) return;
    memory.parameters += static_cast<int64_t>(p.storage().nbytes());
  };
  for (const torch::Tensor& p : module.parameters()) {
    add_param(p);
    add_grad(p);
  }
  for (const auto& optimizer : optimizers) {
    for (const auto& group : optimizer->param_groups()) {
      for (const torch::Tensor& p : group.params()) {
        add_param(p);
        add_grad(p);
      }
    }
    memory.optimizer_state += tensor_bytes(optimizer_state_dict(*optimizer).toGenericDict().at("state"));
  }
  return memory;
}

}  // namespace volt
