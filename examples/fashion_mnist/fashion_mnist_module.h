// The example module: an MLP or a small CNN classifying Fashion-MNIST.
#pragma once

#include <string>

#include "volt/datasets/image_folder.h"
#include "volt/volt.h"

namespace fashion_mnist {

/// The module's hyperparameters (also the command-line flags of the example).
struct ModuleOptions {
  /// "mlp" (784-256-256-10) or "cnn" (two conv blocks and a classifier).
  std::string model = "cnn";
  /// Adam's learning rate.
  double lr = 1e-3;
  /// StepLR's decay per epoch (1.0: constant lr). Halving each epoch steadies the final weights.
  double lr_gamma = 0.5;
  /// Examples per batch.
  int64_t batch_size = 64;
  /// Width of the MLP's hidden layers.
  int64_t hidden = 256;
  /// Where the IDX files are; or an image folder with train/ and test/ inside, each with one
  /// folder per class (scripts/export-fashion-mnist-images.py writes one), decoded per batch; or
  /// .npy shards: train/, test/ and optionally val/, each with data-*.npy and target-*.npy
  /// (scripts/export-fashion-mnist-npy.py), read as a stream.
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  /// Training examples held out for validation (taken from the 60000 training images; .npy
  /// shards validate on their val/ folder instead).
  int64_t val_size = 5000;
  /// Threads that make batches ahead of the step (the loaders' num_workers). Results do not depend on it.
  int64_t num_workers = 0;
  /// Page-locks the training batches before they go to a GPU (the loader's pin_memory), so the
  /// copy can overlap the step; changes nothing on the CPU.
  bool pin_memory = false;
  /// Hold the net in a volt::Pipe, which strategy="pipeline" splits into stages (main sets it for
  /// --strategy pipeline). Its checkpoints name the layers net.layers.N and add net.balance.
  bool pipelined = false;
  /// Wrap each Linear and Conv2d in a volt::FsdpUnit, the units sharding_strategy="full_shard"
  /// shards (main sets it for --sharding-strategy full_shard). The layers keep their names.
  bool fsdp_units = false;
  /// With an image folder: leave out images that cannot be decoded (counted, reported at the end)
  /// instead of failing the run.
  bool skip_unreadable = false;
  /// With .npy shards: examples per shard, the unit the stream deals to processes and workers.
  int64_t examples_per_shard = 5000;
};

/// Whether `options` leave validation data: --val-size > 0, or a val/ folder beside .npy shards.
bool has_validation_data(const ModuleOptions& options);

/// Classifies Fashion-MNIST images; logs loss and accuracy per stage.
class FashionMnistModule : public volt::LightningModule {
 public:
  /// Builds the network; throws volt::Error for an unknown model name.
  explicit FashionMnistModule(ModuleOptions options);

  /// The network's logits for images shaped [N, 1, 28, 28].
  torch::Tensor forward(const torch::Tensor& images);

  torch::Tensor training_step(const volt::Batch& batch, int64_t batch_idx) override;
  void validation_step(const volt::Batch& batch, int64_t batch_idx) override;
  void test_step(const volt::Batch& batch, int64_t batch_idx) override;
  torch::Tensor predict_step(const volt::Batch& batch, int64_t batch_idx) override;
  volt::OptimizerConfig configure_optimizers() override;
  volt::DataLoader train_dataloader() override;
  volt::DataLoader val_dataloader() override;
  volt::DataLoader test_dataloader() override;
  volt::DataLoader predict_dataloader() override { return test_dataloader(); }
  /// dp and ddp2 on several GPUs run a copy of the network on each device but the first.
  std::shared_ptr<volt::LightningModule> make_replica() const override {
    return std::make_shared<FashionMnistModule>(options_);
  }
  /// The image files left out so far (--skip-unreadable-images), each once, with why.
  std::vector<std::string> skipped_images() const;
  /// Adam's learning rate from the next configure_optimizers() on (the tuner's --auto-lr-find).
  void set_lr(double lr);
  /// The training batch size from the next train_dataloader() on (--auto-scale-batch-size).
  void set_batch_size(int64_t batch_size);

 private:
  void load_training_split();
  /// Whether data_dir is an image folder (train/ and test/ inside) rather than the IDX files.
  bool from_image_folder() const;
  /// ImageFolder over data_dir/`split`, normalised as the IDX images are.
  std::shared_ptr<volt::Dataset> image_split(const std::string& split);
  /// Whether data_dir holds .npy shards (data-*.npy in train/).
  bool from_npy_shards() const;
  /// A loader streaming the .npy shards of data_dir/`split`, normalised as the IDX images are.
  volt::DataLoader npy_loader(const std::string& split, int64_t batch_size, bool shuffle) const;
  void evaluate(const volt::Batch& batch, const std::string& stage);

  ModuleOptions options_;
  torch::nn::Sequential net_{nullptr};
  volt::Pipe pipe_{nullptr};  // instead of net_ when pipelined
  std::shared_ptr<volt::Dataset> train_;
  std::shared_ptr<volt::Dataset> val_;
  std::shared_ptr<volt::Dataset> test_;
  std::vector<std::shared_ptr<const volt::datasets::ImageFolder>> folders_;  // the image folders read
};

}  // namespace fashion_mnist
