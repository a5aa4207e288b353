// Trains a Linear layer for a few steps against the installed headers and libraries: if it
// links and runs, every exported target, dependency and include directory is in place.
#include <volt/volt.h>

#include <iostream>

struct Regression : volt::LightningModule {
  torch::nn::Linear layer = register_module("layer", torch::nn::Linear(8, 1));

  torch::Tensor training_step(const volt::Batch& batch, int64_t) override {
    auto loss = torch::mse_loss(layer(batch.data), batch.target);
    log("train/loss", loss, {.prog_bar = true});
    return loss;
  }
  volt::OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::SGD>(parameters(), 0.1);
  }
  volt::DataLoader train_dataloader() override {
    auto x = torch::randn({256, 8}), y = x.sum(1, true);
    return volt::DataLoader(std::make_shared<volt::TensorDataset>(x, y), {.batch_size = 32, .shuffle = true});
  }
};

int main() {
  Regression model;
  volt::Trainer trainer({.max_steps = 20, .seed = 0, .enable_progress_bar = false});
  std::cout << trainer.fit(model).brief_report() << "\n";
}
