#include "fashion_mnist/fashion_mnist_module.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <filesystem>

#include "volt/core/error.h"
#include "volt/datasets/fashion_mnist.h"

namespace fashion_mnist {

namespace {

torch::nn::Sequential make_net(const ModuleOptions& o) {
  namespace nn = torch::nn;
  // Under full_shard each weighted layer is a unit of its own: its parameters are gathered for its
  // forward and backward only. The same layers, drawn in the same order, otherwise.
  const auto layer = [&o](auto module) {
    return o.fsdp_units ? nn::AnyModule(volt::FsdpUnit(module)) : nn::AnyModule(module);
  };
  if (o.model == "mlp") {
    nn::Sequential net;
    net->push_back(nn::Flatten());
    net->push_back(layer(nn::Linear(784, o.hidden)));
    net->push_back(nn::ReLU());
    net->push_back(layer(nn::Linear(o.hidden, o.hidden)));
    net->push_back(nn::ReLU());
    net->push_back(layer(nn::Linear(o.hidden, 10)));
    return net;
  }
  if (o.model == "cnn") {
    // Batch norm steadies the first epochs (and gives the model buffers, which ddp broadcasts).
    nn::Sequential net;
    net->push_back(layer(nn::Conv2d(nn::Conv2dOptions(1, 32, 3).padding(1))));
    net->push_back(nn::BatchNorm2d(32));
    net->push_back(nn::ReLU());
    net->push_back(nn::MaxPool2d(2));
    net->push_back(layer(nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1))));
    net->push_back(nn::BatchNorm2d(64));
    net->push_back(nn::ReLU());
    net->push_back(nn::MaxPool2d(2));
    net->push_back(nn::Flatten());
    net->push_back(layer(nn::Linear(64 * 7 * 7, 128)));
    net->push_back(nn::ReLU());
    net->push_back(layer(nn::Linear(128, 10)));
    return net;
  }
  throw volt::Error(
      fmt::format("--model={} is unknown; expected 'mlp' or 'cnn'. HINT: pass --model mlp (fast) or "
                  "--model cnn (more accurate).",
                  o.model));
}

/// Checks the options a user can get wrong on the command line (LibTorch's own checks would
/// surface as internal errors, or as "from is out of bounds" for --hidden 0).
const ModuleOptions& checked(const ModuleOptions& o) {
  VOLT_CHECK(std::isfinite(o.lr) && o.lr > 0, "--lr={} must be a positive number. HINT: Adam works well with 1e-3.",
             o.lr);
  VOLT_CHECK(std::isfinite(o.lr_gamma) && o.lr_gamma > 0,
             "--lr-gamma={} must be a positive number. HINT: 0.5 halves the lr every epoch; 1.0 keeps it constant.",
             o.lr_gamma);
  VOLT_CHECK(o.hidden >= 1, "--hidden={} must be at least 1. HINT: the default is 256.", o.hidden);
  VOLT_CHECK(o.batch_size >= 1, "--batch-size={} must be at least 1. HINT: the default is 64.", o.batch_size);
  VOLT_CHECK(o.num_workers >= 0, "--num-workers={} must be >= 0. HINT: 0 makes batches on the training thread.",
             o.num_workers);
  return o;
}

}  // namespace

FashionMnistModule::FashionMnistModule(ModuleOptions options)
    : volt::LightningModule("FashionMnistModule"), options_(std::move(options)) {
  if (options_.pipelined) {
    pipe_ = register_module("net", volt::Pipe(make_net(checked(options_))));
  } else {
    net_ = register_module("net", make_net(checked(options_)));
  }
  save_hyperparameters({{"model", options_.model},
                        {"lr", options_.lr},
                        {"lr_gamma", options_.lr_gamma},
                        {"batch_size", options_.batch_size},
                        {"hidden", options_.hidden},
                        {"val_size", options_.val_size}});
}

void FashionMnistModule::set_lr(double lr) {
  options_.lr = lr;
  nlohmann::json hparams = this->hparams();
  hparams["lr"] = lr;  // hparams.yaml and checkpoints record the rate that trained
  save_hyperparameters(std::move(hparams));
}

void FashionMnistModule::set_batch_size(int64_t batch_size) {
  options_.batch_size = batch_size;
  nlohmann::json hparams = this->hparams();
  hparams["batch_size"] = batch_size;
  save_hyperparameters(std::move(hparams));
}

torch::Tensor FashionMnistModule::forward(const torch::Tensor& images) {
  return pipe_ ? pipe_->forward(images) : net_->forward(images);
}

torch::Tensor FashionMnistModule::training_step(const volt::Batch& batch, int64_t) {
  // Pipelined, the loss comes per micro-batch from the Pipe, so --pipeline-schedule 1f1b can run
  // each micro-batch's backward as soon as its forward is through (the mean over the batch: each
  // micro-batch's mean weighted by its share of the rows).
  const auto rows = static_cast<double>(batch.data.size(0));
  const torch::Tensor loss = pipe_ ? pipe_->train_step(batch.data,
                                                       [&](const torch::Tensor& logits, int64_t begin, int64_t end) {
                                                         const torch::Tensor target =
                                                             batch.target.slice(0, begin, end).to(logits.device());
                                                         return torch::nn::functional::cross_entropy(logits, target) *
                                                                (static_cast<double>(end - begin) / rows);
                                                       })
                                   : torch::nn::functional::cross_entropy(net_->forward(batch.data), batch.target);
  log("train/loss", loss, {.prog_bar = true, .on_step = true, .on_epoch = true});
  return loss;
}

void FashionMnistModule::evaluate(const volt::Batch& batch, const std::string& stage) {
  const torch::Tensor logits = forward(batch.data);
  const torch::Tensor loss = torch::nn::functional::cross_entropy(logits, batch.target);
  const torch::Tensor acc = logits.argmax(1).eq(batch.target).to(torch::kDouble).mean();
  // sync_dist: under ddp each process sees a shard; the epoch means cover every example once.
  log(stage + "/loss", loss, {.prog_bar = stage == "val", .sync_dist = true});
  log(stage + "/acc", acc, {.prog_bar = true, .sync_dist = true});
}

void FashionMnistModule::validation_step(const volt::Batch& batch, int64_t) { evaluate(batch, "val"); }
void FashionMnistModule::test_step(const volt::Batch& batch, int64_t) { evaluate(batch, "test"); }

torch::Tensor FashionMnistModule::predict_step(const volt::Batch& batch, int64_t) {
  return forward(batch.data).argmax(1);
}

volt::OptimizerConfig FashionMnistModule::configure_optimizers() {
  auto adam = std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(options_.lr));
  return volt::OptimizerConfig(adam, {.scheduler = std::make_shared<volt::StepLR>(*adam, 1, options_.lr_gamma),
                                      .interval = volt::Interval::kEpoch});
}

bool FashionMnistModule::from_image_folder() const {
  return std::filesystem::is_directory(std::filesystem::path(options_.data_dir) / "train") &&
         std::filesystem::is_directory(std::filesystem::path(options_.data_dir) / "test");
}

std::shared_ptr<volt::Dataset> FashionMnistModule::image_split(const std::string& split) {
  // Gray 28x28 PNGs, scaled and normalised as the IDX path does (torchvision's ToTensor + Normalize).
  volt::datasets::ImageFolderOptions folder{
      .channels = 1,
      .transform = volt::datasets::normalize({volt::datasets::kFashionMnistMean}, {volt::datasets::kFashionMnistStd}),
      .skip_unreadable = options_.skip_unreadable};
  auto images = std::make_shared<volt::datasets::ImageFolder>(
      (std::filesystem::path(options_.data_dir) / split).string(), folder);
  folders_.push_back(images);
  return images;
}

namespace {

/// Whether `data_dir` holds .npy shards (data-*.npy in train/).
bool holds_npy_shards(const std::string& data_dir) {
  const std::filesystem::path train = std::filesystem::path(data_dir) / "train";
  if (!std::filesystem::is_directory(train)) return false;
  for (const auto& entry : std::filesystem::directory_iterator(train)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("data-", 0) == 0 && entry.path().extension() == ".npy") return true;
  }
  return false;
}

}  // namespace

bool has_validation_data(const ModuleOptions& options) {
  if (holds_npy_shards(options.data_dir))
    return std::filesystem::is_directory(std::filesystem::path(options.data_dir) / "val");
  return options.val_size > 0;
}

bool FashionMnistModule::from_npy_shards() const { return holds_npy_shards(options_.data_dir); }

volt::DataLoader FashionMnistModule::npy_loader(const std::string& split, int64_t batch_size, bool shuffle) const {
  // uint8 [28, 28] rows become [1, 28, 28] floats, normalised as the IDX path does.
  const volt::datasets::Transform normalize =
      volt::datasets::normalize({volt::datasets::kFashionMnistMean}, {volt::datasets::kFashionMnistStd});
  volt::datasets::NpyShardsOptions shards{.examples_per_shard = options_.examples_per_shard,
                                          .transform = [normalize](const torch::Tensor& row, at::Generator& generator) {
                                            const torch::Tensor image = row.scalar_type() == torch::kByte
                                                                            ? row.to(torch::kFloat).div_(255)
                                                                            : row.to(torch::kFloat);
                                            return normalize(image.unsqueeze(0), generator);
                                          }};
  auto data = std::make_shared<volt::datasets::NpyShards>(
      volt::datasets::NpyShards::in_folder((std::filesystem::path(options_.data_dir) / split).string(), shards));
  return volt::DataLoader(std::static_pointer_cast<const volt::IterableDataset>(data),
                          {.batch_size = batch_size, .shuffle = shuffle, .num_workers = options_.num_workers});
}

std::vector<std::string> FashionMnistModule::skipped_images() const {
  std::vector<std::string> out;
  for (const auto& folder : folders_) {
    const std::vector<std::string> skipped = folder->skipped_files();
    out.insert(out.end(), skipped.begin(), skipped.end());
  }
  return out;
}

void FashionMnistModule::load_training_split() {
  if (train_) return;
  std::shared_ptr<volt::Dataset> all;
  if (from_image_folder()) {
    all = image_split("train");
  } else {
    const auto data = volt::datasets::load_fashion_mnist(options_.data_dir, volt::datasets::Split::kTrain);
    all = std::make_shared<volt::TensorDataset>(data.images, data.labels);
  }
  const int64_t n = all->size();
  VOLT_CHECK(options_.val_size >= 0 && options_.val_size < n,
             "--val-size={} must be in [0, {}). HINT: 0 trains on all {} images without validation.", options_.val_size,
             n, n);
  // A fixed split (seed 42), independent of the training seed, so every run validates on the same images.
  auto generator = at::make_generator<at::CPUGeneratorImpl>(42);
  const torch::Tensor order = torch::randperm(n, generator, torch::kLong);
  train_ = std::make_shared<volt::Subset>(all, order.narrow(0, 0, n - options_.val_size));
  val_ = std::make_shared<volt::Subset>(all, order.narrow(0, n - options_.val_size, options_.val_size));
}

volt::DataLoader FashionMnistModule::train_dataloader() {
  if (from_npy_shards()) return npy_loader("train", options_.batch_size, /*shuffle=*/true);
  load_training_split();
  return volt::DataLoader(train_, {.batch_size = options_.batch_size,
                                   .shuffle = true,
                                   .num_workers = options_.num_workers,
                                   .pin_memory = options_.pin_memory});
}

volt::DataLoader FashionMnistModule::val_dataloader() {
  if (from_npy_shards()) {
    if (!std::filesystem::is_directory(std::filesystem::path(options_.data_dir) / "val")) return {};
    return npy_loader("val", 256, /*shuffle=*/false);
  }
  load_training_split();
  if (options_.val_size == 0) return {};
  return volt::DataLoader(val_, {.batch_size = 256, .num_workers = options_.num_workers});
}

volt::DataLoader FashionMnistModule::test_dataloader() {
  if (from_npy_shards()) return npy_loader("test", 256, /*shuffle=*/false);
  if (!test_ && from_image_folder()) test_ = image_split("test");
  if (!test_) {
    const auto data = volt::datasets::load_fashion_mnist(options_.data_dir, volt::datasets::Split::kTest);
    test_ = std::make_shared<volt::TensorDataset>(data.images, data.labels);
  }
  return volt::DataLoader(test_, {.batch_size = 256, .num_workers = options_.num_workers});
}

}  // namespace fashion_mnist
