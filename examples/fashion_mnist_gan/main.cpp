// A GAN on Fashion-MNIST: manual optimization with two optimizers (generator and
// discriminator), trained by the same Trainer and flags as the main example.
//
//   fashion_mnist_gan --max-epochs 5
//   fashion_mnist_gan --max-steps 400 --strategy ddp --devices 2
//   fashion_mnist_gan --max-steps 400 --ckpt-path last     (resumes where the last run stopped)
//
// Each batch steps both optimizers, so each counts a global step (Lightning's rule): --max-steps
// 400 trains 200 batches. At the end it prints how often the discriminator takes real images for
// real and generated ones for generated ones.
#include <iostream>
#include <string>

#include "volt/cli/cli_config.h"
#include "volt/cli/trainer_flags.h"
#include "volt/datasets/fashion_mnist.h"
#include "volt/volt.h"

namespace {

/// What the GAN is and trains on.
struct GanOptions {
  int64_t latent = 64;  ///< noise dimensions
  int64_t hidden = 256;
  double lr = 2e-4;
  int64_t batch_size = 64;
  std::string data_dir = volt::datasets::kFashionMnistDefaultDir;
};

/// An MLP generator (noise -> 28x28 image in [-1, 1]) and discriminator (image -> logit).
class FashionGan : public volt::LightningModule {
 public:
  explicit FashionGan(GanOptions options) : volt::LightningModule("FashionGan"), options_(std::move(options)) {
    namespace nn = torch::nn;
    generator_ = register_module("generator", nn::Sequential(nn::Linear(options_.latent, options_.hidden),
                                                             nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)),
                                                             nn::Linear(options_.hidden, 784), nn::Tanh()));
    discriminator_ =
        register_module("discriminator", nn::Sequential(nn::Linear(784, options_.hidden),
                                                        nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)),
                                                        nn::Linear(options_.hidden, 1)));
    set_automatic_optimization(false);
    save_hyperparameters({{"latent", options_.latent}, {"hidden", options_.hidden}, {"lr", options_.lr}});
  }

  torch::Tensor training_step(const volt::Batch& batch, int64_t) override {
    std::vector<volt::LightningOptimizer> opts = optimizers();
    volt::LightningOptimizer& g = opts[0];
    volt::LightningOptimizer& d = opts[1];
    const torch::Tensor real_images = batch.data.flatten(1);
    const int64_t n = real_images.size(0);
    const torch::Tensor ones = torch::ones({n, 1}, real_images.options());
    const torch::Tensor noise = torch::randn({n, options_.latent}, real_images.options());

    // The generator learns to have its images taken for real ones; the discriminator's
    // parameters stay out of this backward pass.
    toggle_optimizer(g);
    const torch::Tensor fake = generator_->forward(noise);
    const torch::Tensor g_loss = torch::binary_cross_entropy_with_logits(discriminator_->forward(fake), ones);
    manual_backward(g_loss);
    g.step();
    g.zero_grad();
    untoggle_optimizer(g);

    // The discriminator learns to tell them apart.
    toggle_optimizer(d);
    const torch::Tensor real_logits = discriminator_->forward(real_images);
    const torch::Tensor fake_logits = discriminator_->forward(fake.detach());
    const torch::Tensor d_loss = 0.5 * (torch::binary_cross_entropy_with_logits(real_logits, ones) +
                                        torch::binary_cross_entropy_with_logits(fake_logits, torch::zeros_like(ones)));
    manual_backward(d_loss);
    d.step();
    d.zero_grad();
    untoggle_optimizer(d);

    log("train/g_loss", g_loss, {.prog_bar = true, .on_epoch = true});
    log("train/d_loss", d_loss, {.prog_bar = true, .on_epoch = true});
    // How often the discriminator is right, on this batch's real and generated images.
    const torch::Tensor right = ((real_logits > 0).sum() + (fake_logits < 0).sum()).to(torch::kDouble) / (2.0 * n);
    log("train/d_accuracy", right, {.on_epoch = true});
    return g_loss.detach();
  }

  volt::OptimizerConfig configure_optimizers() override {
    const auto adam = [this](const std::vector<torch::Tensor>& params) {
      return std::make_shared<torch::optim::Adam>(params, torch::optim::AdamOptions(options_.lr).betas({0.5, 0.999}));
    };
    volt::OptimizerConfig config;
    config.optimizers.push_back(adam(generator_->parameters()));
    config.optimizers.push_back(adam(discriminator_->parameters()));
    return config;
  }

  volt::DataLoader train_dataloader() override {
    const volt::datasets::FashionMnist train =
        volt::datasets::load_fashion_mnist(options_.data_dir, volt::datasets::Split::kTrain);
    // Back from the classifier's normalisation to [-1, 1], the generator's tanh range.
    const torch::Tensor images =
        (train.images * volt::datasets::kFashionMnistStd + volt::datasets::kFashionMnistMean) * 2.0 - 1.0;
    return volt::DataLoader(std::make_shared<volt::TensorDataset>(images, train.labels),
                            {.batch_size = options_.batch_size, .shuffle = true, .drop_last = true});
  }

 private:
  GanOptions options_;
  torch::nn::Sequential generator_{nullptr};
  torch::nn::Sequential discriminator_{nullptr};
};

}  // namespace

int main(int argc, char** argv) {
  return volt::run_main([&] {
    CLI::App app("Train a GAN on Fashion-MNIST with Volt (manual optimization, two optimizers).", "fashion_mnist_gan");
    GanOptions gan;
    volt::TrainerOptions trainer_options;
    trainer_options.max_epochs = 5;
    // The generator's step leaves the discriminator without gradients (and the other way
    // round), which ddp's reducer must be told.
    trainer_options.find_unused_parameters = true;
    volt::TrainerFlagText flag_text;
    volt::add_trainer_flags(app, trainer_options, flag_text);
    app.add_option("--latent", gan.latent, "noise dimensions")->capture_default_str()->group("Model");
    app.add_option("--hidden", gan.hidden, "hidden width of both networks")->capture_default_str()->group("Model");
    app.add_option("--lr", gan.lr, "Adam's learning rate (both optimizers)")->capture_default_str()->group("Model");
    app.add_option("--batch-size", gan.batch_size, "examples per batch")->capture_default_str()->group("Data");
    app.add_option("--data-dir", gan.data_dir, "directory of the Fashion-MNIST IDX files")
        ->capture_default_str()
        ->group("Data");
    if (const std::optional<int> code = volt::parse_command_line(app, argc, argv)) return *code;
    volt::apply_trainer_flags(flag_text, trainer_options);
    trainer_options.config = volt::resolved_config(app);
    if (trainer_options.enable_checkpointing) {
      trainer_options.callbacks.push_back(std::make_shared<volt::ModelCheckpoint>(
          volt::ModelCheckpointOptions{.filename = "{epoch}-{step}", .save_top_k = 1, .save_last = true}));
    }
    volt::Trainer trainer(trainer_options);
    // The Trainer seeded LibTorch, so the initial weights are reproducible.
    FashionGan model(gan);
    const volt::FitResult result = trainer.fit(model);
    if (result.requeued() || result.supervised) {
      trainer.teardown();
      return 0;
    }
    if (trainer.plan().is_global_zero()) {
      std::cout << result.full_report();
      std::cout << result.brief_report() << "\n";
    }
    trainer.teardown();
    return result.reason == volt::StopReason::kInterrupted ? 130 : 0;
  });
}
