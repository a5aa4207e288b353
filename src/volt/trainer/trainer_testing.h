// Test helpers shared by the Trainer's behaviour tests (trainer_test, resume_test,
// trainer_requeue_test): a tiny synthetic module, recording fakes and a fixture whose runs are
// seeded, single-threaded and written into a fresh directory, so "bit-identical" is exact.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "volt/callbacks/early_stopping.h"
#include "volt/callbacks/lr_monitor.h"
#include "volt/callbacks/model_checkpoint.h"
#include "volt/checkpoint/checkpoint_io.h"
#include "volt/checkpoint/checkpoint_state.h"
#include "volt/checkpoint/hpc_checkpoints.h"
#include "volt/core/error.h"
#include "volt/loggers/logger.h"
#include "volt/metrics/mean_squared_error.h"
#include "volt/optim/lr_scheduler.h"
#include "volt/precision/precision_plugin.h"
#include "volt/trainer/trainer.h"

namespace volt::trainer_testing {

namespace fs = std::filesystem;

/// `n` examples of 4 features and `outputs` targets from a private generator, so making data
/// never moves the global RNG that the Trainer seeds and checkpoints.
inline std::shared_ptr<TensorDataset> make_dataset(int64_t n, uint64_t seed, int64_t outputs) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  torch::Tensor x = torch::randn({n, 4}, generator);
  torch::Tensor y = torch::randn({n, outputs}, generator);
  return std::make_shared<TensorDataset>(x, y);
}

enum class Optim { kSgd, kAdam };

/// What TinyModule is and does; the defaults give 4 training and 2 validation batches of 4.
struct TinyOptions {
  int64_t train_size = 16;
  int64_t val_size = 8;
  int64_t batch_size = 4;
  bool shuffle = true;
  int64_t outputs = 1;
  /// Dropout on the inputs (> 0 makes training consume the global RNG).
  double dropout = 0.0;
  Optim optimizer = Optim::kSgd;
  double lr = 0.1;
  /// A StepLR(step_size=2, gamma=0.5) stepping at this interval; unset: none.
  std::optional<Interval> scheduler;
  /// When not empty, validation logs val/loss = scripted_val_loss[run] instead of the real loss.
  std::vector<double> scripted_val_loss;
  /// The loaders' worker threads (DataLoaderOptions::num_workers) and whether they persist.
  int64_t num_workers = 0;
  bool persistent_workers = false;
  /// Manual optimization: training_step backpropagates and steps the optimizer itself, as the
  /// Trainer would (and steps a step-interval scheduler after it).
  bool manual = false;
  /// Also log Metrics: "train/mse" and "val/mse" (MeanSquaredError, registered so checkpoints
  /// carry them), with the same squared errors summed by hand in `sums` for comparison.
  bool metric = false;

  // Faults, for the error and control tests.
  bool detached_loss = false;     ///< training_step returns a tensor without grad
  bool no_optimizer = false;      ///< configure_optimizers returns nothing
  bool no_train_data = false;     ///< train_dataloader returns none
  int64_t sigint_at_batch = -1;   ///< training_step raises SIGINT at this batch index
  int64_t signal_at_batch = -1;   ///< training_step raises `signal` at this batch index ...
  int signal = SIGUSR1;           ///< ... (SLURM's requeue signal by default)
  bool draw_rng_on_load = false;  ///< on_load_checkpoint consumes the global RNG
  int64_t crash_at_step = -1;     ///< training_step throws (a crash) once global_step() is this
};

/// Linear(4, outputs) regression with MSE, recording every hook it sees in `calls`.
class TinyModule : public LightningModule {
 public:
  explicit TinyModule(TinyOptions options = {}) : LightningModule("TinyModule"), options_(std::move(options)) {
    linear_ = register_module("linear", torch::nn::Linear(4, options_.outputs));
    if (options_.dropout > 0) dropout_ = register_module("dropout", torch::nn::Dropout(options_.dropout));
    train_data_ = make_dataset(options_.train_size, 1, options_.outputs);
    val_data_ = make_dataset(options_.val_size, 2, options_.outputs);
    set_automatic_optimization(!options_.manual);
    if (options_.metric) {
      register_metric("train_mse", train_mse_);
      register_metric("val_mse", val_mse_);
    }
  }

  /// The prediction for inputs `x`.
  torch::Tensor forward(torch::Tensor x) {
    if (!dropout_.is_empty()) x = dropout_->forward(x);
    return linear_->forward(x);
  }
  /// The loss of one batch, without logging (for hand-written reference loops).
  torch::Tensor loss(const Batch& batch) { return torch::mse_loss(forward(batch.data), batch.target); }

  torch::Tensor training_step(const Batch& batch, int64_t batch_idx) override {
    calls.push_back("training_step");
    if (batch_idx == options_.sigint_at_batch) ::raise(SIGINT);
    if (batch_idx == options_.signal_at_batch) ::raise(options_.signal);
    if (global_step() == options_.crash_at_step) throw std::runtime_error("crash injected by the test");
    torch::Tensor value = loss(batch);
    log("train/loss", value, {.prog_bar = true, .on_epoch = true});
    if (options_.metric) log_mse("train/mse", train_mse_, batch, sums.train);
    if (options_.manual) {
      LightningOptimizer optimizer = optimizers().at(0);
      manual_backward(value);
      optimizer.step();
      optimizer.zero_grad();
      if (options_.scheduler == Interval::kStep) lr_schedulers().at(0)->step();
    }
    return options_.detached_loss ? value.detach() : value;
  }
  void validation_step(const Batch& batch, int64_t batch_idx) override {
    calls.push_back("validation_step");
    if (options_.scripted_val_loss.empty()) {
      log("val/loss", loss(batch), {.prog_bar = true});
    } else {
      const auto run = static_cast<size_t>(validation_runs_ - 1) % options_.scripted_val_loss.size();
      log("val/loss", options_.scripted_val_loss[run]);
    }
    log("val/examples", static_cast<double>(batch.data.size(0)), {.reduce_fx = Reduce::kSum});
    if (options_.metric) log_mse("val/mse", val_mse_, batch, sums.val);
  }
  void test_step(const Batch& batch, int64_t batch_idx) override {
    calls.push_back("test_step");
    log("test/loss", loss(batch));
  }
  torch::Tensor predict_step(const Batch& batch, int64_t batch_idx) override { return forward(batch.data); }

  OptimizerConfig configure_optimizers() override {
    calls.push_back("configure_optimizers");
    if (options_.no_optimizer) return {};
    std::shared_ptr<torch::optim::Optimizer> optimizer;
    if (options_.optimizer == Optim::kAdam) {
      optimizer = std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(options_.lr));
    } else {
      optimizer = std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(options_.lr));
    }
    OptimizerConfig config;
    config.optimizers.push_back(optimizer);
    if (options_.scheduler) {
      config.schedulers.push_back({.scheduler = std::make_shared<StepLR>(*optimizer, /*step_size=*/2, /*gamma=*/0.5),
                                   .interval = *options_.scheduler});
    }
    return config;
  }

  DataLoader train_dataloader() override {
    if (options_.no_train_data) return {};
    return DataLoader(train_data_, {.batch_size = options_.batch_size,
                                    .shuffle = options_.shuffle,
                                    .num_workers = options_.num_workers,
                                    .persistent_workers = options_.persistent_workers});
  }
  DataLoader val_dataloader() override {
    return DataLoader(val_data_, {.batch_size = options_.batch_size,
                                  .num_workers = options_.num_workers,
                                  .persistent_workers = options_.persistent_workers});
  }
  DataLoader test_dataloader() override { return val_dataloader(); }
  DataLoader predict_dataloader() override { return val_dataloader(); }

  void on_fit_start() override { calls.push_back("on_fit_start"); }
  void on_fit_end() override { calls.push_back("on_fit_end"); }
  void on_train_start() override { calls.push_back("on_train_start"); }
  void on_train_end() override { calls.push_back("on_train_end"); }
  void on_train_epoch_start() override {
    calls.push_back("on_train_epoch_start");
    sums.train = {};
  }
  void on_train_epoch_end() override {
    calls.push_back("on_train_epoch_end");
    if (options_.manual && options_.scheduler == Interval::kEpoch) lr_schedulers().at(0)->step();
  }
  void on_train_batch_start(const Batch&, int64_t) override { calls.push_back("on_train_batch_start"); }
  void on_train_batch_end(const torch::Tensor&, const Batch&, int64_t) override {
    calls.push_back("on_train_batch_end");
  }
  void on_validation_epoch_start() override {
    ++validation_runs_;
    sums.val = {};
    calls.push_back("on_validation_epoch_start");
  }
  void on_validation_epoch_end() override { calls.push_back("on_validation_epoch_end"); }
  void on_before_optimizer_step(torch::optim::Optimizer&, size_t) override {
    calls.push_back("on_before_optimizer_step");
  }
  void on_load_checkpoint(const StateDict&) override {
    if (options_.draw_rng_on_load) (void)torch::rand({1});
  }

  /// How often `hook` was called.
  int64_t count(const std::string& hook) const { return std::count(calls.begin(), calls.end(), hook); }
  /// The training data.
  const std::shared_ptr<TensorDataset>& train_data() const { return train_data_; }
  /// The validation data.
  const std::shared_ptr<TensorDataset>& val_data() const { return val_data_; }

  /// Every hook and step, in call order.
  std::vector<std::string> calls;
  /// Squared errors and their count, summed by hand in float64 (TinyOptions::metric).
  struct Sum {
    double squares = 0;
    int64_t count = 0;
  };
  /// The current (or last) training epoch's and validation pass's sums.
  struct {
    Sum train;
    Sum val;
  } sums;

 private:
  TinyOptions options_;
  torch::nn::Linear linear_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
  std::shared_ptr<TensorDataset> train_data_;
  std::shared_ptr<TensorDataset> val_data_;
  int64_t validation_runs_ = 0;
  MeanSquaredError train_mse_;
  MeanSquaredError val_mse_;

  void log_mse(const std::string& name, MeanSquaredError& metric, const Batch& batch, Sum& sum) {
    const torch::Tensor pred = forward(batch.data).detach();
    metric.update(pred, batch.target);
    sum.squares += (pred - batch.target).to(torch::kDouble).pow(2).sum().item<double>();
    sum.count += batch.target.numel();
    log(name, metric);
  }
};

/// A module built from a fixed seed, so two calls with the same seed have the same weights.
inline std::unique_ptr<TinyModule> make_module(TinyOptions options = {}, uint64_t init_seed = 7) {
  torch::manual_seed(init_seed);
  return std::make_unique<TinyModule>(std::move(options));
}

/// Keeps every save in memory and remembers it even after ModelCheckpoint removes it.
class RecordingCheckpointIO : public InMemoryCheckpointIO {
 public:
  void save(const c10::IValue& checkpoint, const std::string& path) override {
    saves.push_back(path);
    InMemoryCheckpointIO::save(checkpoint, path);
  }
  /// Every save, in order.
  std::vector<std::string> saves;
};

/// Records the callback metrics each training epoch starts with.
class MetricsAtEpochStart : public Callback {
 public:
  std::string state_key() const override { return "MetricsAtEpochStart"; }
  Decision on_train_epoch_start(const CallbackContext& context, CallbackServices&) override {
    seen.push_back(*context.metrics);
    return {};
  }
  std::vector<std::map<std::string, double>> seen;
};

/// The module's parameters by name, copied.
inline std::map<std::string, torch::Tensor> parameters_of(const torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : module.named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

/// Success when every parameter is bit-identical (torch::equal); names the first that is not.
inline ::testing::AssertionResult bit_identical(const std::map<std::string, torch::Tensor>& a,
                                                const std::map<std::string, torch::Tensor>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << a.size() << " vs " << b.size() << " parameters";
  for (const auto& [name, tensor] : a) {
    const auto other = b.find(name);
    if (other == b.end()) return ::testing::AssertionFailure() << "missing parameter " << name;
    if (!torch::equal(tensor, other->second)) {
      return ::testing::AssertionFailure()
             << name << " differs by up to " << (tensor - other->second).abs().max().item<double>();
    }
  }
  return ::testing::AssertionSuccess();
}

/// The checkpoint under `path` of `io`, as a dictionary.
inline StateDict load_dict(CheckpointIO& io, const std::string& path) { return io.load(path).toGenericDict(); }

/// The module weights saved in the checkpoint under `path`.
inline std::map<std::string, torch::Tensor> weights_in(CheckpointIO& io, const std::string& path) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& e : load_dict(io, path).at("state_dict").toGenericDict())
    out[e.key().toStringRef()] = e.value().toTensor();
  return out;
}

/// The single path in `paths` that ends with `suffix` (fails the test when not exactly one).
inline std::string path_ending_with(const std::vector<std::string>& paths, const std::string& suffix) {
  std::vector<std::string> found;
  for (const auto& p : paths)
    if (p.size() >= suffix.size() && p.compare(p.size() - suffix.size(), suffix.size(), suffix) == 0)
      found.push_back(p);
  EXPECT_EQ(found.size(), 1u) << "no single checkpoint ending with " << suffix;
  return found.empty() ? "" : found.front();
}

/// The *.ckpt files under `dir`, recursively, relative to it and sorted.
inline std::vector<std::string> checkpoint_files(const fs::path& dir) {
  std::vector<std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& entry : fs::recursive_directory_iterator(dir))
    if (entry.path().extension() == ".ckpt") out.push_back(fs::relative(entry.path(), dir).string());
  std::sort(out.begin(), out.end());
  return out;
}

/// The number of training batches run before each validation.
inline std::vector<int64_t> validation_points(const TinyModule& module) {
  std::vector<int64_t> out;
  int64_t batches = 0;
  for (const auto& call : module.calls) {
    if (call == "training_step") ++batches;
    if (call == "on_validation_epoch_start") out.push_back(batches);
  }
  return out;
}

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fs::temp_directory_path() / fmt::format("volt_trainer_test_{}_{}", info->name(), ::getpid());
    fs::remove_all(root_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  /// `options` made quiet and local: no bar, no summary, one thread, this test's root dir; the
  /// default CSV logger only when `logger`.
  TrainerOptions quiet(TrainerOptions options, bool logger = false) const {
    options.num_threads = 1;
    options.enable_progress_bar = false;
    options.enable_model_summary = false;
    options.logger = logger;
    if (options.default_root_dir.empty()) options.default_root_dir = root_.string();
    return options;
  }
  /// The folder that stands in for /dev/shm (VOLT_SNAPSHOT_MEMORY_DIR): the snapshots' memory
  /// tier of this test's runs, removed with its root.
  std::string memory_root() const { return (root_ / "shm").string(); }
  /// A Trainer over quiet(options) in an environment that names only memory_root().
  Trainer make_trainer(TrainerOptions options, bool logger = false) const {
    return Trainer(quiet(std::move(options), logger), Env(Env::Vars{{"VOLT_SNAPSHOT_MEMORY_DIR", memory_root()}}),
                   MachineInfo{1, "/tmp"});
  }

  fs::path root_;
};

// ---- hooks and loop structure -----------------------------------------------------------------

}  // namespace volt::trainer_testing
