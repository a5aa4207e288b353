#include "volt/nn/activation_checkpoint.h"

#include <ATen/Context.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/torch.h>

#include <mutex>
#include <optional>
#include <utility>

#include "volt/base/autograd_compat.h"
#include "volt/core/error.h"
#include "volt/precision/autocast_guard.h"

namespace volt {
namespace {

// The state of the generators a forward pass may draw from: the CPU one, and the default one of
// each CUDA device an input lives on.
struct GeneratorStates {
  std::vector<std::pair<at::Generator, torch::Tensor>> states;

  static GeneratorStates capture(const std::vector<torch::Tensor>& inputs) {
    GeneratorStates captured;
    captured.add(at::detail::getDefaultCPUGenerator());
    for (const torch::Tensor& input : inputs) {
      if (!input.defined() || !input.is_cuda()) continue;
      const at::Generator generator = at::globalContext().defaultGenerator(input.device());
      bool seen = false;
      for (const auto& [each, state] : captured.states) seen = seen || each == generator;
      if (!seen) captured.add(generator);
    }
    return captured;
  }

  void add(at::Generator generator) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    torch::Tensor state = generator.get_state();
    states.emplace_back(std::move(generator), std::move(state));
  }

  // Sets every generator to its state here; returns the states they had.
  GeneratorStates swap_in() const {
    GeneratorStates before;
    for (const auto& [generator, state] : states) {
      at::Generator each = generator;
      before.add(each);
      std::lock_guard<std::mutex> lock(each.mutex());
      each.set_state(state);
    }
    return before;
  }
};

// The backward of a checkpointed piece: recomputes it from the saved inputs and back-propagates
// the outputs' gradients through the recomputation.
class CheckpointBackward : public torch::autograd::Node {
 public:
  CheckpointBackward(CheckpointFn fn, std::vector<torch::Tensor> inputs, GeneratorStates generators,
                     AutocastState autocast)
      : fn_(std::move(fn)), inputs_(std::move(inputs)), generators_(std::move(generators)), autocast_(autocast) {
    for (const torch::Tensor& input : inputs_) versions_.push_back(input.defined() ? input._version() : 0);
  }

  /// The outputs (by index) whose gradients this node receives, in the order of its inputs.
  std::vector<size_t> differentiable;

  std::string name() const override { return "volt::CheckpointBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    VOLT_CHECK(fn_ != nullptr,
               "a checkpointed block was back-propagated twice; its inputs were released after the first backward. "
               "HINT: keep the graph (backward with retain_graph) only around blocks that are not checkpointed, or "
               "run the forward pass again.");
    std::vector<torch::Tensor> detached;
    detached.reserve(inputs_.size());
    for (size_t i = 0; i < inputs_.size(); ++i) {
      const torch::Tensor& input = inputs_[i];
      VOLT_CHECK(!input.defined() || input._version() == versions_[i],
                 "input {} of a checkpointed block was modified in place between its forward and backward passes, so "
                 "the block cannot be recomputed from it. HINT: modify a copy (x = x.clone()) or do not checkpoint "
                 "this block.",
                 i);
      detached.push_back(input.defined() ? input.detach().requires_grad_(input.requires_grad()) : input);
    }
    std::vector<torch::Tensor> outputs;
    {
      // The first run's randomness and autocast, and the generators' own states back afterwards,
      // so the recomputation neither changes the dropout masks nor the rest of the run's stream.
      const GeneratorStates current = generators_.swap_in();
      try {
        const torch::AutoGradMode grad_on(true);
        const AutocastStateGuard autocast(autocast_);
        outputs = fn_(detached);
      } catch (...) {
        current.swap_in();
        throw;
      }
      current.swap_in();
    }
    VOLT_CHECK(outputs.size() == outputs_,
               "a checkpointed block returned {} tensors when recomputed in backward and {} in forward. HINT: the "
               "function given to volt::checkpoint must return the same outputs each time it runs.",
               outputs.size(), outputs_);
    std::vector<torch::Tensor> with_grad;
    std::vector<torch::Tensor> their_grads;
    for (size_t k = 0; k < differentiable.size(); ++k) {
      const torch::Tensor& output = outputs[differentiable[k]];
      if (output.defined() && output.requires_grad() && grads[k].defined()) {
        with_grad.push_back(output);
        their_grads.push_back(grads[k]);
      }
    }
    if (!with_grad.empty()) torch::autograd::backward(with_grad, their_grads);
    torch::autograd::variable_list input_grads;
    input_grads.reserve(detached.size());
    for (const torch::Tensor& input : detached) {
      input_grads.push_back(input.defined() && input.requires_grad() ? input.grad() : torch::Tensor());
    }
    release_variables();
    return input_grads;
  }

  /// How many outputs the first run returned.
  void set_output_count(size_t count) { outputs_ = count; }

  void release_variables() override {
    fn_ = nullptr;
    inputs_.clear();
    generators_.states.clear();
  }

 private:
  CheckpointFn fn_;
  std::vector<torch::Tensor> inputs_;
  std::vector<int64_t> versions_;  // the inputs' version counters at forward
  GeneratorStates generators_;
  AutocastState autocast_;
  size_t outputs_ = 0;
};

bool any_requires_grad(const std::vector<torch::Tensor>& tensors) {
  for (const torch::Tensor& t : tensors) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

}  // namespace

std::vector<torch::Tensor> checkpoint(const CheckpointFn& fn, const std::vector<torch::Tensor>& inputs) {
  if (!torch::GradMode::is_enabled() || !any_requires_grad(inputs)) return fn(inputs);
  GeneratorStates generators = GeneratorStates::capture(inputs);
  const AutocastState autocast = AutocastState::current();
  std::vector<torch::Tensor> outputs;
  {
    const torch::NoGradGuard no_grad;
    outputs = fn(inputs);
  }
  std::vector<torch::Tensor> saved;
  saved.reserve(inputs.size());
  torch::autograd::edge_list edges;
  for (const torch::Tensor& input : inputs) {
    // Detached: the node keeps the values, not the graph that made them.
    saved.push_back(input.defined() ? input.detach().requires_grad_(input.requires_grad()) : input);
    edges.push_back(input.defined() ? torch::autograd::impl::gradient_edge(input) : torch::autograd::Edge());
  }
  auto node = compat::make_autograd_node<CheckpointBackward>(fn, std::move(saved), std::move(generators), autocast);
  // The graph's own pointer type (std::shared_ptr or c10::intrusive_ptr per LibTorch) to the base.
  const decltype(torch::autograd::Edge::function) as_node = node;
  node->set_next_edges(std::move(edges));
  node->set_output_count(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    torch::Tensor& output = outputs[i];
    if (!output.defined() || !at::isFloatingType(output.scalar_type())) continue;
    // A view of an input would take the input's history: give it storage of its own.
    for (const torch::Tensor& input : inputs) {
      if (input.defined() && output.is_alias_of(input)) {
        const torch::NoGradGuard no_grad;
        output = output.clone();
        break;
      }
    }
    torch::autograd::set_history(output, as_node);
    node->differentiable.push_back(i);
  }
  return outputs;
}

torch::Tensor checkpoint(const std::function<torch::Tensor(const torch::Tensor&)>& fn, const torch::Tensor& input) {
  // `fn` by value: backward runs it again after this call returned.
  return checkpoint([fn](const std::vector<torch::Tensor>& in) { return std::vector<torch::Tensor>{fn(in[0])}; },
                    {input})[0];
}

}  // namespace volt
