#include "volt/loops/step_parts.h"

#include <torch/torch.h>

#include "volt/callbacks/callback.h"
#include "volt/module/lightning_module.h"
#include "volt/precision/precision_plugin.h"
#include "volt/profiler/profiler.h"
#include "volt/strategies/strategy.h"

namespace volt {

namespace {

// Calls `hook` on every callback of `callbacks`, if there are any.
void dispatch_to(CallbackDispatcher* callbacks, const CallbackHook& hook) {
  if (callbacks != nullptr) callbacks->dispatch(hook, {});
}

}  // namespace

torch::Tensor StepParts::training_step(const Batch& batch, int64_t index) const {
  strategy.before_forward(module);
  const AutocastGuard autocast = precision.forward_context();
  return strategy.training_step(module, batch, index);
}

double StepParts::backward(const torch::Tensor& loss, bool synchronize, bool hooks,
                           CallbackDispatcher* callbacks) const {
  const auto start = Profiler::Clock::now();
  if (hooks) {
    const Profiler::Scope timed(profiler, Action::kHooks);
    dispatch_to(callbacks, [&loss](Callback& c, const CallbackContext& ctx, CallbackServices& s) {
      return c.on_before_backward(ctx, s, loss);
    });
    module.on_before_backward(loss);
  }
  {
    Profiler::Scope pass(profiler, Action::kBackward);
    strategy.before_backward(loss, synchronize);
    precision.backward(loss);
    // fsdp reduce-scatters here, so the hooks below see the gradients the optimizers will use.
    strategy.after_backward(synchronize);
    if (synchronize && strategy.topology().world_size > 1) {
      const double wait = strategy.gradient_sync_wait();
      pass.exclude(wait);
      profiler.record(Action::kGradSync, wait);
    }
  }
  if (hooks) {
    const Profiler::Scope timed(profiler, Action::kHooks);
    dispatch_to(callbacks, [](Callback& c, const CallbackContext& ctx, CallbackServices& s) {
      return c.on_after_backward(ctx, s);
    });
    module.on_after_backward();
  }
  return std::chrono::duration<double>(Profiler::Clock::now() - start).count();
}

torch::Tensor StepParts::zero_loss() const {
  // Every trained parameter gets a gradient of exactly 0, so the gradient synchronizer sees the
  // same parameters ready as on the processes that trained. The module's parameters, not the
  // optimizers': under fsdp those are pieces outside the graph.
  torch::Tensor sum;
  for (const torch::Tensor& p : module.parameters()) {
    if (!p.requires_grad()) continue;
    const torch::Tensor term = p.sum() * 0.0;
    sum = sum.defined() ? sum + term : term;
  }
  return sum;
}

void StepParts::before_optimizer_step(size_t index, CallbackDispatcher* callbacks) const {
  torch::optim::Optimizer& optimizer = *optimization.optimizers[index];
  dispatch_to(callbacks, [&optimizer, index](Callback& c, const CallbackContext& ctx, CallbackServices& s) {
    return c.on_before_optimizer_step(ctx, s, optimizer, index);
  });
  module.on_before_optimizer_step(optimizer, index);
}

}  // namespace volt
