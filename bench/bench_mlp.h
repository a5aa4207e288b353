// What the benchmarks share: the MLP they train (784-256-256-10, Adam 1e-3, cross-entropy) and a
// callback that stamps each step, so each benchmark times the steady state its own way.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "volt/core/error.h"
#include "volt/volt.h"

namespace volt::bench {

/// The benchmark MLP over `data` (images [N, 1, 28, 28] or [N, 784]), loaded with `loader`.
class BenchMlp : public LightningModule {
 public:
  /// `fsdp_units`: each Linear in a volt::FsdpUnit (what sharding_strategy full_shard shards).
  BenchMlp(std::shared_ptr<const Dataset> data, DataLoaderOptions loader, bool fsdp_units = false)
      : LightningModule("BenchMlp"), data_(std::move(data)), loader_(std::move(loader)) {
    namespace nn = torch::nn;
    const auto layer = [fsdp_units](nn::Linear linear) {
      return fsdp_units ? nn::AnyModule(FsdpUnit(linear)) : nn::AnyModule(linear);
    };
    nn::Sequential net;
    net->push_back(nn::Flatten());
    net->push_back(layer(nn::Linear(784, 256)));
    net->push_back(nn::ReLU());
    net->push_back(layer(nn::Linear(256, 256)));
    net->push_back(nn::ReLU());
    net->push_back(layer(nn::Linear(256, 10)));
    net_ = register_module("net", net);
  }
  torch::Tensor training_step(const Batch& batch, int64_t) override {
    return torch::nn::functional::cross_entropy(net_->forward(batch.data), batch.target);
  }
  OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-3));
  }
  DataLoader train_dataloader() override { return DataLoader(data_, loader_); }

 private:
  std::shared_ptr<const Dataset> data_;
  DataLoaderOptions loader_;
  torch::nn::Sequential net_{nullptr};
};

/// Records when each training batch ended.
class StepClock : public Callback {
 public:
  std::string state_key() const override { return "StepClock"; }
  Decision on_train_batch_end(const CallbackContext&, CallbackServices&) override {
    stamps.push_back(std::chrono::steady_clock::now());
    return {};
  }
  /// One time point per step, in order.
  std::vector<std::chrono::steady_clock::time_point> stamps;
};

/// Trains `model` for `steps` optimizer steps on 1 intra-op thread with nothing but the trainer
/// (no logger, bar, checkpoints or summary) and returns when each step ended.
inline std::vector<std::chrono::steady_clock::time_point> time_steps(LightningModule& model, int64_t steps) {
  auto clock = std::make_shared<StepClock>();
  Trainer trainer({.num_threads = 1,
                   .max_steps = steps,
                   .seed = 1,
                   .logger = false,
                   .callbacks = {clock},
                   .enable_progress_bar = false,
                   .enable_checkpointing = false,
                   .enable_model_summary = false});
  trainer.fit(model);
  return clock->stamps;
}

/// What a throughput benchmark's Trainer starts from before its flags: nothing but the trainer
/// (no bar, summary, checkpoints or logger), 1 intra-op thread, seed 0.
inline TrainerOptions bare_trainer_options() {
  TrainerOptions options;
  options.enable_progress_bar = false;
  options.enable_model_summary = false;
  options.enable_checkpointing = false;
  options.logger = false;
  options.num_threads = 1;
  options.seed = 0;
  return options;
}

/// Milliseconds per step after the first `warmup` steps, from a StepClock's stamps; throws
/// volt::Error when the run took too few steps to time.
inline double steady_step_ms(const std::vector<std::chrono::steady_clock::time_point>& stamps, int64_t warmup) {
  VOLT_CHECK(static_cast<int64_t>(stamps.size()) > warmup + 1, "ran {} steps; need more than --warmup={}",
             stamps.size(), warmup);
  const double seconds = std::chrono::duration<double>(stamps.back() - stamps[static_cast<size_t>(warmup)]).count();
  return 1000.0 * seconds / static_cast<double>(stamps.size() - 1 - static_cast<size_t>(warmup));
}

}  // namespace volt::bench
