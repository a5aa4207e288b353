// Volt's side of the ddp benchmark (bench/ddp_vs_pytorch.sh runs it against PyTorch's own
// DistributedDataParallel): the MLP 784-256-256-10 on Fashion-MNIST, Adam, batch 64 per
// process, 1 thread per process. Rank 0 prints the steady-state time per step.
#include <chrono>
#include <iostream>

#include "volt/cli/trainer_flags.h"
#include "volt/core/error.h"
#include "volt/datasets/fashion_mnist.h"
#include "volt/volt.h"

namespace {

class Mlp : public volt::LightningModule {
 public:
  explicit Mlp(std::shared_ptr<volt::TensorDataset> data) : volt::LightningModule("Mlp"), data_(std::move(data)) {
    net_ = register_module(
        "net", torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(784, 256), torch::nn::ReLU(),
                                     torch::nn::Linear(256, 256), torch::nn::ReLU(), torch::nn::Linear(256, 10)));
  }
  torch::Tensor training_step(const volt::Batch& batch, int64_t) override {
    return torch::nn::functional::cross_entropy(net_->forward(batch.data), batch.target);
  }
  volt::OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-3));
  }
  volt::DataLoader train_dataloader() override { return volt::DataLoader(data_, {.batch_size = 64, .shuffle = true}); }

 private:
  std::shared_ptr<volt::TensorDataset> data_;
  torch::nn::Sequential net_{nullptr};
};

/// Records when each training batch ended, to time the steady state without start-up.
class StepClock : public volt::Callback {
 public:
  std::string state_key() const override { return "StepClock"; }
  volt::Decision on_train_batch_end(const volt::CallbackContext& context, volt::CallbackServices&) override {
    times.push_back(std::chrono::steady_clock::now());
    return {};
  }
  std::vector<std::chrono::steady_clock::time_point> times;
};

}  // namespace

int main(int argc, char** argv) {
  return volt::run_main([&] {
    CLI::App app("Volt ddp throughput (one side of bench/ddp_vs_pytorch.sh)", "bench_ddp_throughput");
    volt::TrainerOptions options;
    options.enable_progress_bar = false;
    options.enable_model_summary = false;
    options.enable_checkpointing = false;
    options.logger = false;
    options.num_threads = 1;
    options.seed = 0;
    volt::TrainerFlagText text;
    volt::add_trainer_flags(app, options, text);
    int64_t warmup = 50;
    app.add_option("--warmup", warmup, "steps left out of the timing");
    std::string data_dir = volt::datasets::kFashionMnistDefaultDir;
    app.add_option("--data-dir", data_dir, "Fashion-MNIST IDX files");
    CLI11_PARSE(app, argc, argv);
    volt::apply_trainer_flags(text, options);
    auto clock = std::make_shared<StepClock>();
    options.callbacks.push_back(clock);
    volt::Trainer trainer(options);
    const auto train = volt::datasets::load_fashion_mnist(data_dir, volt::datasets::Split::kTrain);
    Mlp model(std::make_shared<volt::TensorDataset>(train.images, train.labels));
    const volt::FitResult result = trainer.fit(model);
    trainer.teardown();
    const auto& t = clock->times;
    if (!trainer.plan().is_global_zero()) return 0;
    VOLT_CHECK(static_cast<int64_t>(t.size()) > warmup + 1, "ran {} steps; need more than --warmup={}", t.size(),
               warmup);
    const double seconds = std::chrono::duration<double>(t.back() - t[static_cast<size_t>(warmup)]).count();
    const double per_step_ms = 1000.0 * seconds / static_cast<double>(t.size() - 1 - static_cast<size_t>(warmup));
    std::cout << "volt processes=" << trainer.plan().topology.world_size << " step_ms=" << per_step_ms
              << " samples_per_s=" << 64.0 * trainer.plan().topology.world_size * 1000.0 / per_step_ms
              << " steps=" << result.global_step << "\n";
    return 0;
  });
}
