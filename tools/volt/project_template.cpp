#include "project_template.h"

#include <filesystem>

#include "volt/core/error.h"

namespace volt::tool {
namespace {

namespace fs = std::filesystem;

// The templates are embedded so `volt new` works from the binary alone. @NAME@ is the project's
// name and @PREFIX@ the hint for find_package; nothing else is substituted, so C++ braces and
// CMake's ${...} stay as written.

constexpr const char* kCMakeLists = R"volt(# @NAME@: a training program built on Volt (made by `volt new`).
cmake_minimum_required(VERSION 3.18)
project(@NAME@ LANGUAGES CXX)

set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
  set(CMAKE_BUILD_TYPE RelWithDebInfo CACHE STRING "" FORCE)
endif()

# Volt's CMake package brings LibTorch and the rest with it. CMAKE_PREFIX_PATH and volt_DIR are
# searched first; VOLT_HINT_PREFIX is where Volt was installed when `volt new` ran.
set(VOLT_HINT_PREFIX "@PREFIX@" CACHE PATH "A prefix holding lib/cmake/volt/voltConfig.cmake")
find_package(volt CONFIG HINTS ${VOLT_HINT_PREFIX})
if(NOT volt_FOUND)
  message(FATAL_ERROR "Volt's CMake package (voltConfig.cmake) was not found or not usable (see above).\n"
    "HINT: install Volt (`cmake --install <volt build dir> --prefix <dir>`, or `dpkg -i volt_*.deb`) and "
    "configure with -DCMAKE_PREFIX_PATH=<dir>.")
endif()

add_executable(@NAME@ src/main.cpp)
target_link_libraries(@NAME@ PRIVATE volt::volt volt::cli)
)volt";

constexpr const char* kClassifier =
    R"volt(// Classifier: the LightningModule of @NAME@, an MLP for 28x28 images in 10 classes.
//
// It trains on Fashion-MNIST when the data is there (Debian: apt-get install
// dataset-fashion-mnist) and on synthetic images otherwise, so the project runs anywhere.
#pragma once

#include <filesystem>
#include <string>
#include <utility>

#include <volt/core/error.h>
#include <volt/datasets/fashion_mnist.h>
#include <volt/volt.h>

/// The module's hyperparameters; each is a flag of the program and a key of config.yaml.
struct ClassifierOptions {
  /// Adam's learning rate.
  double lr = 1e-3;
  /// Width of the hidden layer.
  int64_t hidden = 128;
  /// Examples per training batch.
  int64_t batch_size = 64;
  /// "fashion-mnist", "synthetic", or "auto" (Fashion-MNIST when data_dir has it).
  std::string dataset = "auto";
  /// Where the Fashion-MNIST IDX files are.
  std::string data_dir = volt::datasets::kFashionMnistDefaultDir;
};

/// Classifies images shaped [N, 1, 28, 28]; logs loss and accuracy.
class Classifier : public volt::LightningModule {
 public:
  explicit Classifier(ClassifierOptions options) : volt::LightningModule("Classifier"), options_(std::move(options)) {
    namespace nn = torch::nn;
    net_ = register_module("net", nn::Sequential(nn::Flatten(), nn::Linear(784, options_.hidden), nn::ReLU(),
                                                 nn::Linear(options_.hidden, 10)));
    save_hyperparameters({{"lr", options_.lr}, {"hidden", options_.hidden}, {"batch_size", options_.batch_size},
                          {"dataset", options_.dataset}});
  }

  torch::Tensor forward(const torch::Tensor& images) { return net_->forward(images); }

  torch::Tensor training_step(const volt::Batch& batch, int64_t) override {
    const torch::Tensor loss = torch::nn::functional::cross_entropy(forward(batch.data), batch.target);
    log("train/loss", loss, {.prog_bar = true, .on_step = true, .on_epoch = true});
    return loss;
  }

  void validation_step(const volt::Batch& batch, int64_t) override {
    const torch::Tensor logits = forward(batch.data);
    log("val/loss", torch::nn::functional::cross_entropy(logits, batch.target), {.prog_bar = true});
    log("val/acc", logits.argmax(1).eq(batch.target).to(torch::kDouble).mean(), {.prog_bar = true});
  }

  volt::OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(options_.lr));
  }

  volt::DataLoader train_dataloader() override {
    load();
    return volt::DataLoader(train_, {.batch_size = options_.batch_size, .shuffle = true});
  }

  volt::DataLoader val_dataloader() override {
    load();
    return volt::DataLoader(val_, {.batch_size = 256});
  }

 private:
  void load() {
    if (train_) return;
    if (use_fashion_mnist()) {
      namespace ds = volt::datasets;
      const ds::FashionMnist train = ds::load_fashion_mnist(options_.data_dir, ds::Split::kTrain);
      const ds::FashionMnist test = ds::load_fashion_mnist(options_.data_dir, ds::Split::kTest);
      train_ = std::make_shared<volt::TensorDataset>(train.images, train.labels);
      val_ = std::make_shared<volt::TensorDataset>(test.images, test.labels);
      return;
    }
    // Ten noisy copies of ten random prototypes: learnable in a few steps. The Trainer's seed
    // makes them the same in every run.
    const torch::Tensor prototypes = torch::randn({10, 1, 28, 28});
    const auto make = [&](int64_t n) {
      const torch::Tensor labels = torch::randint(10, {n}, torch::kLong);
      const torch::Tensor images = prototypes.index_select(0, labels) + 2.0 * torch::randn({n, 1, 28, 28});
      return std::make_shared<volt::TensorDataset>(images, labels);
    };
    train_ = make(4096);
    val_ = make(1024);
  }

  bool use_fashion_mnist() const {
    if (options_.dataset == "fashion-mnist") return true;
    if (options_.dataset == "synthetic") return false;
    if (options_.dataset != "auto") {
      throw volt::Error("--dataset=" + options_.dataset +
                        " is unknown; expected fashion-mnist, synthetic or auto. HINT: auto uses Fashion-MNIST "
                        "when --data-dir has it.");
    }
    return std::filesystem::exists(std::filesystem::path(options_.data_dir) / "train-labels-idx1-ubyte.gz") ||
           std::filesystem::exists(std::filesystem::path(options_.data_dir) / "train-labels-idx1-ubyte");
  }

  ClassifierOptions options_;
  torch::nn::Sequential net_{nullptr};
  std::shared_ptr<volt::TensorDataset> train_;
  std::shared_ptr<volt::TensorDataset> val_;
};
)volt";

constexpr const char* kMain = R"volt(// @NAME@: trains a Classifier with Volt's Trainer.
//
//   ./build/@NAME@ --config config.yaml                the settings in the file
//   ./build/@NAME@ --config config.yaml --max-epochs 1  a flag on the command line wins over the file
//   ./build/@NAME@ --print-config                       every setting with its value, as YAML
//   ./build/@NAME@ --help                               every flag (--devices, --max-steps, ...)
#include <iostream>

#include <volt/cli/trainer_flags.h>

#include "classifier.h"

int main(int argc, char** argv) {
  return volt::run_main([&] {
    CLI::App app("Train @NAME@'s Classifier with Volt.", "@NAME@");
    ClassifierOptions module_options;
    volt::TrainerOptions trainer_options;
    trainer_options.max_epochs = 3;
    volt::TrainerFlagText flag_text;
    // Also adds --config and --print-config; an option's group is its section in config.yaml.
    volt::add_trainer_flags(app, trainer_options, flag_text);
    app.add_option("--lr", module_options.lr, "Adam's learning rate")->capture_default_str()->group("Model");
    app.add_option("--hidden", module_options.hidden, "width of the hidden layer")->capture_default_str()->group("Model");
    app.add_option("--batch-size", module_options.batch_size, "examples per batch")->capture_default_str()->group("Data");
    app.add_option("--dataset", module_options.dataset, "fashion-mnist, synthetic or auto")
        ->capture_default_str()
        ->group("Data");
    app.add_option("--data-dir", module_options.data_dir, "where the Fashion-MNIST files are")
        ->capture_default_str()
        ->group("Data");
    if (const std::optional<int> code = volt::parse_command_line(app, argc, argv)) return *code;
    volt::apply_trainer_flags(flag_text, trainer_options);
    volt::Trainer trainer(trainer_options);
    Classifier model(module_options);  // after the Trainer, which seeded LibTorch
    const volt::FitResult result = trainer.fit(model);
    if (trainer.plan().is_global_zero()) std::cout << result.full_report() << result.brief_report() << "\n";
    return result.reason == volt::StopReason::kInterrupted ? 130 : 0;
  });
}
)volt";

constexpr const char* kConfig =
    R"volt(# Settings of @NAME@, read with `--config config.yaml`; a flag on the command line wins.
# `./build/@NAME@ --print-config` prints every key with its value.
trainer:
  max_epochs: 3
  seed: 0
model:
  lr: 0.001
  hidden: 128
data:
  batch_size: 64
  dataset: auto
)volt";

constexpr const char* kReadme = R"volt(# @NAME@

A training program built on Volt (made by `volt new`): `src/classifier.h`
is the LightningModule (an MLP on Fashion-MNIST, or on synthetic images when the data set is not
installed), `src/main.cpp` the command line, `config.yaml` its settings.

## Build and train

```bash
cmake -S . -B build            # add -DCMAKE_PREFIX_PATH=<volt prefix> if Volt is not found
cmake --build build -j
./build/@NAME@ --config config.yaml
volt plot lightning_logs/version_0     # loss and accuracy curves as metrics.png
```

Logs and checkpoints go to `lightning_logs/version_N/` (`--default-root-dir` moves them).
`./build/@NAME@ --help` lists every flag; `--max-epochs 1 --dataset synthetic` trains in seconds.
)volt";

constexpr const char* kGitignore = R"volt(build/
lightning_logs/
)volt";

std::string substitute(std::string text, const std::string& name, const std::string& prefix) {
  for (const auto& [key, value] : {std::pair<std::string, std::string>{"@NAME@", name}, {"@PREFIX@", prefix}}) {
    for (std::size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + value.size())) {
      text.replace(at, key.size(), value);
    }
  }
  return text;
}

}  // namespace

std::string project_name_from_dir(const std::string& dir) {
  fs::path path = fs::path(dir).lexically_normal();
  if (!path.empty() && path.filename().empty()) path = path.parent_path();  // "a/b/" -> "a/b"
  const std::string last = path.filename().string();
  std::string name;
  for (const char c : last) {
    const bool word = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    name += word ? c : '_';
  }
  VOLT_CHECK(!name.empty() && name != "." && name != ".." && name.find_first_not_of('_') != std::string::npos,
             "cannot name a project after the directory '{}'. HINT: give a directory such as my_model, or pass "
             "--name.",
             dir);
  if (name[0] >= '0' && name[0] <= '9') name = "_" + name;
  return name;
}

std::vector<ProjectFile> render_project(const std::string& name, const std::string& volt_prefix) {
  std::vector<ProjectFile> files = {
      {"CMakeLists.txt", kCMakeLists}, {"src/main.cpp", kMain}, {"src/classifier.h", kClassifier},
      {"config.yaml", kConfig},        {"README.md", kReadme},  {".gitignore", kGitignore},
  };
  for (auto& file : files) file.text = substitute(file.text, name, volt_prefix);
  return files;
}

std::string installed_prefix_of(const std::string& executable) {
  std::error_code error;
  const fs::path bin = fs::weakly_canonical(fs::path(executable), error).parent_path();
  if (error || bin.filename() != "bin") return "";
  const fs::path prefix = bin.parent_path();
  for (const char* libdir : {"lib", "lib64", "lib/x86_64-linux-gnu"}) {
    if (fs::exists(prefix / libdir / "cmake/volt/voltConfig.cmake", error)) return prefix.string();
  }
  return "";
}

}  // namespace volt::tool
