// Behaviour tests of volt::Trainer against Lightning's semantics, on a tiny synthetic module.
//
// Every run is seeded, single-threaded and writes into a fresh directory, so the "bit-identical"
// assertions of the resume tests are exact, not statistical.
#include "volt/trainer/trainer.h"

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
#include "volt/core/error.h"
#include "volt/loggers/logger.h"
#include "volt/optim/lr_scheduler.h"
#include "volt/precision/precision_plugin.h"
#include "volt/trainer/checkpoint_state.h"
#include "volt/trainer/hpc_checkpoints.h"

namespace volt {
namespace {

namespace fs = std::filesystem;

/// `n` examples of 4 features and `outputs` targets from a private generator, so making data
/// never moves the global RNG that the Trainer seeds and checkpoints.
std::shared_ptr<TensorDataset> make_dataset(int64_t n, uint64_t seed, int64_t outputs) {
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

  // Faults, for the error and control tests.
  bool detached_loss = false;     ///< training_step returns a tensor without grad
  bool no_optimizer = false;      ///< configure_optimizers returns nothing
  bool no_train_data = false;     ///< train_dataloader returns none
  int64_t sigint_at_batch = -1;   ///< training_step raises SIGINT at this batch index
  int64_t signal_at_batch = -1;   ///< training_step raises `signal` at this batch index ...
  int signal = SIGUSR1;           ///< ... (SLURM's requeue signal by default)
  bool draw_rng_on_load = false;  ///< on_load_checkpoint consumes the global RNG
};

/// Linear(4, outputs) regression with MSE, recording every hook it sees in `calls`.
class TinyModule : public LightningModule {
 public:
  explicit TinyModule(TinyOptions options = {}) : LightningModule("TinyModule"), options_(std::move(options)) {
    linear_ = register_module("linear", torch::nn::Linear(4, options_.outputs));
    if (options_.dropout > 0) dropout_ = register_module("dropout", torch::nn::Dropout(options_.dropout));
    train_data_ = make_dataset(options_.train_size, 1, options_.outputs);
    val_data_ = make_dataset(options_.val_size, 2, options_.outputs);
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
    torch::Tensor value = loss(batch);
    log("train/loss", value, {.prog_bar = true, .on_epoch = true});
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
    return DataLoader(train_data_, {.batch_size = options_.batch_size, .shuffle = options_.shuffle});
  }
  DataLoader val_dataloader() override { return DataLoader(val_data_, {.batch_size = options_.batch_size}); }
  DataLoader test_dataloader() override { return val_dataloader(); }
  DataLoader predict_dataloader() override { return val_dataloader(); }

  void on_fit_start() override { calls.push_back("on_fit_start"); }
  void on_fit_end() override { calls.push_back("on_fit_end"); }
  void on_train_start() override { calls.push_back("on_train_start"); }
  void on_train_end() override { calls.push_back("on_train_end"); }
  void on_train_epoch_start() override { calls.push_back("on_train_epoch_start"); }
  void on_train_epoch_end() override { calls.push_back("on_train_epoch_end"); }
  void on_train_batch_start(const Batch&, int64_t) override { calls.push_back("on_train_batch_start"); }
  void on_train_batch_end(const torch::Tensor&, const Batch&, int64_t) override {
    calls.push_back("on_train_batch_end");
  }
  void on_validation_epoch_start() override {
    ++validation_runs_;
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

 private:
  TinyOptions options_;
  torch::nn::Linear linear_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
  std::shared_ptr<TensorDataset> train_data_;
  std::shared_ptr<TensorDataset> val_data_;
  int64_t validation_runs_ = 0;
};

/// A module built from a fixed seed, so two calls with the same seed have the same weights.
std::unique_ptr<TinyModule> make_module(TinyOptions options = {}, uint64_t init_seed = 7) {
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
std::map<std::string, torch::Tensor> parameters_of(const torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : module.named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

/// Success when every parameter is bit-identical (torch::equal); names the first that is not.
::testing::AssertionResult bit_identical(const std::map<std::string, torch::Tensor>& a,
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
StateDict load_dict(CheckpointIO& io, const std::string& path) { return io.load(path).toGenericDict(); }

/// The module weights saved in the checkpoint under `path`.
std::map<std::string, torch::Tensor> weights_in(CheckpointIO& io, const std::string& path) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& e : load_dict(io, path).at("state_dict").toGenericDict())
    out[e.key().toStringRef()] = e.value().toTensor();
  return out;
}

/// The single path in `paths` that ends with `suffix` (fails the test when not exactly one).
std::string path_ending_with(const std::vector<std::string>& paths, const std::string& suffix) {
  std::vector<std::string> found;
  for (const auto& p : paths)
    if (p.size() >= suffix.size() && p.compare(p.size() - suffix.size(), suffix.size(), suffix) == 0)
      found.push_back(p);
  EXPECT_EQ(found.size(), 1u) << "no single checkpoint ending with " << suffix;
  return found.empty() ? "" : found.front();
}

/// The *.ckpt files under `dir`, recursively, relative to it and sorted.
std::vector<std::string> checkpoint_files(const fs::path& dir) {
  std::vector<std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& entry : fs::recursive_directory_iterator(dir))
    if (entry.path().extension() == ".ckpt") out.push_back(fs::relative(entry.path(), dir).string());
  std::sort(out.begin(), out.end());
  return out;
}

/// The number of training batches run before each validation.
std::vector<int64_t> validation_points(const TinyModule& module) {
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
  /// A Trainer over quiet(options) with an empty environment.
  Trainer make_trainer(TrainerOptions options, bool logger = false) const {
    return Trainer(quiet(std::move(options), logger), Env(Env::Vars{}), MachineInfo{1, "/tmp"});
  }

  fs::path root_;
};

// ---- hooks and loop structure -----------------------------------------------------------------

TEST_F(TrainerTest, FitCallsHooksInLightningsOrderWithASanityCheckFirst) {
  auto module = make_module({.train_size = 8, .val_size = 12});  // 2 training, 3 validation batches
  Trainer trainer = make_trainer({.max_epochs = 1, .num_sanity_val_steps = 2, .enable_checkpointing = false});
  trainer.fit(*module);

  std::vector<std::string> expected = {"configure_optimizers", "on_fit_start",
                                       // sanity check: 2 batches
                                       "on_validation_epoch_start", "validation_step", "validation_step",
                                       "on_validation_epoch_end", "on_train_start", "on_train_epoch_start"};
  for (int i = 0; i < 2; ++i) {
    for (const char* hook : {"on_train_batch_start", "training_step", "on_before_optimizer_step", "on_train_batch_end"})
      expected.push_back(hook);
  }
  for (const char* hook : {"on_validation_epoch_start", "validation_step", "validation_step", "validation_step",
                           "on_validation_epoch_end", "on_train_epoch_end", "on_train_end", "on_fit_end"})
    expected.push_back(hook);
  EXPECT_EQ(module->calls, expected);
}

TEST_F(TrainerTest, SanityCheckMetricsAreNotReported) {
  auto module = make_module();
  auto recorder = std::make_shared<MetricsAtEpochStart>();
  Trainer trainer = make_trainer({.max_epochs = 1, .num_sanity_val_steps = 2, .callbacks = {recorder}});
  trainer.fit(*module);
  ASSERT_EQ(recorder->seen.size(), 1u);
  EXPECT_EQ(recorder->seen[0].count("val/loss"), 0u) << "the sanity check's val/loss leaked into the metrics";
  EXPECT_EQ(module->count("validation_step"), 2 + 2);  // sanity (2 batches) + one full validation (2)
}

TEST_F(TrainerTest, MaxEpochsBoundsTheRun) {
  auto module = make_module();
  Trainer trainer = make_trainer({.max_epochs = 3});
  const FitResult result = trainer.fit(*module);
  EXPECT_EQ(result.reason, StopReason::kMaxEpochs);
  EXPECT_EQ(result.epochs_completed, 3);
  EXPECT_EQ(result.global_step, 12);
  EXPECT_EQ(module->count("on_train_epoch_start"), 3);
  EXPECT_EQ(module->count("training_step"), 12);
}

TEST_F(TrainerTest, MaxStepsStopsInTheMiddleOfAnEpoch) {
  auto module = make_module();
  Trainer trainer = make_trainer({.max_epochs = 5, .max_steps = 6});
  const FitResult result = trainer.fit(*module);
  EXPECT_EQ(result.reason, StopReason::kMaxSteps);
  EXPECT_EQ(result.global_step, 6);
  EXPECT_EQ(result.epochs_completed, 1) << "epoch 1 stopped after 2 of its 4 batches";
  EXPECT_EQ(module->count("training_step"), 6);
}

TEST_F(TrainerTest, LimitTrainBatchesTakesACountOrAFraction) {
  auto counted = make_module({.train_size = 40});  // 10 batches
  make_trainer({.max_epochs = 2, .limit_train_batches = 3}).fit(*counted);
  EXPECT_EQ(counted->count("training_step"), 2 * 3);

  auto fraction = make_module({.train_size = 40});
  const FitResult result = make_trainer({.max_epochs = 2, .limit_train_batches = 0.25}).fit(*fraction);
  EXPECT_EQ(fraction->count("training_step"), 2 * 2) << "floor(10 * 0.25) = 2 batches per epoch";
  EXPECT_EQ(result.global_step, 4);
}

TEST_F(TrainerTest, LimitValBatchesZeroDisablesValidation) {
  auto module = make_module();
  const FitResult result = make_trainer({.max_epochs = 2, .limit_val_batches = 0}).fit(*module);
  EXPECT_EQ(module->count("validation_step"), 0);
  EXPECT_EQ(module->count("on_validation_epoch_start"), 0);
  EXPECT_EQ(result.metrics.count("val/loss"), 0u);
  EXPECT_EQ(result.epochs_completed, 2);
}

TEST_F(TrainerTest, CheckValEveryNEpochValidatesOnlyOnThoseEpochs) {
  auto module = make_module();
  make_trainer({.max_epochs = 4, .check_val_every_n_epoch = 2, .num_sanity_val_steps = 0}).fit(*module);
  EXPECT_EQ(module->count("on_validation_epoch_start"), 2);
  EXPECT_EQ(validation_points(*module), (std::vector<int64_t>{8, 16}));
}

TEST_F(TrainerTest, ValCheckIntervalAsAFractionValidatesTwicePerEpoch) {
  auto module = make_module();  // 4 batches per epoch
  make_trainer({.max_epochs = 2, .val_check_interval = 0.5, .num_sanity_val_steps = 0}).fit(*module);
  EXPECT_EQ(validation_points(*module), (std::vector<int64_t>{2, 4, 6, 8}));
}

TEST_F(TrainerTest, ValCheckIntervalAsACountValidatesEveryThatManyBatches) {
  auto module = make_module({.train_size = 24});  // 6 batches per epoch
  make_trainer({.max_epochs = 1, .val_check_interval = 2, .num_sanity_val_steps = 0}).fit(*module);
  EXPECT_EQ(validation_points(*module), (std::vector<int64_t>{2, 4, 6}));
}

// ---- optimization ------------------------------------------------------------------------------

/// The first `batches` batches of `data` in order (batch size `batch_size`), as the Trainer sees
/// them from an unshuffled loader.
std::vector<Batch> batches_of(const std::shared_ptr<TensorDataset>& data, int64_t batch_size, int64_t batches) {
  DataLoader loader(data, {.batch_size = batch_size});
  loader.set_epoch(0);
  std::vector<Batch> out;
  for (int64_t i = 0; i < batches; ++i) out.push_back(loader.batch(i));
  return out;
}

TEST_F(TrainerTest, AccumulateGradBatchesStepsOnceEveryKBatchesWithTheMeanGradient) {
  const TinyOptions options{.train_size = 16, .batch_size = 2, .shuffle = false};  // 8 batches
  auto module = make_module(options);
  auto reference = make_module(options);
  const FitResult result =
      make_trainer({.max_epochs = 1, .limit_val_batches = 0, .accumulate_grad_batches = 4}).fit(*module);
  EXPECT_EQ(result.global_step, 2);
  EXPECT_EQ(module->count("on_before_optimizer_step"), 2);

  // By hand: sum the gradients of loss/k over k batches, then step.
  torch::optim::SGD sgd(reference->parameters(), torch::optim::SGDOptions(0.1));
  const auto batches = batches_of(reference->train_data(), 2, 8);
  for (size_t i = 0; i < batches.size(); ++i) {
    (reference->loss(batches[i]) / 4.0).backward();
    if ((i + 1) % 4 == 0) {
      sgd.step();
      sgd.zero_grad();
    }
  }
  EXPECT_TRUE(bit_identical(parameters_of(*module), parameters_of(*reference)));
}

TEST_F(TrainerTest, AnIncompleteLastAccumulationStillSteps) {
  auto module = make_module({.train_size = 14, .batch_size = 2});  // 7 batches
  const FitResult result =
      make_trainer({.max_epochs = 2, .limit_val_batches = 0, .accumulate_grad_batches = 2}).fit(*module);
  EXPECT_EQ(result.global_step, 2 * 4) << "ceil(7 / 2) = 4 steps per epoch, as in Lightning";
}

/// Trains `reference` by hand for `batches` SGD steps, clipping each step's gradients with `clip`.
void train_by_hand(TinyModule& reference, int64_t batches,
                   const std::function<void(std::vector<torch::Tensor>&)>& clip) {
  std::vector<torch::Tensor> params = reference.parameters();
  torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.1));
  for (const Batch& batch : batches_of(reference.train_data(), 4, batches)) {
    reference.loss(batch).backward();
    clip(params);
    sgd.step();
    sgd.zero_grad();
  }
}

TEST_F(TrainerTest, GradientClippingByNormMatchesClipGradNorm) {
  const TinyOptions options{.shuffle = false};
  auto module = make_module(options);
  make_trainer({.max_epochs = 1, .limit_val_batches = 0, .gradient_clip_val = 0.05}).fit(*module);

  auto clipped = make_module(options);
  train_by_hand(*clipped, 4, [](std::vector<torch::Tensor>& p) { torch::nn::utils::clip_grad_norm_(p, 0.05); });
  EXPECT_TRUE(bit_identical(parameters_of(*module), parameters_of(*clipped)));

  // Control: the threshold is low enough that clipping changed the result.
  auto unclipped = make_module(options);
  train_by_hand(*unclipped, 4, [](std::vector<torch::Tensor>&) {});
  EXPECT_FALSE(bit_identical(parameters_of(*module), parameters_of(*unclipped)));
}

TEST_F(TrainerTest, GradientClippingByValueMatchesClipGradValue) {
  const TinyOptions options{.shuffle = false};
  auto module = make_module(options);
  make_trainer({.max_epochs = 1,
                .limit_val_batches = 0,
                .gradient_clip_val = 0.01,
                .gradient_clip_algorithm = GradientClipAlgorithm::kValue})
      .fit(*module);

  auto clipped = make_module(options);
  train_by_hand(*clipped, 4, [](std::vector<torch::Tensor>& p) { torch::nn::utils::clip_grad_value_(p, 0.01); });
  EXPECT_TRUE(bit_identical(parameters_of(*module), parameters_of(*clipped)));

  auto unclipped = make_module(options);
  train_by_hand(*unclipped, 4, [](std::vector<torch::Tensor>&) {});
  EXPECT_FALSE(bit_identical(parameters_of(*module), parameters_of(*unclipped)));
}

// ---- logging -------------------------------------------------------------------------------------

/// Logs batch indices in several ways, to check aggregation and naming.
class IndexLogger : public TinyModule {
 public:
  using TinyModule::TinyModule;
  torch::Tensor training_step(const Batch& batch, int64_t batch_idx) override {
    const auto index = static_cast<double>(batch_idx);
    log("both", index, {.prog_bar = true, .on_step = true, .on_epoch = true});
    log("step_only", index);  // training default: on_step only
    log("epoch_only", index, {.on_step = false, .on_epoch = true});
    log("max", index, {.on_step = false, .on_epoch = true, .reduce_fx = Reduce::kMax});
    return loss(batch);
  }
};

TEST_F(TrainerTest, EpochMeansAreWeightedByBatchSize) {
  torch::manual_seed(7);
  IndexLogger module({.train_size = 10, .batch_size = 4, .shuffle = false});  // batches of 4, 4, 2
  Trainer trainer = make_trainer({.max_epochs = 1, .limit_val_batches = 0});
  const FitResult result = trainer.fit(module);

  const double weighted = (0 * 4 + 1 * 4 + 2 * 2) / 10.0;  // 0.8; an unweighted mean would be 1.0
  EXPECT_DOUBLE_EQ(result.metrics.at("both"), weighted) << "on_step+on_epoch: the plain name is the epoch value";
  EXPECT_DOUBLE_EQ(result.metrics.at("both_epoch"), weighted);
  EXPECT_DOUBLE_EQ(result.metrics.at("both_step"), 2.0);
  EXPECT_DOUBLE_EQ(result.metrics.at("step_only"), 2.0);
  EXPECT_EQ(result.metrics.count("step_only_epoch"), 0u);
  EXPECT_DOUBLE_EQ(result.metrics.at("epoch_only"), weighted);
  EXPECT_DOUBLE_EQ(result.metrics.at("max"), 2.0);
  EXPECT_EQ(trainer.callback_metrics(), result.metrics);
}

TEST_F(TrainerTest, ValidationMetricsCoverTheWholeLimitedValidationSet) {
  auto module = make_module({.val_size = 10});  // validation batches of 4, 4, 2
  Trainer trainer = make_trainer({.max_epochs = 1, .limit_val_batches = 2});
  const FitResult result = trainer.fit(*module);

  EXPECT_DOUBLE_EQ(result.metrics.at("val/examples"), 8.0) << "2 batches of 4";
  // The validation after the last step saw the final weights: the mean over those 8 examples.
  torch::NoGradGuard no_grad;
  module->eval();
  const Batch first8 = module->val_data()->get_batch(torch::arange(8));
  EXPECT_NEAR(result.metrics.at("val/loss"), module->loss(first8).item<double>(), 1e-6);
}

TEST_F(TrainerTest, ValidateWeighsUnevenBatchesBySize) {
  auto module = make_module({.val_size = 10});  // batches of 4, 4, 2
  Trainer trainer = make_trainer({});
  const EvalResult result = trainer.validate(*module);
  EXPECT_EQ(result.stage, "validate");
  EXPECT_EQ(result.batches, 3);
  EXPECT_EQ(result.examples, 10);
  torch::NoGradGuard no_grad;
  const Batch all = module->val_data()->get_batch(torch::arange(10));
  EXPECT_NEAR(result.metrics.at("val/loss"), module->loss(all).item<double>(), 1e-6);
  EXPECT_EQ(trainer.callback_metrics().at("val/loss"), result.metrics.at("val/loss"));
}

/// Logs from the epoch hooks, which Lightning allows.
class EpochHookLogger : public TinyModule {
 public:
  using TinyModule::TinyModule;
  void on_train_epoch_start() override { log("epoch_start", 1.0, {.on_step = false, .on_epoch = true}); }
  void on_train_epoch_end() override { log("epoch_end", 2.0, {.on_step = false, .on_epoch = true}); }
};

TEST_F(TrainerTest, EpochHooksMayLog) {
  torch::manual_seed(7);
  EpochHookLogger module;
  const FitResult result = make_trainer({.max_epochs = 2}).fit(module);
  EXPECT_DOUBLE_EQ(result.metrics.at("epoch_start"), 1.0);
  EXPECT_DOUBLE_EQ(result.metrics.at("epoch_end"), 2.0);
}

// ---- callbacks -------------------------------------------------------------------------------------

TEST_F(TrainerTest, EarlyStoppingStopsWithItsMessage) {
  auto module = make_module({.scripted_val_loss = {1.0}});  // never improves
  auto early = std::make_shared<EarlyStopping>(EarlyStoppingOptions{.monitor = "val/loss", .patience = 2});
  const FitResult result =
      make_trainer({.max_epochs = 10, .num_sanity_val_steps = 0, .callbacks = {early}}).fit(*module);
  EXPECT_EQ(result.reason, StopReason::kCallback);
  EXPECT_EQ(result.epochs_completed, 3) << "best at epoch 0, no improvement at epochs 1 and 2";
  EXPECT_NE(result.message.find("did not improve"), std::string::npos) << result.message;
}

TEST_F(TrainerTest, MinEpochsOverridesEarlyStopping) {
  auto module = make_module({.scripted_val_loss = {1.0}});
  auto early = std::make_shared<EarlyStopping>(EarlyStoppingOptions{.monitor = "val/loss", .patience = 2});
  const FitResult result =
      make_trainer({.max_epochs = 10, .min_epochs = 5, .num_sanity_val_steps = 0, .callbacks = {early}}).fit(*module);
  EXPECT_EQ(result.reason, StopReason::kCallback);
  EXPECT_EQ(result.epochs_completed, 5);
}

TEST_F(TrainerTest, DefaultModelCheckpointSavesEveryEpochUnderRootCheckpoints) {
  auto module = make_module();
  auto io = std::make_shared<RecordingCheckpointIO>();
  Trainer trainer = make_trainer({.max_epochs = 3});
  trainer.set_checkpoint_io(io);
  const FitResult result = trainer.fit(*module);
  const std::string dir = (root_ / "checkpoints").string();
  EXPECT_EQ(io->saves, (std::vector<std::string>{dir + "/epoch=0-step=4.ckpt", dir + "/epoch=1-step=8.ckpt",
                                                 dir + "/epoch=2-step=12.ckpt"}));
  // save_top_k=1 without a monitor keeps only the newest, as in Lightning.
  EXPECT_EQ(io->paths(), (std::vector<std::string>{dir + "/epoch=2-step=12.ckpt"}));
  EXPECT_EQ(result.last_model_path, dir + "/epoch=2-step=12.ckpt");
  EXPECT_FALSE(fs::exists(root_)) << "an in-memory CheckpointIO must not touch the disk";
}

TEST_F(TrainerTest, DefaultModelCheckpointWritesToDisk) {
  auto module = make_module();
  make_trainer({.max_epochs = 2}).fit(*module);
  EXPECT_EQ(checkpoint_files(root_), (std::vector<std::string>{"checkpoints/epoch=1-step=8.ckpt"}));
}

TEST_F(TrainerTest, WithALoggerCheckpointsGoIntoTheVersionDirectory) {
  auto module = make_module();
  const FitResult result = make_trainer({.max_epochs = 1}, /*logger=*/true).fit(*module);
  EXPECT_EQ(result.log_dir, (root_ / "lightning_logs" / "version_0").string());
  EXPECT_EQ(checkpoint_files(root_),
            (std::vector<std::string>{"lightning_logs/version_0/checkpoints/epoch=0-step=4.ckpt"}));
}

TEST_F(TrainerTest, SaveTopKWithAMonitorKeepsTheBestCheckpoints) {
  auto module = make_module({.scripted_val_loss = {0.5, 0.3, 0.4, 0.1, 0.6}});
  auto checkpoint = std::make_shared<ModelCheckpoint>(
      ModelCheckpointOptions{.monitor = "val/loss", .save_top_k = 2, .save_last = true});
  Trainer trainer = make_trainer({.max_epochs = 5, .num_sanity_val_steps = 0, .callbacks = {checkpoint}});
  const FitResult result = trainer.fit(*module);

  EXPECT_EQ(checkpoint_files(root_),
            (std::vector<std::string>{"checkpoints/epoch=1-step=8.ckpt", "checkpoints/epoch=3-step=16.ckpt",
                                      "checkpoints/last.ckpt"}));
  EXPECT_EQ(result.best_model_path, (root_ / "checkpoints/epoch=3-step=16.ckpt").string());
  ASSERT_TRUE(result.best_model_score.has_value());
  EXPECT_DOUBLE_EQ(*result.best_model_score, 0.1);
  EXPECT_EQ(result.last_model_path, (root_ / "checkpoints/last.ckpt").string());
}

TEST_F(TrainerTest, ValidateAndTestLoadBestOrLastAfterFit) {
  auto module = make_module({.scripted_val_loss = {0.5, 0.1, 0.4}});
  auto checkpoint = std::make_shared<ModelCheckpoint>(
      ModelCheckpointOptions{.monitor = "val/loss", .save_top_k = 1, .save_last = true});
  Trainer trainer = make_trainer({.max_epochs = 3, .num_sanity_val_steps = 0, .callbacks = {checkpoint}});
  const FitResult fit = trainer.fit(*module);
  const auto final_weights = parameters_of(*module);
  TorchCheckpointIO io;
  const auto best_weights = weights_in(io, fit.best_model_path);
  ASSERT_FALSE(bit_identical(final_weights, best_weights)) << "epoch 1 (best) and epoch 2 must differ";

  const EvalResult best = trainer.validate(*module, {}, "best");
  EXPECT_TRUE(bit_identical(parameters_of(*module), best_weights));
  EXPECT_EQ(best.batches, 2);

  const EvalResult last = trainer.test(*module, {}, "last");
  EXPECT_TRUE(bit_identical(parameters_of(*module), final_weights));
  EXPECT_EQ(last.stage, "test");
  EXPECT_EQ(last.metrics.count("test/loss"), 1u);
}

TEST_F(TrainerTest, TestAfterAResumedFitEvaluatesTheTrainedWeightsNotTheResumeCheckpoint) {
  auto first = make_module();
  Trainer one_epoch = make_trainer({.max_epochs = 1, .num_sanity_val_steps = 0});
  const FitResult started = one_epoch.fit(*first);
  ASSERT_FALSE(started.last_model_path.empty());
  auto module = make_module();
  TrainerOptions options{.max_epochs = 3, .num_sanity_val_steps = 0};
  options.ckpt_path = started.last_model_path;  // fit's default only
  Trainer resumed = make_trainer(options);
  resumed.fit(*module);
  const auto trained = parameters_of(*module);
  resumed.test(*module, {}, /*ckpt_path=*/"");
  EXPECT_TRUE(bit_identical(parameters_of(*module), trained));
}

TEST_F(TrainerTest, TheSeedAlsoFixesWeightsOfModulesBuiltAfterTheTrainer) {
  const auto build = [this] {
    Trainer trainer = make_trainer({.seed = 3});
    TinyModule module;
    return parameters_of(module);
  };
  EXPECT_TRUE(bit_identical(build(), build()));
}

/// Keeps every log_metrics call in memory.
class RecordingLogger : public Logger {
 public:
  std::string name() const override { return "recording"; }
  std::string log_dir() const override { return ""; }
  void log_hyperparams(const nlohmann::json&) override {}
  void log_metrics(const std::map<std::string, double>& metrics, int64_t step) override {
    rows.emplace_back(step, metrics);
  }
  std::vector<std::pair<int64_t, std::map<std::string, double>>> rows;
};

TEST_F(TrainerTest, LearningRateMonitorLogsTheOptimizersLearningRateEveryStep) {
  auto module = make_module({.lr = 0.05});
  auto logger = std::make_shared<RecordingLogger>();
  TrainerOptions options{.max_epochs = 1, .limit_train_batches = 3, .num_sanity_val_steps = 0};
  options.loggers = {logger};
  options.callbacks = {std::make_shared<LearningRateMonitor>(Interval::kStep)};
  Trainer trainer = make_trainer(options, /*logger=*/true);
  trainer.fit(*module);
  std::vector<int64_t> steps;
  for (const auto& [step, metrics] : logger->rows) {
    const auto it = metrics.find("lr-SGD");
    if (it == metrics.end()) continue;
    EXPECT_DOUBLE_EQ(it->second, 0.05);
    steps.push_back(step);
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3}));
}

// ---- exact resume --------------------------------------------------------------------------------

/// The end state of a fit.
struct Outcome {
  std::map<std::string, torch::Tensor> parameters;
  int64_t global_step = 0;
  FitResult result;
};

class ResumeTest : public TrainerTest {
 public:
  Outcome fit(const TinyOptions& module_options, TrainerOptions options, const std::string& ckpt_path = "",
              uint64_t init_seed = 7) {
    auto module = make_module(module_options, init_seed);
    options.precision = precision_;
    Trainer trainer = make_trainer(std::move(options));
    trainer.set_checkpoint_io(io_);
    Outcome out;
    out.result = trainer.fit(*module, {}, {}, ckpt_path);
    out.parameters = parameters_of(*module);
    out.global_step = out.result.global_step;
    return out;
  }

  /// Every step, with all checkpoints kept.
  static std::shared_ptr<Callback> every_n_steps(int64_t n) {
    return std::make_shared<ModelCheckpoint>(ModelCheckpointOptions{.save_top_k = -1, .every_n_train_steps = n});
  }

  /// Checks that training 2 epochs straight equals stopping where `stop` says, then resuming
  /// from the checkpoint whose name ends with `suffix` in a module with different initial weights.
  void expect_exact_resume(const TinyOptions& module_options, int64_t accumulate, TrainerOptions stop,
                           std::shared_ptr<Callback> checkpoint, const std::string& suffix) {
    io_ = std::make_shared<InMemoryCheckpointIO>();
    const Outcome straight =
        fit(module_options,
            {.max_epochs = 2, .accumulate_grad_batches = accumulate, .seed = 1, .enable_checkpointing = false});

    stop.accumulate_grad_batches = accumulate;
    stop.seed = 1;
    stop.callbacks = {std::move(checkpoint)};
    fit(module_options, stop);
    const std::string path = path_ending_with(io_->paths(), suffix);

    const Outcome resumed = fit(module_options, {.max_epochs = 2, .accumulate_grad_batches = accumulate, .seed = 1},
                                path, /*init_seed=*/99);
    EXPECT_EQ(resumed.result.resumed_from, path);
    EXPECT_EQ(resumed.global_step, straight.global_step);
    EXPECT_TRUE(bit_identical(resumed.parameters, straight.parameters));
  }

 protected:
  std::shared_ptr<InMemoryCheckpointIO> io_ = std::make_shared<InMemoryCheckpointIO>();
  std::string precision_ = "32-true";  // every fit's precision
};

TEST_F(ResumeTest, FromAnEpochEndCheckpointIsBitIdentical) {
  // Through real files, as a user resumes.
  auto straight_module = make_module();
  make_trainer({.max_epochs = 2, .seed = 1, .enable_checkpointing = false}).fit(*straight_module);

  auto first = make_module();
  const FitResult one = make_trainer({.max_epochs = 1, .seed = 1}).fit(*first);
  ASSERT_EQ(one.last_model_path, (root_ / "checkpoints/epoch=0-step=4.ckpt").string());

  auto second = make_module({}, /*init_seed=*/99);
  const FitResult two = make_trainer({.max_epochs = 2, .seed = 1}).fit(*second, {}, {}, one.last_model_path);
  EXPECT_EQ(two.resumed_from, one.last_model_path);
  EXPECT_EQ(two.global_step, 8);
  EXPECT_EQ(two.epochs_completed, 2);
  EXPECT_EQ(second->count("training_step"), 4) << "only epoch 1 is trained again";
  EXPECT_TRUE(bit_identical(parameters_of(*second), parameters_of(*straight_module)));
}

TEST_F(ResumeTest, FromAMidEpochCheckpointIsBitIdentical) {
  expect_exact_resume({}, 1, {.max_steps = 3}, every_n_steps(3), "epoch=0-step=3.ckpt");
}

TEST_F(ResumeTest, WithDropoutAdamAndAnEpochSchedulerIsBitIdentical) {
  const TinyOptions options{.dropout = 0.3, .optimizer = Optim::kAdam, .lr = 0.01, .scheduler = Interval::kEpoch};
  // At the end of epoch 0, after its validation and scheduler step (the default ModelCheckpoint).
  expect_exact_resume(options, 1, {.max_epochs = 1}, std::make_shared<ModelCheckpoint>(), "epoch=0-step=4.ckpt");
  // After epoch 0's last batch, before its end-of-epoch work, which the resumed run then does.
  expect_exact_resume(options, 1, {.max_epochs = 1}, every_n_steps(4), "epoch=0-step=4.ckpt");
  // In the middle of epoch 0.
  expect_exact_resume(options, 1, {.max_steps = 3}, every_n_steps(3), "epoch=0-step=3.ckpt");
}

TEST_F(ResumeTest, WithDropoutAdamAndAStepSchedulerIsBitIdentical) {
  const TinyOptions options{.dropout = 0.3, .optimizer = Optim::kAdam, .lr = 0.01, .scheduler = Interval::kStep};
  expect_exact_resume(options, 1, {.max_steps = 5}, every_n_steps(5), "epoch=1-step=5.ckpt");
}

TEST_F(ResumeTest, WithGradientAccumulationIsBitIdentical) {
  // 6 batches of 4, 3 optimizer steps per epoch; the step-2 checkpoint is after batch 4.
  const TinyOptions options{.train_size = 24, .dropout = 0.3, .optimizer = Optim::kAdam, .lr = 0.01};
  expect_exact_resume(options, 2, {.max_steps = 2}, every_n_steps(2), "epoch=0-step=2.ckpt");
}

TEST_F(ResumeTest, Bf16MixedIsBitIdentical) {
  precision_ = "bf16-mixed";
  const TinyOptions options{.dropout = 0.3, .optimizer = Optim::kAdam, .lr = 0.01};
  expect_exact_resume(options, 1, {.max_steps = 3}, every_n_steps(3), "epoch=0-step=3.ckpt");
}

TEST_F(ResumeTest, FromACheckpointAfterTheLastBatchStillValidatesThatEpoch) {
  // every_n_train_steps saves at the end of batch 4, before epoch 0's validation ran.
  fit({}, {.max_epochs = 1, .num_sanity_val_steps = 0, .callbacks = {every_n_steps(4)}});
  auto module = make_module();
  Trainer trainer = make_trainer({.max_epochs = 1, .num_sanity_val_steps = 0});
  trainer.set_checkpoint_io(io_);
  const FitResult result = trainer.fit(*module, {}, {}, path_ending_with(io_->paths(), "epoch=0-step=4.ckpt"));
  EXPECT_EQ(module->count("training_step"), 0);
  EXPECT_EQ(validation_points(*module), (std::vector<int64_t>{0})) << "epoch 0's validation is still due";
  EXPECT_EQ(result.metrics.count("val/loss"), 1u);
}

TEST_F(ResumeTest, FromAMidEpochCheckpointRunsAValidationThatWasDueButNotOneThatRan) {
  // Validation after batches 2 and 4; one checkpoint before the validation at batch 2, one after.
  auto before = every_n_steps(2);
  auto after = std::make_shared<ModelCheckpoint>(
      ModelCheckpointOptions{.dirpath = (root_ / "after").string(), .save_top_k = -1});
  fit({}, {.max_steps = 2, .val_check_interval = 0.5, .num_sanity_val_steps = 0, .callbacks = {before, after}});
  const std::string due = path_ending_with(io_->paths(), "checkpoints/epoch=0-step=2.ckpt");
  const std::string ran = path_ending_with(io_->paths(), "after/epoch=0-step=2.ckpt");

  for (const auto& [path, expected] :
       {std::pair{due, std::vector<int64_t>{0, 2}}, std::pair{ran, std::vector<int64_t>{2}}}) {
    auto module = make_module();
    Trainer trainer = make_trainer({.max_epochs = 1, .val_check_interval = 0.5, .num_sanity_val_steps = 0});
    trainer.set_checkpoint_io(io_);
    trainer.fit(*module, {}, {}, path);
    EXPECT_EQ(module->count("training_step"), 2) << path;
    EXPECT_EQ(validation_points(*module), expected) << path;
  }
}

TEST_F(ResumeTest, ACheckpointWithoutTheValidationPendingKeyStillResumes) {
  // Checkpoints written before the key existed resume as if no validation were pending.
  fit({}, {.max_steps = 3, .seed = 1, .callbacks = {every_n_steps(3)}});
  const std::string path = path_ending_with(io_->paths(), "epoch=0-step=3.ckpt");
  StateDict checkpoint = load_dict(*io_, path);
  ASSERT_TRUE(checkpoint.at("loops").toGenericDict().at("fit_loop").toGenericDict().erase("validation_pending"));
  io_->save(checkpoint, path);
  const Outcome resumed = fit({}, {.max_epochs = 1, .seed = 1}, path);
  EXPECT_EQ(resumed.global_step, 4);
}

TEST_F(ResumeTest, ControlADifferentSeedGivesDifferentParameters) {
  const TinyOptions options{.dropout = 0.3};
  const Outcome a = fit(options, {.max_epochs = 2, .seed = 1});
  const Outcome b = fit(options, {.max_epochs = 2, .seed = 2});
  EXPECT_FALSE(bit_identical(a.parameters, b.parameters));
}

TEST_F(ResumeTest, ControlDisturbingTheRestoredRandomStreamBreaksTheMatch) {
  // The same as the mid-epoch resume, except that the module draws a random number while the
  // checkpoint is restored: the comparison must notice a random stream that is off by one draw.
  const TinyOptions options{.dropout = 0.3};
  const Outcome straight = fit(options, {.max_epochs = 2, .seed = 1});
  fit(options, {.max_steps = 3, .seed = 1, .callbacks = {every_n_steps(3)}});
  TinyOptions disturbing = options;
  disturbing.draw_rng_on_load = true;
  const Outcome resumed =
      fit(disturbing, {.max_epochs = 2, .seed = 1}, path_ending_with(io_->paths(), "epoch=0-step=3.ckpt"));
  EXPECT_EQ(resumed.global_step, straight.global_step);
  EXPECT_FALSE(bit_identical(resumed.parameters, straight.parameters));
}

// ---- fast_dev_run, predict, evaluation ------------------------------------------------------------

TEST_F(TrainerTest, FastDevRunRunsOneBatchPerStageAndWritesNothing) {
  auto module = make_module();
  Trainer trainer = make_trainer({.fast_dev_run = 1}, /*logger=*/true);
  const FitResult result = trainer.fit(*module);
  EXPECT_EQ(module->count("training_step"), 1);
  EXPECT_EQ(module->count("validation_step"), 1) << "no sanity check, one validation batch";
  EXPECT_EQ(result.global_step, 1);
  EXPECT_EQ(result.reason, StopReason::kMaxSteps);
  const EvalResult test = trainer.test(*module);
  EXPECT_EQ(test.batches, 1);
  EXPECT_EQ(trainer.predict(*module).size(), 1u);
  EXPECT_FALSE(fs::exists(root_)) << "fast_dev_run wrote into the root dir";
}

TEST_F(TrainerTest, PredictReturnsOneTensorPerBatchInOrder) {
  auto module = make_module({.val_size = 10});  // batches of 4, 4, 2
  Trainer trainer = make_trainer({});
  const std::vector<torch::Tensor> outputs = trainer.predict(*module);
  ASSERT_EQ(outputs.size(), 3u);
  EXPECT_EQ(outputs[0].size(0), 4);
  EXPECT_EQ(outputs[2].size(0), 2);
  torch::NoGradGuard no_grad;
  const torch::Tensor expected = module->forward(module->val_data()->get_batch(torch::arange(10)).data);
  EXPECT_TRUE(torch::allclose(torch::cat(outputs), expected));
}

TEST_F(TrainerTest, TestReturnsItsMetrics) {
  auto module = make_module();
  const EvalResult result = make_trainer({}).test(*module);
  EXPECT_EQ(result.stage, "test");
  EXPECT_EQ(result.batches, 2);
  EXPECT_EQ(result.examples, 8);
  EXPECT_EQ(module->count("test_step"), 2);
  ASSERT_EQ(result.metrics.count("test/loss"), 1u);
  EXPECT_GT(result.metrics.at("test/loss"), 0.0);
}

// ---- errors ------------------------------------------------------------------------------------------

/// The message of the volt::Error `run` throws ("" when it throws none).
template <typename Run>
std::string error_message(Run run) {
  try {
    run();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST_F(TrainerTest, ALossWithoutGradIsAnErrorWithAHint) {
  auto module = make_module({.detached_loss = true});
  Trainer trainer = make_trainer({.max_epochs = 1});
  const std::string message = error_message([&] { trainer.fit(*module); });
  EXPECT_NE(message.find("requires grad"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT"), std::string::npos) << message;
}

TEST_F(TrainerTest, FitWithoutTrainingDataIsAnError) {
  auto module = make_module({.no_train_data = true});
  Trainer trainer = make_trainer({.max_epochs = 1});
  const std::string message = error_message([&] { trainer.fit(*module); });
  EXPECT_NE(message.find("no training data"), std::string::npos) << message;
}

TEST_F(TrainerTest, ConfigureOptimizersReturningNothingIsAnError) {
  auto module = make_module({.no_optimizer = true});
  Trainer trainer = make_trainer({.max_epochs = 1});
  const std::string message = error_message([&] { trainer.fit(*module); });
  EXPECT_NE(message.find("returned no optimizer"), std::string::npos) << message;
}

TEST_F(TrainerTest, AMissingCkptPathIsAnError) {
  auto module = make_module();
  Trainer trainer = make_trainer({.max_epochs = 1});
  const std::string missing = (root_ / "nope.ckpt").string();
  const std::string message = error_message([&] { trainer.fit(*module, {}, {}, missing); });
  EXPECT_NE(message.find(missing), std::string::npos) << message;
  EXPECT_NE(error_message([&] { trainer.validate(*module, {}, missing); }).find("does not exist"), std::string::npos);
}

TEST_F(TrainerTest, ACheckpointOfAnotherShapeIsACheckpointErrorNamingTheTensors) {
  auto io = std::make_shared<InMemoryCheckpointIO>();
  auto small = make_module();
  Trainer first = make_trainer({.max_epochs = 1});
  first.set_checkpoint_io(io);
  const FitResult saved = first.fit(*small);

  auto wide = make_module({.outputs = 3});
  Trainer second = make_trainer({.max_epochs = 2});
  second.set_checkpoint_io(io);
  try {
    second.fit(*wide, {}, {}, saved.last_model_path);
    FAIL() << "expected a CheckpointError";
  } catch (const CheckpointError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("'linear.weight'"), std::string::npos) << message;
    EXPECT_NE(message.find("'linear.bias'"), std::string::npos) << message;
    EXPECT_NE(message.find("shape mismatch"), std::string::npos) << message;
  }
  EXPECT_THROW(second.validate(*wide, {}, saved.last_model_path), CheckpointError);
}

// ---- signals -----------------------------------------------------------------------------------------

std::atomic<int> g_handler_calls{0};
void count_signal(int) { g_handler_calls.fetch_add(1); }

TEST_F(TrainerTest, SigintStopsAfterTheCurrentBatchAndRestoresTheHandler) {
  // Our own handler stands for the application's: fit must put it back afterwards.
  g_handler_calls.store(0);
  struct sigaction mine = {};
  struct sigaction previous = {};
  mine.sa_handler = count_signal;
  sigemptyset(&mine.sa_mask);
  ASSERT_EQ(sigaction(SIGINT, &mine, &previous), 0);

  auto module = make_module({.train_size = 40, .sigint_at_batch = 3});
  const FitResult result = make_trainer({.max_epochs = 2}).fit(*module);
  EXPECT_EQ(result.reason, StopReason::kInterrupted);
  EXPECT_EQ(module->count("training_step"), 4) << "batches 0..3, then stop";
  EXPECT_EQ(result.global_step, 4) << "the interrupted batch still completes its step";
  EXPECT_EQ(module->count("on_fit_end"), 1);
  EXPECT_EQ(g_handler_calls.load(), 0) << "the Trainer, not the application, handles SIGINT during fit";

  // Afterwards the process is as it was: our handler is back and a new fit runs to the end.
  ::raise(SIGINT);
  EXPECT_EQ(g_handler_calls.load(), 1);
  auto again = make_module();
  EXPECT_EQ(make_trainer({.max_epochs = 1}).fit(*again).reason, StopReason::kMaxEpochs);
  sigaction(SIGINT, &previous, nullptr);
}

// ---- SLURM auto-requeue --------------------------------------------------------------------------

/// Runs fits as tasks of a fake SLURM batch job (array task 70_7) with a fake `scontrol` on PATH
/// that records its arguments, so the whole save-requeue-restart cycle runs in one process.
// ---- precision -----------------------------------------------------------------------------------

/// Records the dtype of the model's output in each step.
class DtypeRecorder : public TinyModule {
 public:
  using TinyModule::TinyModule;
  torch::Tensor training_step(const Batch& batch, int64_t batch_idx) override {
    train_dtypes.insert(forward(batch.data).scalar_type());
    return TinyModule::training_step(batch, batch_idx);
  }
  void validation_step(const Batch& batch, int64_t batch_idx) override {
    val_dtypes.insert(forward(batch.data).scalar_type());
    TinyModule::validation_step(batch, batch_idx);
  }
  /// Output dtypes seen in training and validation steps.
  std::set<c10::ScalarType> train_dtypes, val_dtypes;
};

TEST_F(TrainerTest, Bf16MixedRunsTheStepsInBf16AndLowersTheLoss) {
  torch::manual_seed(7);
  DtypeRecorder module({.train_size = 64, .lr = 0.05});
  const Batch all = module.train_data()->get_batch(torch::arange(64));
  const torch::Tensor x = all.data, y = all.target;
  const double before = torch::mse_loss(module.forward(x), y).item<double>();
  const FitResult result =
      make_trainer({.precision = "bf16-mixed", .max_epochs = 5, .seed = 1, .enable_checkpointing = false}).fit(module);
  const double after = torch::mse_loss(module.forward(x), y).item<double>();
  EXPECT_LT(after, 0.8 * before) << before << " -> " << after;
  EXPECT_EQ(module.train_dtypes, std::set<c10::ScalarType>{torch::kBFloat16});
  EXPECT_EQ(module.val_dtypes, std::set<c10::ScalarType>{torch::kBFloat16});
  for (const auto& p : module.parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat32) << "weights stay float32";
  EXPECT_EQ(result.global_step, 80);
}

/// MSE written with elementwise ops: LibTorch 1.13's CPU mse_loss has no bfloat16 kernel.
class ElementwiseMse : public DtypeRecorder {
 public:
  using DtypeRecorder::DtypeRecorder;
  torch::Tensor training_step(const Batch& batch, int64_t batch_idx) override {
    const torch::Tensor out = forward(batch.data);
    train_dtypes.insert(out.scalar_type());
    return (out - batch.target).pow(2).mean();
  }
  void validation_step(const Batch& batch, int64_t batch_idx) override {
    log("val/loss", (forward(batch.data) - batch.target).pow(2).mean());
  }
};

TEST_F(TrainerTest, Bf16TrueTrainsABf16Module) {
  ElementwiseMse module;
  make_trainer({.precision = "bf16-true", .max_epochs = 1, .enable_checkpointing = false}).fit(module);
  EXPECT_EQ(module.train_dtypes, std::set<c10::ScalarType>{torch::kBFloat16});
  for (const auto& p : module.parameters()) EXPECT_EQ(p.scalar_type(), torch::kBFloat16);
}

TEST_F(TrainerTest, SixteenMixedScalerStateRoundTripsThroughACheckpointFile) {
  // The CUDA build's 16-mixed plugin; its scaler runs on CPU tensors (no CPU fp16 autocast in 1.13).
  auto module = make_module();
  const OptimizerConfig optimization = module->configure_optimizers();
  const std::vector<std::shared_ptr<Callback>> callbacks;
  auto saved = make_precision_plugin(Precision::k16Mixed, c10::DeviceType::CUDA, {.init_scale = 1024.0});
  // One overflowing step (scale 1024 -> 512), then one finite step (growth tracker 1).
  for (const float factor : {std::numeric_limits<float>::infinity(), 1.0f}) {
    const Batch batch = module->train_data()->get_batch(torch::arange(4));
    saved->backward(module->loss(batch) * factor);
    saved->optimizer_step(
        optimization.optimizers, [] {}, [](size_t) {});
    optimization.optimizers[0]->zero_grad();
  }
  const std::string path = (root_ / "amp.ckpt").string();
  fs::create_directories(root_);
  TorchCheckpointIO io;
  io.save(make_checkpoint({module.get(), &optimization, &callbacks, saved.get()}, {}), path);

  const c10::IValue loaded = io.load(path);
  const StateDict state = loaded.toGenericDict().at(kScalerCheckpointKey).toGenericDict();
  EXPECT_EQ(state.at("scale").toDouble(), 512.0);
  EXPECT_EQ(state.at("_growth_tracker").toInt(), 1);
  auto restored = make_precision_plugin(Precision::k16Mixed, c10::DeviceType::CUDA);
  restore_checkpoint(loaded, {module.get(), &optimization, &callbacks, restored.get()}, path);
  EXPECT_EQ(restored->scaler()->get_scale(), 512.0);
  EXPECT_EQ(restored->scaler()->growth_tracker(), 1);
  EXPECT_EQ(restored->scaler()->options().growth_interval, 2000);

  // A checkpoint without scaler state (32-true, or older) still loads and keeps a fresh scaler.
  StateDict without = loaded.toGenericDict().copy();  // Dicts share their entries; copy before erasing
  ASSERT_EQ(without.erase(kScalerCheckpointKey), 1u);
  auto fresh = make_precision_plugin(Precision::k16Mixed, c10::DeviceType::CUDA);
  restore_checkpoint(without, {module.get(), &optimization, &callbacks, fresh.get()}, path);
  EXPECT_EQ(fresh->scaler()->get_scale(), 65536.0);
}

TEST_F(TrainerTest, A32TrueCheckpointHasNoScalerState) {
  auto module = make_module();
  const FitResult result = make_trainer({.max_epochs = 1, .seed = 1}).fit(*module);
  const c10::IValue checkpoint = TorchCheckpointIO().load(result.last_model_path);
  EXPECT_FALSE(checkpoint.toGenericDict().contains(kScalerCheckpointKey));
}

class RequeueTest : public TrainerTest {
 protected:
  void SetUp() override {
    TrainerTest::SetUp();
    fs::create_directories(bin_dir());
    write_scontrol("echo \"$@\" >> " + (root_ / "scontrol.log").string());
    old_path_ = getenv("PATH");
    setenv("PATH", (bin_dir().string() + ":" + old_path_).c_str(), 1);
    sigaction(SIGTERM, nullptr, &sigterm_before_);
  }
  void TearDown() override {
    setenv("PATH", old_path_.c_str(), 1);
    sigaction(SIGTERM, &sigterm_before_, nullptr);  // a requeue leaves SIGTERM ignored
    TrainerTest::TearDown();
  }
  fs::path bin_dir() const { return root_ / "bin"; }
  void write_scontrol(const std::string& body) const {
    std::ofstream(bin_dir() / "scontrol") << "#!/bin/sh\n" << body << "\n";
    fs::permissions(bin_dir() / "scontrol", fs::perms::owner_all);
  }
  /// What the fake scontrol was asked, one call per line.
  std::string scontrol_calls() const {
    std::ifstream in(root_ / "scontrol.log");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  static Env slurm_env(int restarts) {
    Env::Vars vars{{"SLURM_JOB_ID", "77"},          {"SLURM_ARRAY_JOB_ID", "70"}, {"SLURM_ARRAY_TASK_ID", "7"},
                   {"SLURM_JOB_NAME", "train"},     {"SLURM_NTASKS", "1"},        {"SLURM_PROCID", "0"},
                   {"SLURM_LOCALID", "0"},          {"SLURM_NODEID", "0"},        {"SLURM_NNODES", "1"},
                   {"SLURM_JOB_NODELIST", "node1"}, {"SLURM_STEP_ID", "0"}};
    if (restarts > 0) vars["SLURM_RESTART_COUNT"] = std::to_string(restarts);
    return Env(vars);
  }
  /// One run of the job: a fresh module and Trainer. Restarts draw other initial weights, which
  /// the HPC checkpoint must replace.
  FitResult run_job(TinyOptions module_options, TrainerOptions options, int restarts,
                    std::map<std::string, torch::Tensor>* parameters = nullptr, const std::string& ckpt = "") {
    auto module = make_module(module_options, /*init_seed=*/restarts == 0 ? 7 : 100 + restarts);
    Trainer trainer(quiet(std::move(options)), slurm_env(restarts), MachineInfo{1, "/tmp"});
    const FitResult result = trainer.fit(*module, {}, {}, ckpt);
    if (parameters) *parameters = parameters_of(*module);
    return result;
  }

  std::string old_path_;
  struct sigaction sigterm_before_ {};
};

TEST_F(RequeueTest, TwoRequeuesMidEpochEndBitIdenticalToAnUninterruptedRun) {
  const TinyOptions base{
      .train_size = 40, .dropout = 0.3, .optimizer = Optim::kAdam, .lr = 0.01, .scheduler = Interval::kEpoch};
  const TrainerOptions options{.max_epochs = 2, .seed = 1, .hpc_checkpoints_to_keep = 1};
  auto straight_module = make_module(base);
  make_trainer({.max_epochs = 2, .seed = 1, .enable_checkpointing = false}).fit(*straight_module);

  // Run 1: the signal arrives during batch 3 of epoch 0.
  TinyOptions first = base;
  first.signal_at_batch = 3;
  const FitResult one = run_job(first, options, 0);
  EXPECT_EQ(one.reason, StopReason::kRequeued);
  EXPECT_TRUE(one.requeued());
  EXPECT_EQ(one.global_step, 4) << "the signalled step completes, then the run stops";
  EXPECT_EQ(one.hpc_checkpoint_path, (root_ / "hpc_ckpt_1.ckpt").string());
  EXPECT_EQ(scontrol_calls(), "requeue 70_7\n") << "an array task requeues itself, not the whole array";

  // Run 2 (SLURM_RESTART_COUNT=1) resumes there, and is signalled again at batch 6 of epoch 0.
  TinyOptions second = base;
  second.signal_at_batch = 6;
  const FitResult two = run_job(second, options, 1);
  EXPECT_EQ(two.resumed_from, one.hpc_checkpoint_path);
  EXPECT_EQ(two.reason, StopReason::kRequeued);
  EXPECT_EQ(two.global_step, 7);
  EXPECT_EQ(two.hpc_checkpoint_path, (root_ / "hpc_ckpt_2.ckpt").string());
  EXPECT_FALSE(fs::exists(root_ / "hpc_ckpt_1.ckpt")) << "hpc_checkpoints_to_keep=1 prunes the older one";

  // Run 3 runs to the end; the job script's ckpt_path loses to the HPC checkpoint.
  std::map<std::string, torch::Tensor> resumed;
  const FitResult three = run_job(base, options, 2, &resumed, "last");
  EXPECT_EQ(three.resumed_from, two.hpc_checkpoint_path);
  EXPECT_EQ(three.reason, StopReason::kMaxEpochs);
  EXPECT_EQ(three.global_step, 20);
  EXPECT_EQ(scontrol_calls(), "requeue 70_7\nrequeue 70_7\n");
  EXPECT_TRUE(bit_identical(resumed, parameters_of(*straight_module)));
}

TEST_F(RequeueTest, ASignalDuringTheLastStepFinishesTheRunInsteadOfRequeueing) {
  TinyOptions last{.train_size = 16};
  last.signal_at_batch = 3;  // the 4th and last batch of the only epoch
  const FitResult result = run_job(last, {.max_epochs = 1}, 0);
  EXPECT_EQ(result.reason, StopReason::kMaxEpochs);
  EXPECT_EQ(result.global_step, 4);
  EXPECT_EQ(result.hpc_checkpoint_path, "");
  EXPECT_EQ(scontrol_calls(), "");
  // A signal one step earlier still requeues.
  last.signal_at_batch = 2;
  EXPECT_EQ(run_job(last, {.max_epochs = 1}, 0).reason, StopReason::kRequeued);
}

TEST_F(RequeueTest, AFirstRunWithoutHpcCheckpointsStartsFresh) {
  const FitResult result = run_job({}, {.max_epochs = 1}, 0);
  EXPECT_EQ(result.resumed_from, "");
  EXPECT_EQ(result.reason, StopReason::kMaxEpochs);
  EXPECT_EQ(scontrol_calls(), "");
}

TEST_F(RequeueTest, ATruncatedNewestHpcCheckpointFallsBackToThePreviousWithAWarning) {
  TinyOptions signalled{.train_size = 40};
  signalled.signal_at_batch = 2;
  const FitResult one = run_job(signalled, {.max_epochs = 1, .seed = 1}, 0);
  ASSERT_EQ(one.hpc_checkpoint_path, (root_ / "hpc_ckpt_1.ckpt").string());
  // A newer file cut in half, as a full disk or an interrupted copy leaves it.
  const auto size = fs::file_size(one.hpc_checkpoint_path);
  fs::copy_file(one.hpc_checkpoint_path, root_ / "hpc_ckpt_2.ckpt");
  fs::resize_file(root_ / "hpc_ckpt_2.ckpt", size / 2);

  ::testing::internal::CaptureStderr();
  const FitResult two = run_job({.train_size = 40}, {.max_epochs = 1, .seed = 1}, 1);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(two.resumed_from, one.hpc_checkpoint_path);
  EXPECT_EQ(two.global_step, 10);
  EXPECT_NE(err.find("warning: HPC checkpoint " + (root_ / "hpc_ckpt_2.ckpt").string() + " is unreadable"),
            std::string::npos)
      << err;
}

TEST_F(RequeueTest, SigtermUnderSlurmSavesAnHpcCheckpointWithoutRequeueing) {
  TinyOptions terminated{.train_size = 40};
  terminated.signal_at_batch = 3;
  terminated.signal = SIGTERM;
  const FitResult result = run_job(terminated, {.max_epochs = 2, .seed = 1}, 0);
  EXPECT_EQ(result.reason, StopReason::kInterrupted);
  EXPECT_EQ(result.global_step, 4);
  EXPECT_EQ(result.hpc_checkpoint_path, (root_ / "hpc_ckpt_1.ckpt").string());
  EXPECT_EQ(scontrol_calls(), "") << "SLURM requeues a preempted job by its own policy";
  struct sigaction now {};
  sigaction(SIGTERM, nullptr, &now);
  EXPECT_EQ(now.sa_handler, sigterm_before_.sa_handler) << "fit restores the SIGTERM handler";

  // Without checkpoint_on_sigterm the run just stops.
  fs::remove(result.hpc_checkpoint_path);
  const FitResult bare = run_job(terminated, {.max_epochs = 2, .seed = 1, .checkpoint_on_sigterm = false}, 0);
  EXPECT_EQ(bare.reason, StopReason::kInterrupted);
  EXPECT_EQ(bare.hpc_checkpoint_path, "");
  EXPECT_TRUE(list_hpc_checkpoints(root_.string()).empty());
}

TEST_F(RequeueTest, AFailedRequeueKeepsTheCheckpointAndSaysHowToResume) {
  write_scontrol("echo 'scontrol: error: Requested operation is presently disabled for job 70_7' >&2; exit 1");
  TinyOptions signalled{.train_size = 40};
  signalled.signal_at_batch = 1;
  ::testing::internal::CaptureStderr();
  const FitResult result = run_job(signalled, {.max_epochs = 1}, 0);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(result.reason, StopReason::kInterrupted);
  EXPECT_NE(result.message.find("presently disabled"), std::string::npos) << result.message;
  EXPECT_TRUE(fs::exists(result.hpc_checkpoint_path));
  EXPECT_NE(err.find("HINT: allow requeueing (#SBATCH --requeue)"), std::string::npos) << err;
}

TEST_F(RequeueTest, OutsideSlurmTheRequeueSignalIsLeftAlone) {
  struct sigaction before {};
  sigaction(SIGUSR1, nullptr, &before);
  Trainer trainer = make_trainer({.max_epochs = 1});
  EXPECT_FALSE(trainer.plan().requeue.enabled);
  struct sigaction during {};
  sigaction(SIGUSR1, nullptr, &during);
  EXPECT_EQ(during.sa_handler, before.sa_handler) << "no handler is installed outside SLURM";
  {
    Trainer in_slurm(quiet({}), slurm_env(0), MachineInfo{1, "/tmp"});
    sigaction(SIGUSR1, nullptr, &during);
    EXPECT_NE(during.sa_handler, before.sa_handler) << "a SLURM batch job catches it from construction on";
  }
  sigaction(SIGUSR1, nullptr, &during);
  EXPECT_EQ(during.sa_handler, before.sa_handler) << "and gives it back with the Trainer";
}

}  // namespace
}  // namespace volt
