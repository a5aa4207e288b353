#include "volt/strategies/pipeline_strategy.h"

#include <torch/torch.h>

#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/module/lightning_module.h"
#include "volt/optim/optimizer_state.h"

namespace volt {

PipelineStrategy::PipelineStrategy(Topology topology, PipeOptions options)
    : topology_(std::move(topology)), options_(std::move(options)) {}

void PipelineStrategy::setup_module(LightningModule& module) {
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

void PipelineStrategy::setup_optimizers(LightningModule&,
                                        const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) {
  optimizers_ = optimizers;
  placed_state_ = false;
}

void PipelineStrategy::after_backward(bool) {
  if (placed_state_ || options_.devices.front().is_cpu()) return;
  placed_state_ = true;
  // A checkpoint's optimizer state loaded before the first forward sits on the root device; the
  // stages' parameters moved to theirs when the pipeline was built. Loading copies each
  // parameter's state onto its device.
  for (const auto& optimizer : optimizers_) load_optimizer_state_dict(*optimizer, optimizer_state_dict(*optimizer));
}

}  // namespace volt
