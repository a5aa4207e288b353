// Behaviour tests of the Trainer's debugging and checkpointing options against Lightning's
// semantics: min_steps, overfit_batches, detect_anomaly, deterministic="warn", the model summary's
// depth, and ModelCheckpoint's save_weights_only and train_time_interval.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/anomaly_mode.h>

#include "volt/checkpoint/sharded_checkpoint.h"
#include "volt/core/console.h"
#include "volt/core/testing.h"
#include "volt/trainer/trainer_testing.h"

namespace volt {
namespace {

using namespace volt::trainer_testing;  // NOLINT: the shared fixture and helpers

/// TinyModule that records, per training and validation step, the first feature of its batch's
/// first example (which batch it was) and the process settings the step ran under.
class WatchedModule : public TinyModule {
 public:
  using TinyModule::TinyModule;

  torch::Tensor training_step(const Batch& batch, int64_t batch_idx) override {
    train_batches.push_back(batch.data[0][0].item<float>());
    anomaly_mode.push_back(torch::autograd::AnomalyMode::is_enabled());
    deterministic.push_back(at::globalContext().deterministicAlgorithms());
    warn_only.push_back(at::globalContext().deterministicAlgorithmsWarnOnly());
    return TinyModule::training_step(batch, batch_idx);
  }
  void validation_step(const Batch& batch, int64_t batch_idx) override {
    val_batches.push_back(batch.data[0][0].item<float>());
    TinyModule::validation_step(batch, batch_idx);
  }

  std::vector<float> train_batches;
  std::vector<float> val_batches;
  std::vector<bool> anomaly_mode;
  std::vector<bool> deterministic;
  std::vector<bool> warn_only;
};

std::unique_ptr<WatchedModule> make_watched(TinyOptions options = {}) {
  torch::manual_seed(7);
  return std::make_unique<WatchedModule>(std::move(options));
}

/// The first feature of the first example of each batch of `size` in `data`, unshuffled.
std::vector<float> batch_starts(const TensorDataset& data, int64_t batches, int64_t size) {
  std::vector<float> out;
  for (int64_t b = 0; b < batches; ++b) {
    out.push_back(data.get_batch(torch::tensor({b * size}, torch::kLong)).data[0][0].item<float>());
  }
  return out;
}

TEST_F(TrainerTest, MinStepsOverridesEarlyStoppingUntilThatManyStepsAreTaken) {
  // 4 steps per epoch; EarlyStopping(patience=2) on a loss that never improves asks to stop at
  // every epoch end from epoch 2 (step 12) on.
  auto module = make_module({.scripted_val_loss = {1.0}});
  auto early = std::make_shared<EarlyStopping>(EarlyStoppingOptions{.monitor = "val/loss", .patience = 2});
  const FitResult result =
      make_trainer({.max_epochs = 10, .min_steps = 22, .num_sanity_val_steps = 0, .callbacks = {early}}).fit(*module);
  EXPECT_EQ(result.reason, StopReason::kCallback);
  EXPECT_EQ(result.global_step, 24) << "the first request at or after step 22 (epoch ends at 12, 16, 20 dropped)";
  EXPECT_EQ(result.epochs_completed, 6);
}

TEST_F(TrainerTest, MinStepsDoesNotOutlastMaxEpochs) {
  auto module = make_module({.scripted_val_loss = {1.0}});
  auto early = std::make_shared<EarlyStopping>(EarlyStoppingOptions{.monitor = "val/loss", .patience = 1});
  const FitResult result =
      make_trainer({.max_epochs = 2, .min_steps = 100, .num_sanity_val_steps = 0, .callbacks = {early}}).fit(*module);
  EXPECT_EQ(result.reason, StopReason::kMaxEpochs) << "limits still stop, as in Lightning";
  EXPECT_EQ(result.global_step, 8);
}

TEST_F(TrainerTest, OverfitBatchesTrainsAndValidatesOnTheSameUnshuffledBatches) {
  auto module = make_watched({.shuffle = true});
  auto console = std::make_shared<RecordingConsole>();
  Trainer trainer = make_trainer({.max_epochs = 3, .overfit_batches = 2, .num_sanity_val_steps = 0});
  trainer.set_console(console);
  // Both loaders shuffle (the module's own validation loader does not, so pass them).
  DataLoader train(module->train_data(), {.batch_size = 4, .shuffle = true});
  DataLoader val_loader(module->val_data(), {.batch_size = 4, .shuffle = true});
  const FitResult result = trainer.fit(*module, train, val_loader);
  EXPECT_EQ(result.global_step, 6) << "2 batches per epoch";
  const std::vector<float> first_two = batch_starts(*module->train_data(), 2, 4);
  EXPECT_EQ(module->train_batches,
            (std::vector<float>{first_two[0], first_two[1], first_two[0], first_two[1], first_two[0], first_two[1]}))
      << "the same first batches every epoch, in the dataset's order";
  const std::vector<float> val = batch_starts(*module->val_data(), 2, 4);
  EXPECT_EQ(module->val_batches, (std::vector<float>{val[0], val[1], val[0], val[1], val[0], val[1]}))
      << "validation on 2 batches of the validation loader (Lightning 1.6+)";
  ASSERT_EQ(console->warnings.size(), 2u);
  EXPECT_EQ(console->warnings[0],
            "You requested to overfit but enabled train dataloader shuffling. We are turning off the train "
            "dataloader shuffling for you.");
  EXPECT_EQ(console->warnings[1],
            "You requested to overfit but enabled val dataloader shuffling. We are turning off the val dataloader "
            "shuffling for you.");
}

TEST_F(TrainerTest, OverfitBatchesAsAFractionTakesThatPartOfTheEpoch) {
  auto module = make_watched({.shuffle = false});
  auto console = std::make_shared<RecordingConsole>();
  Trainer trainer = make_trainer({.max_epochs = 1, .overfit_batches = 0.5, .num_sanity_val_steps = 0});
  trainer.set_console(console);
  trainer.fit(*module);
  EXPECT_EQ(module->train_batches, batch_starts(*module->train_data(), 2, 4)) << "half of 4 batches";
  EXPECT_EQ(module->val_batches.size(), 1u) << "half of 2 batches";
  EXPECT_TRUE(console->warnings.empty()) << "nothing shuffled, nothing to warn about";
}

TEST_F(TrainerTest, DetectAnomalyIsOnDuringFitOnlyAndRestoredAfter) {
  ASSERT_FALSE(torch::autograd::AnomalyMode::is_enabled());
  auto module = make_watched();
  make_trainer({.max_epochs = 1, .detect_anomaly = true}).fit(*module);
  EXPECT_EQ(module->anomaly_mode, std::vector<bool>(4, true));
  EXPECT_FALSE(torch::autograd::AnomalyMode::is_enabled()) << "fit must not leave the process in anomaly mode";

  auto plain = make_watched();
  make_trainer({.max_epochs = 1}).fit(*plain);
  EXPECT_EQ(plain->anomaly_mode, std::vector<bool>(4, false)) << "off unless asked for";
}

/// A module whose backward produces NaN (log's gradient 0/0) while its forward pass is finite up
/// to the loss: what detect_anomaly exists to pin down.
class NanGradientModule : public TinyModule {
 public:
  using TinyModule::TinyModule;
  torch::Tensor training_step(const Batch& batch, int64_t) override {
    const torch::Tensor prediction = forward(batch.data);
    return (torch::log(prediction - prediction.detach()) * 0).sum();
  }
};

TEST_F(TrainerTest, DetectAnomalyNamesTheBackwardThatProducedNan) {
  torch::manual_seed(7);
  NanGradientModule module;
  std::string message;
  try {
    make_trainer({.max_epochs = 1, .detect_anomaly = true}).fit(module);
  } catch (const std::exception& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("LogBackward"), std::string::npos) << message;
  EXPECT_NE(message.find("nan"), std::string::npos) << message;
  EXPECT_FALSE(torch::autograd::AnomalyMode::is_enabled()) << "restored also when fit throws";

  torch::manual_seed(7);
  NanGradientModule quiet_nan;
  EXPECT_NO_THROW(make_trainer({.max_epochs = 1}).fit(quiet_nan)) << "without the option NaN passes silently";
}

TEST_F(TrainerTest, DeterministicWarnTurnsOnDeterministicAlgorithmsWithWarningsOnlyForTheStage) {
  at::globalContext().setDeterministicAlgorithms(false, false);
  auto module = make_watched();
  make_trainer({.max_epochs = 1, .deterministic = "warn"}).fit(*module);
  EXPECT_EQ(module->deterministic, std::vector<bool>(4, true));
  EXPECT_EQ(module->warn_only, std::vector<bool>(4, true));
  EXPECT_FALSE(at::globalContext().deterministicAlgorithms());
  EXPECT_FALSE(at::globalContext().deterministicAlgorithmsWarnOnly());

  auto strict = make_watched();
  make_trainer({.max_epochs = 1, .deterministic = true}).fit(*strict);
  EXPECT_EQ(strict->deterministic, std::vector<bool>(4, true));
  EXPECT_EQ(strict->warn_only, std::vector<bool>(4, false)) << "true refuses, it does not only warn";
}

/// TinyModule with a nested block, so that the summary's depth shows.
class NestedModule : public TinyModule {
 public:
  NestedModule() { register_module("head", torch::nn::Sequential(torch::nn::Linear(1, 1))); }
};

/// The model summary fit printed through `console`, or "" without one.
std::string printed_summary(const RecordingConsole& console) {
  for (const std::string& line : console.infos)
    if (line.find("Total params") != std::string::npos) return line;
  return "";
}

TEST_F(TrainerTest, ModelSummaryMaxDepthChoosesTheLevelsListed) {
  const auto summary_with = [this](TrainerOptions options) {
    NestedModule module;
    auto console = std::make_shared<RecordingConsole>();
    TrainerOptions shown = quiet(std::move(options));
    shown.enable_model_summary = true;
    Trainer trainer(shown, Env(Env::Vars{}), MachineInfo{1, "/tmp"});
    trainer.set_console(console);
    trainer.fit(module);
    return printed_summary(*console);
  };
  const std::string top = summary_with({.max_epochs = 1});
  EXPECT_NE(top.find("head "), std::string::npos) << top;
  EXPECT_EQ(top.find("head.0"), std::string::npos) << "depth 1 lists the direct submodules only\n" << top;
  const std::string deep = summary_with({.max_epochs = 1, .model_summary_max_depth = 2});
  EXPECT_NE(deep.find("head.0"), std::string::npos) << deep;
  EXPECT_EQ(summary_with({.max_epochs = 1, .model_summary_max_depth = 0}), "") << "depth 0: no summary";
}

TEST_F(TrainerTest, SaveWeightsOnlyCheckpointsHoldWeightsAndRefuseToResume) {
  auto module = make_module();
  auto io = std::make_shared<RecordingCheckpointIO>();
  auto checkpoint =
      std::make_shared<ModelCheckpoint>(ModelCheckpointOptions{.dirpath = "/ck", .save_weights_only = true});
  Trainer trainer = make_trainer({.max_epochs = 2, .callbacks = {checkpoint}});
  trainer.set_checkpoint_io(io);
  trainer.fit(*module);
  const std::string path = "/ck/epoch=1-step=8.ckpt";
  ASSERT_EQ(io->paths(), (std::vector<std::string>{path}));
  const StateDict saved = load_dict(*io, path);
  for (const char* key : {"epoch", "global_step", "state_dict", "loops", "hyper_parameters", "volt_checkpoint_version",
                          "pytorch-lightning_version"}) {
    EXPECT_TRUE(saved.contains(key)) << key;
  }
  for (const char* key : {"optimizer_states", "lr_schedulers", "callbacks", "rng_states"}) {
    EXPECT_FALSE(saved.contains(key)) << key << " is not part of Lightning's weights-only layout";
  }
  EXPECT_TRUE(bit_identical(weights_in(*io, path), parameters_of(*module)));

  // The weights load; a resume is refused before the module is touched.
  auto fresh = make_module({}, /*init_seed=*/99);
  const auto before = parameters_of(*fresh);
  Trainer resume = make_trainer({.max_epochs = 3});
  resume.set_checkpoint_io(io);
  const std::string message = volt::testing::error_message([&] { resume.fit(*fresh, {}, {}, path); });
  EXPECT_NE(message.find("checkpoint '" + path + "' holds only the module's weights"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT: to train on from these weights, call volt::load_weights"), std::string::npos)
      << message;
  EXPECT_TRUE(bit_identical(parameters_of(*fresh), before));
  load_module_weights(io->load(path), *fresh, path);
  EXPECT_TRUE(bit_identical(parameters_of(*fresh), parameters_of(*module)));
}

TEST_F(TrainerTest, WeightsInShardFilesAreNamedUnlessTheCallerLoadsThem) {
  auto module = make_module();
  auto io = std::make_shared<RecordingCheckpointIO>();
  Trainer trainer = make_trainer(
      {.max_epochs = 1, .callbacks = {std::make_shared<ModelCheckpoint>(ModelCheckpointOptions{.dirpath = "/ck"})}});
  trainer.set_checkpoint_io(io);
  trainer.fit(*module);
  ASSERT_EQ(io->paths().size(), 1U);
  // As fsdp full_shard's sharded checkpoint lays it out: one parameter only in the shards.
  StateDict top = load_dict(*io, io->paths().front()).copy();
  StateDict weights = top.at("state_dict").toGenericDict().copy();
  const std::string sharded = weights.begin()->key().toStringRef();
  (void)weights.erase(sharded);
  top.insert_or_assign("state_dict", weights);
  c10::impl::GenericList names(c10::StringType::get());
  names.push_back(sharded);
  top.insert(kShardedParametersKey, names);

  auto fresh = make_module({}, /*init_seed=*/99);
  const auto before = parameters_of(*fresh);
  const std::string message = volt::testing::error_message([&] { load_module_weights(top, *fresh, "s.ckpt"); });
  EXPECT_NE(message.find("checkpoint 's.ckpt' holds 1 of its parameters ('" + sharded + "', ...) in its shard files"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("HINT"), std::string::npos) << message;
  EXPECT_NE(message.find("consolidate_sharded_checkpoint"), std::string::npos) << message;
  EXPECT_TRUE(bit_identical(parameters_of(*fresh), before));
  // A caller that loads the shards itself (fsdp's fit) gets the rest loaded and that one left.
  load_module_weights(top, *fresh, "s.ckpt", /*skip_sharded=*/true);
  const auto after = parameters_of(*fresh);
  const auto trained = parameters_of(*module);
  for (const auto& [name, value] : after) {
    EXPECT_TRUE(torch::equal(value, name == sharded ? before.at(name) : trained.at(name))) << name;
  }
}

TEST_F(TrainerTest, TrainTimeIntervalSavesOnTheClockOfTheRun) {
  // A clock that advances one minute per reading: a reading per training batch.
  auto now = std::make_shared<std::chrono::steady_clock::time_point>();
  auto checkpoint = std::make_shared<ModelCheckpoint>(
      ModelCheckpointOptions{.dirpath = "/ck", .save_top_k = -1, .train_time_interval = std::chrono::minutes(3)},
      [now] { return *now += std::chrono::minutes(1); });
  auto module = make_module();
  auto io = std::make_shared<RecordingCheckpointIO>();
  Trainer trainer = make_trainer({.max_epochs = 2, .callbacks = {checkpoint}});
  trainer.set_checkpoint_io(io);
  trainer.fit(*module);
  EXPECT_EQ(io->saves, (std::vector<std::string>{"/ck/epoch=0-step=4.ckpt", "/ck/epoch=1-step=7.ckpt"}))
      << "the clock starts at batch 1; 3 minutes later is batch 4, then batch 7; no epoch saves";
}

}  // namespace
}  // namespace volt
