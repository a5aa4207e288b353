#include "volt/pipeline/pipe.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include "volt/core/error.h"
#include "volt/pipeline/balance.h"
#include "volt/pipeline/pipeline.h"

namespace volt {

PipeImpl::PipeImpl(torch::nn::Sequential layers_in) : layers(register_module("layers", std::move(layers_in))) {
  balance_buffer_ = register_buffer("balance", torch::zeros({kMaxPipeStages}, torch::kLong));
}

PipeImpl::~PipeImpl() = default;

void PipeImpl::enable(PipeOptions options) {
  VOLT_CHECK(!options.devices.empty() && static_cast<int64_t>(options.devices.size()) <= kMaxPipeStages,
             "a pipeline needs 1 to {} stages (devices); got {}. HINT: set devices to the number of stages.",
             kMaxPipeStages, options.devices.size());
  VOLT_CHECK(static_cast<int64_t>(options.devices.size()) <= static_cast<int64_t>(layers->size()),
             "a pipeline of {} stages needs at least as many layers, but the Pipe holds {}. HINT: use at most {} "
             "devices, or split the model into more layers.",
             options.devices.size(), layers->size(), layers->size());
  if (!options.balance.empty()) check_balance(options.balance, static_cast<int64_t>(layers->size()));
  VOLT_CHECK(options.balance.empty() || options.balance.size() == options.devices.size(),
             "balance [{}] has {} stages, but the pipeline has {} devices. HINT: give one layer count per device.",
             fmt::join(options.balance, ", "), options.balance.size(), options.devices.size());
  options_ = std::move(options);
  pipeline_.reset();
}

void PipeImpl::disable() {
  options_.reset();
  pipeline_.reset();
}

std::vector<int64_t> PipeImpl::balance() const {
  std::vector<int64_t> out;
  const torch::Tensor b = balance_buffer_.cpu();
  for (int64_t i = 0; i < b.numel() && b[i].item<int64_t>() > 0; ++i) out.push_back(b[i].item<int64_t>());
  return out;
}

void PipeImpl::build(const torch::Tensor& sample) {
  const auto stages = static_cast<int64_t>(options_->devices.size());
  const auto n = static_cast<int64_t>(layers->size());
  std::vector<int64_t> chosen = options_->balance;
  std::string how = "requested";
  if (chosen.empty()) {
    // A checkpoint's partition (the buffer) wins over measuring again, if it fits this run.
    const std::vector<int64_t> restored = balance();
    int64_t covered = 0;
    for (const int64_t c : restored) covered += c;
    if (static_cast<int64_t>(restored.size()) == stages && covered == n) {
      chosen = restored;
      how = "restored from the checkpoint";
    }
  }
  std::vector<LayerCost> costs;
  if (chosen.empty()) {
    // Measuring runs each layer's backward, also when the first forward is an evaluation's.
    const torch::AutoGradMode grad(true);
    costs = profile_layers(layers, sample.detach(), 3);
    chosen = balance_by_time(costs, stages, std::nullopt, options_->chunks);
    how = "auto: balanced by the layers' measured time";
  }
  {
    torch::NoGradGuard no_grad;
    balance_buffer_.zero_();
    for (size_t s = 0; s < chosen.size(); ++s) balance_buffer_[static_cast<int64_t>(s)] = chosen[s];
  }
  pipeline_ = std::make_unique<Pipeline>(layers, chosen, options_->devices);
  if (options_->report) {
    // Each stage's measured cost when they were measured; a given partition is not timed.
    options_->report(fmt::format("Pipeline of {} stages, {} micro-batches per batch, balance [{}] ({}){}", stages,
                                 options_->chunks, fmt::join(chosen, ", "), how,
                                 costs.empty() ? "" : ": " + describe_balance(costs, chosen)));
  }
}

torch::Tensor PipeImpl::train_step(const torch::Tensor& x, const Pipeline::MicroBatchLoss& loss) {
  if (!options_ || !torch::GradMode::is_enabled()) return loss(layers->forward(x), 0, x.size(0));
  VOLT_CHECK(!options_->loss_scaling,
             "Pipe::train_step runs each micro-batch's backward itself, which 16-mixed's loss scaling cannot reach. "
             "HINT: use precision='bf16-mixed' or '32-true', or compute the loss from Pipe::forward (GPipe's order).");
  if (!pipeline_) build(x);
  const torch::Tensor total = pipeline_->train_step(x, options_->chunks, options_->schedule, loss).to(x.device());
  // The layers' gradients are complete: the caller's backward of this loss must add nothing to
  // them, so it ends in a leaf of its own.
  return total + torch::zeros({}, total.options().requires_grad(true));
}

torch::Tensor PipeImpl::forward(const torch::Tensor& x) {
  if (!options_) return layers->forward(x);
  if (!pipeline_) build(x);
  return pipeline_->forward_with_graph(x, options_->chunks).to(x.device());
}

}  // namespace volt
