// The module a LightningModule wraps a layer (or block) in to make it one unit of
// sharding_strategy="full_shard": its parameters live sharded over the processes and are gathered
// for its forward and backward only. Every other strategy runs the layer as it is, so the model
// does not change between strategies.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace volt {

/// What strategy="fsdp" with full_shard attaches to a unit: called around each of its forward
/// passes. Internal to the strategy; a user never implements it.
class FsdpUnitHooks {
 public:
  virtual ~FsdpUnitHooks() = default;
  /// Before the wrapped module's forward: the unit's parameters become whole (a collective).
  virtual void before_forward() = 0;
  /// After it, with the forward's tensor output: the parameters are freed again, and the output
  /// carries a hook that gathers them before the unit's backward.
  virtual void after_forward(const torch::Tensor& output) = 0;
};

/// A module that shards as one unit under full_shard (PyTorch's FSDP `wrap()`).
///
/// Example (in a LightningModule's constructor):
/// ```
/// block1_ = register_module("block1", volt::FsdpUnit(torch::nn::Linear(784, 4096)));
/// ```
/// and in forward `block1_(x)`, as with the Linear. The wrapped module's parameters, buffers and
/// submodules are registered under the unit with their own names (no extra level), so a
/// checkpoint of the model reads the same with or without the unit, under any strategy. A unit
/// nested in another is its own unit; the parameters of the model outside every unit train as under
/// shard_grad_op (whole on every process, gradients and optimizer state sharded).
class FsdpUnitImpl : public torch::nn::Module {
 public:
  /// Wraps `module` (any module whose forward is not a template; called through AnyModule).
  explicit FsdpUnitImpl(torch::nn::AnyModule module);
  /// Wraps a Sequential (whose forward is a template, so no AnyModule can hold it).
  explicit FsdpUnitImpl(torch::nn::Sequential sequential);
  /// Wraps a ModuleHolder, e.g. torch::nn::Linear(8, 4).
  template <typename ModuleType>
  explicit FsdpUnitImpl(torch::nn::ModuleHolder<ModuleType> module)
      : FsdpUnitImpl(torch::nn::AnyModule(std::move(module))) {}

  /// The wrapped module's output for `x` (a module whose forward takes one tensor). Usable inside
  /// a Sequential.
  torch::Tensor forward(const torch::Tensor& x);
  /// The wrapped module's tensor output for any arguments its forward takes.
  template <typename... Args>
  torch::Tensor call(Args&&... args) {
    if (!hooks_) return run(std::forward<Args>(args)...);
    hooks_->before_forward();
    torch::Tensor output = run(std::forward<Args>(args)...);
    hooks_->after_forward(output);
    return output;
  }

  /// The wrapped module.
  torch::nn::Module& module() const { return *inner_; }
  /// The number of parameter elements of the unit (its own and nested units'); 0 for those that
  /// full_shard holds sharded at the moment (between gathers).
  int64_t numel() const;

  /// Switches the wrapped module too: it is not registered as a child (its parts are), so
  /// Module::train would not reach a wrapped module that reads is_training() itself.
  void train(bool on = true) override;
  /// A unit over a deep copy of the wrapped module (dp's replicas), with no hooks.
  // c10::optional: LibTorch 1.13 declares clone with it (2.x: an alias of std::optional).
  std::shared_ptr<torch::nn::Module> clone(const c10::optional<torch::Device>& device = c10::nullopt) const override;
  /// "volt::FsdpUnit(<the wrapped module>)".
  void pretty_print(std::ostream& stream) const override;

  /// Attaches the strategy's hooks (nullptr detaches them: the module runs as it is).
  void attach(std::shared_ptr<FsdpUnitHooks> hooks) { hooks_ = std::move(hooks); }
  /// Whether a strategy's hooks are attached.
  bool attached() const { return hooks_ != nullptr; }

 private:
  /// Registers the wrapped module's parts as the unit's.
  void adopt();
  template <typename... Args>
  torch::Tensor run(Args&&... args) {
    if (sequential_) return sequential_->forward<torch::Tensor>(std::forward<Args>(args)...);
    return any_.forward<torch::Tensor>(std::forward<Args>(args)...);
  }

  /// The wrapped module: any_'s or sequential_'s.
  std::shared_ptr<torch::nn::Module> inner_;
  torch::nn::AnyModule any_;
  torch::nn::Sequential sequential_{nullptr};
  std::shared_ptr<FsdpUnitHooks> hooks_;
};

/// The ModuleHolder of FsdpUnitImpl (as torch::nn::Sequential is of SequentialImpl).
TORCH_MODULE(FsdpUnit);

/// The FsdpUnits inside `module` that hold at least `min_params` parameter elements (full_shard's
/// wrapping policy), outermost first (depth-first order, so a unit comes before those it nests).
std::vector<std::shared_ptr<FsdpUnitImpl>> find_fsdp_units(torch::nn::Module& module, int64_t min_params);

}  // namespace volt
