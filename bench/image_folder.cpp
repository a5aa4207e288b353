// Volt's side of bench/image_folder_vs_pytorch.sh: trains the MLP (784-256-256-10, Adam 1e-3,
// batch 64, shuffled, 1 intra-op thread) on a PNG image folder decoded per batch by
// volt::datasets::ImageFolder with `--workers` loader threads, and prints samples per second over
// the steps after `--warmup`, the time to the first step, and the process's peak RSS.
//
//   bench_image_folder --folder /tmp/fashion-png/train --workers 2 --steps 300
#include "volt/datasets/image_folder.h"

#include <sys/resource.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <iomanip>
#include <iostream>

#include "volt/datasets/fashion_mnist.h"
#include "volt/volt.h"

namespace {

using Clock = std::chrono::steady_clock;

class StepClock : public volt::Callback {
 public:
  std::string state_key() const override { return "StepClock"; }
  volt::Decision on_train_batch_end(const volt::CallbackContext&, volt::CallbackServices&) override {
    stamps.push_back(Clock::now());
    return {};
  }
  std::vector<Clock::time_point> stamps;
};

class Mlp : public volt::LightningModule {
 public:
  Mlp(std::shared_ptr<const volt::Dataset> data, int64_t workers) : data_(std::move(data)), workers_(workers) {
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
  volt::DataLoader train_dataloader() override {
    return volt::DataLoader(data_, {.batch_size = 64, .shuffle = true, .num_workers = workers_});
  }

 private:
  std::shared_ptr<const volt::Dataset> data_;
  int64_t workers_;
  torch::nn::Sequential net_{nullptr};
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Training throughput from a PNG image folder", "bench_image_folder");
  std::string folder;
  int64_t workers = 2;
  int64_t steps = 300;
  int64_t warmup = 20;
  app.add_option("--folder", folder, "the image folder (one subfolder per class)")->required();
  app.add_option("--workers", workers, "loader worker threads")->capture_default_str();
  app.add_option("--steps", steps, "optimizer steps")->capture_default_str();
  app.add_option("--warmup", warmup, "steps left out of the throughput")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const auto start = Clock::now();
  volt::datasets::ImageFolderOptions options{
      .channels = 1,
      .transform = volt::datasets::normalize({volt::datasets::kFashionMnistMean}, {volt::datasets::kFashionMnistStd})};
  auto data = std::make_shared<volt::datasets::ImageFolder>(folder, options);
  Mlp model(data, workers);
  auto clock = std::make_shared<StepClock>();
  volt::Trainer trainer({.num_threads = 1,
                         .max_steps = steps,
                         .seed = 1,
                         .logger = false,
                         .callbacks = {clock},
                         .enable_progress_bar = false,
                         .enable_checkpointing = false,
                         .enable_model_summary = false});
  trainer.fit(model);
  const auto& t = clock->stamps;
  const double seconds =
      std::chrono::duration<double>(t.back() - t[static_cast<size_t>(std::min<int64_t>(warmup, steps - 1))]).count();
  const double samples = 64.0 * static_cast<double>(steps - 1 - std::min<int64_t>(warmup, steps - 1));
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::cout << std::fixed << std::setprecision(1) << "volt workers=" << workers
            << " samples_per_s=" << samples / seconds
            << " first_step_ms=" << std::chrono::duration<double, std::milli>(t.front() - start).count()
            << " peak_rss_mb=" << static_cast<double>(usage.ru_maxrss) / 1024.0 << "\n";
  return 0;
}
