#include "volt/strategies/pipeline_strategy.h"

#include <torch/torch.h>

#include <map>

#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/module/lightning_module.h"
#include "volt/optim/optimizer_state.h"

namespace volt {

void PipeStages::setup_module(LightningModule& module) {
  std::vector<std::shared_ptr<PipeImpl>> pipes;
  for (const auto& item : module.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    if (auto pipe = std::dynamic_pointer_cast<PipeImpl>(item.value())) pipes.push_back(pipe);
  }
  VOLT_CHECK(pipes.size() == 1,
             "strategy='pipeline' splits the module's volt::Pipe into stages, but {} holds {}. HINT: register the "
             "layers to pipeline as one volt::Pipe(torch::nn::Sequential(...)) and call it in training_step as the "
             "Sequential.",
             module.name(), pipes.empty() ? std::string("none") : std::to_string(pipes.size()));
  pipe_ = pipes.front();
  pipe_->enable(options_);
}

void PipeStages::setup_optimizers(const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) {
  optimizers_ = optimizers;
  placed_state_ = false;
}

void PipeStages::after_backward() {
  if (placed_state_ || options_.devices.front().is_cpu()) return;
  placed_state_ = true;
  // A checkpoint's optimizer state loaded before the first forward sits on the root device; the
  // stages' parameters moved to theirs when the pipeline was built. Loading copies each
  // parameter's state onto its device.
  for (const auto& optimizer : optimizers_) load_optimizer_state_dict(*optimizer, optimizer_state_dict(*optimizer));
}

PipelineStrategy::PipelineStrategy(Topology topology, PipeOptions options)
    : topology_(std::move(topology)), stages_(std::move(options)) {}

PipelineDdpStrategy::PipelineDdpStrategy(Topology topology, DdpOptions ddp, Env env, PipeOptions options)
    : DdpStrategy(std::move(topology), std::move(ddp), std::move(env)), stages_(std::move(options)) {}

void PipelineDdpStrategy::setup_module(LightningModule& module) {
  // Every replica starts from rank 0's values, before the stages move the layers to their devices.
  broadcast_module(module);
  stages_.setup_module(module);
  module_ = &module;
}

void PipelineDdpStrategy::after_backward(bool synchronize) {
  stages_.after_backward();
  if (!synchronize) return;
  VOLT_INTERNAL_ASSERT(module_ != nullptr, "pipeline x ddp: after_backward before setup_module");
  torch::NoGradGuard no_grad;
  // One all-reduce per device the stages put parameters on, in the module's parameter order
  // (the same on every replica); a gradient this replica did not compute counts as zeros.
  std::map<std::string, std::vector<torch::Tensor>> by_device;
  for (const torch::Tensor& p : module_->parameters()) {
    if (p.requires_grad()) by_device[p.device().str()].push_back(p);
  }
  for (auto& [device, params] : by_device) {
    std::vector<torch::Tensor> grads;
    for (const torch::Tensor& p : params) {
      grads.push_back(p.grad().defined() ? p.grad().reshape({-1}) : torch::zeros({p.numel()}, p.options()));
    }
    torch::Tensor flat = torch::cat(grads);
    process_group().all_reduce(flat, Reduce::kMean);
    int64_t offset = 0;
    for (torch::Tensor& p : params) {
      if (p.grad().defined()) p.mutable_grad().copy_(flat.narrow(0, offset, p.numel()).view_as(p));
      offset += p.numel();
    }
  }
  stop_sync_clock();
}

}  // namespace volt
