// Every hook of the module and of its callbacks, in the order a fit, validate, test and predict
// call them (Lightning's tests/tests_pytorch/models/test_hooks.py records the same), and what the
// hooks that return or change something do: the batch transfer hooks, configure_callbacks,
// on_exception, lr_scheduler_step and configure_gradient_clipping.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "volt/trainer/trainer_testing.h"

namespace volt {
namespace {

using namespace volt::trainer_testing;  // NOLINT: the shared fixture and helpers

/// TinyModule that records every hook in `calls` (the steps record themselves there).
class HookedModule : public TinyModule {
 public:
  using TinyModule::TinyModule;

  void setup(Stage stage) override { calls.push_back(fmt::format("setup({})", to_string(stage))); }
  void teardown(Stage stage) override { calls.push_back(fmt::format("teardown({})", to_string(stage))); }
  void configure_model() override { calls.push_back("configure_model"); }
  std::vector<std::shared_ptr<Callback>> configure_callbacks() override {
    calls.push_back("configure_callbacks");
    return {};
  }
  Batch on_before_batch_transfer(Batch batch, int64_t dataloader_idx) override {
    calls.push_back("on_before_batch_transfer");
    return TinyModule::on_before_batch_transfer(std::move(batch), dataloader_idx);
  }
  Batch transfer_batch_to_device(Batch batch, torch::Device device, int64_t dataloader_idx) override {
    calls.push_back("transfer_batch_to_device");
    return TinyModule::transfer_batch_to_device(std::move(batch), device, dataloader_idx);
  }
  Batch on_after_batch_transfer(Batch batch, int64_t dataloader_idx) override {
    calls.push_back("on_after_batch_transfer");
    return TinyModule::on_after_batch_transfer(std::move(batch), dataloader_idx);
  }
  void on_before_backward(const torch::Tensor&) override { calls.push_back("on_before_backward"); }
  void on_after_backward() override { calls.push_back("on_after_backward"); }
  void configure_gradient_clipping(torch::optim::Optimizer& optimizer, std::optional<double> value,
                                   GradientClipAlgorithm algorithm) override {
    calls.push_back("configure_gradient_clipping");
    TinyModule::configure_gradient_clipping(optimizer, value, algorithm);
  }
  void on_before_zero_grad(torch::optim::Optimizer&) override { calls.push_back("on_before_zero_grad"); }
  void lr_scheduler_step(LRScheduler& scheduler, std::optional<double> metric) override {
    calls.push_back("lr_scheduler_step");
    TinyModule::lr_scheduler_step(scheduler, metric);
  }
  void on_validation_start() override { calls.push_back("on_validation_start"); }
  void on_validation_end() override { calls.push_back("on_validation_end"); }
  void on_validation_batch_start(const Batch&, int64_t, int64_t) override {
    calls.push_back("on_validation_batch_start");
  }
  void on_validation_batch_end(const Batch&, int64_t, int64_t) override { calls.push_back("on_validation_batch_end"); }
  void on_test_start() override { calls.push_back("on_test_start"); }
  void on_test_end() override { calls.push_back("on_test_end"); }
  void on_test_epoch_start() override { calls.push_back("on_test_epoch_start"); }
  void on_test_epoch_end() override { calls.push_back("on_test_epoch_end"); }
  void on_test_batch_start(const Batch&, int64_t, int64_t) override { calls.push_back("on_test_batch_start"); }
  void on_test_batch_end(const Batch&, int64_t, int64_t) override { calls.push_back("on_test_batch_end"); }
  void on_predict_start() override { calls.push_back("on_predict_start"); }
  void on_predict_end() override { calls.push_back("on_predict_end"); }
  void on_predict_epoch_start() override { calls.push_back("on_predict_epoch_start"); }
  void on_predict_epoch_end() override { calls.push_back("on_predict_epoch_end"); }
  void on_predict_batch_start(const Batch&, int64_t, int64_t) override { calls.push_back("on_predict_batch_start"); }
  void on_predict_batch_end(const torch::Tensor&, const Batch&, int64_t, int64_t) override {
    calls.push_back("on_predict_batch_end");
  }
  torch::Tensor predict_step(const Batch& batch, int64_t batch_idx) override {
    calls.push_back("predict_step");
    return TinyModule::predict_step(batch, batch_idx);
  }
  void on_save_checkpoint(StateDict&) override { calls.push_back("on_save_checkpoint"); }
};

/// Records its hooks as "Callback.<hook>" into a module's `calls`, and notes a hook whose context
/// lacks what it should carry (the module; in fit the optimizers; at a batch hook the batch).
class HookedCallback : public Callback {
 public:
  explicit HookedCallback(std::vector<std::string>& calls) : calls_(calls) {}
  std::string state_key() const override { return "HookedCallback"; }

  void setup(const FitInfo&) override { calls_.push_back("Callback.setup"); }
  void on_before_configure_optimizers(LightningModule& module) override {
    calls_.push_back("Callback.on_before_configure_optimizers");
  }
  Decision on_sanity_check_start(const CallbackContext& c, CallbackServices&) override {
    if (!c.sanity_checking) calls_.push_back("on_sanity_check_start outside the sanity check");
    return record("on_sanity_check_start", c);
  }
  Decision on_sanity_check_end(const CallbackContext& c, CallbackServices&) override {
    if (!c.sanity_checking) calls_.push_back("on_sanity_check_end outside the sanity check");
    return record("on_sanity_check_end", c);
  }
  Decision on_fit_start(const CallbackContext& c, CallbackServices&) override { return record("on_fit_start", c); }
  Decision on_train_start(const CallbackContext& c, CallbackServices&) override { return record("on_train_start", c); }
  Decision on_train_epoch_start(const CallbackContext& c, CallbackServices&) override {
    return record("on_train_epoch_start", c);
  }
  Decision on_train_batch_start(const CallbackContext& c, CallbackServices&) override {
    return record("on_train_batch_start", c, /*batch=*/true);
  }
  Decision on_before_backward(const CallbackContext& c, CallbackServices&, const torch::Tensor& loss) override {
    if (!loss.defined() || !loss.requires_grad()) calls_.push_back("on_before_backward without the loss");
    return record("on_before_backward", c);
  }
  Decision on_after_backward(const CallbackContext& c, CallbackServices&) override {
    return record("on_after_backward", c);
  }
  Decision on_before_zero_grad(const CallbackContext& c, CallbackServices&,
                               torch::optim::Optimizer& optimizer) override {
    if (c.optimizers == nullptr || c.optimizers->front().get() != &optimizer) {
      calls_.push_back("on_before_zero_grad got another optimizer than the context's");
    }
    return record("on_before_zero_grad", c);
  }
  Decision on_before_optimizer_step(const CallbackContext& c, CallbackServices&, torch::optim::Optimizer& optimizer,
                                    size_t index) override {
    if (c.optimizers == nullptr || c.optimizers->at(index).get() != &optimizer) {
      calls_.push_back("on_before_optimizer_step got another optimizer than the context's");
    }
    return record("on_before_optimizer_step", c);
  }
  Decision on_train_batch_end(const CallbackContext& c, CallbackServices&) override {
    if (c.outputs == nullptr || !c.outputs->defined()) calls_.push_back("on_train_batch_end without the loss");
    return record("on_train_batch_end", c, /*batch=*/true);
  }
  Decision on_train_epoch_end(const CallbackContext& c, CallbackServices&) override {
    return record("on_train_epoch_end", c);
  }
  Decision on_validation_end(const CallbackContext& c, CallbackServices&) override {
    return record("on_validation_end", c);
  }
  Decision on_validation_epoch_start(const CallbackContext& c, CallbackServices&) override {
    return record("on_validation_epoch_start", c);
  }
  Decision on_validation_epoch_end(const CallbackContext& c, CallbackServices&) override {
    return record("on_validation_epoch_end", c);
  }
  Decision on_validation_batch_start(const CallbackContext& c, CallbackServices&) override {
    return record("on_validation_batch_start", c, /*batch=*/true);
  }
  Decision on_validation_batch_end(const CallbackContext& c, CallbackServices&) override {
    return record("on_validation_batch_end", c, /*batch=*/true);
  }
  Decision on_test_epoch_start(const CallbackContext& c, CallbackServices&) override {
    return record("on_test_epoch_start", c);
  }
  Decision on_test_epoch_end(const CallbackContext& c, CallbackServices&) override {
    return record("on_test_epoch_end", c);
  }
  Decision on_test_batch_start(const CallbackContext& c, CallbackServices&) override {
    return record("on_test_batch_start", c, /*batch=*/true);
  }
  Decision on_test_batch_end(const CallbackContext& c, CallbackServices&) override {
    return record("on_test_batch_end", c, /*batch=*/true);
  }
  Decision on_predict_start(const CallbackContext& c, CallbackServices&) override {
    return record("on_predict_start", c);
  }
  Decision on_predict_end(const CallbackContext& c, CallbackServices&) override { return record("on_predict_end", c); }
  Decision on_predict_batch_start(const CallbackContext& c, CallbackServices&) override {
    return record("on_predict_batch_start", c, /*batch=*/true);
  }
  Decision on_predict_batch_end(const CallbackContext& c, CallbackServices&) override {
    if (c.outputs == nullptr || !c.outputs->defined()) calls_.push_back("on_predict_batch_end without the output");
    return record("on_predict_batch_end", c, /*batch=*/true);
  }
  Decision on_train_end(const CallbackContext& c, CallbackServices&) override { return record("on_train_end", c); }
  void on_fit_end(const CallbackContext& c, CallbackServices&) override { record("on_fit_end", c); }
  void on_save_checkpoint(const CallbackContext& c, StateDict&) override {
    if (c.module == nullptr) calls_.push_back("on_save_checkpoint without the module");
    calls_.push_back("Callback.on_save_checkpoint");
  }
  void on_exception(const CallbackContext&, const std::exception& error, CallbackServices&) override {
    calls_.push_back(std::string("Callback.on_exception: ") + error.what());
  }

 private:
  Decision record(const std::string& hook, const CallbackContext& c, bool batch = false) {
    if (c.module == nullptr) calls_.push_back(hook + " without the module");
    if (batch && (c.batch == nullptr || c.batch_idx < 0)) calls_.push_back(hook + " without the batch");
    calls_.push_back("Callback." + hook);
    return {};
  }

  std::vector<std::string>& calls_;
};

std::vector<std::string> repeat(int times, const std::vector<std::string>& part) {
  std::vector<std::string> out;
  for (int i = 0; i < times; ++i) out.insert(out.end(), part.begin(), part.end());
  return out;
}

std::vector<std::string> concat(std::initializer_list<std::vector<std::string>> parts) {
  std::vector<std::string> out;
  for (const auto& part : parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

const std::vector<std::string> kTransfer = {"on_before_batch_transfer", "transfer_batch_to_device",
                                            "on_after_batch_transfer"};

/// One validation pass of `batches` batches (Lightning's _eval_epoch, with Volt's module-level
/// on_validation_start/end around it; the callbacks' on_validation_end is fit's, after it).
std::vector<std::string> validation_pass(int batches) {
  return concat(
      {{"on_validation_start", "Callback.on_validation_epoch_start", "on_validation_epoch_start"},
       repeat(batches, concat({kTransfer,
                               {"Callback.on_validation_batch_start", "on_validation_batch_start", "validation_step",
                                "Callback.on_validation_batch_end", "on_validation_batch_end"}})),
       {"Callback.on_validation_epoch_end", "on_validation_epoch_end", "on_validation_end"}});
}

TEST_F(TrainerTest, EveryHookOfAFitValidateTestAndPredictRunsInLightningsOrder) {
  // 2 training batches and 1 validation batch an epoch, a sanity check of 1 batch, an
  // epoch-interval scheduler; the callback's hooks are recorded beside the module's.
  auto module = std::make_unique<HookedModule>(
      TinyOptions{.train_size = 8, .val_size = 4, .shuffle = false, .scheduler = Interval::kEpoch});
  auto callback = std::make_shared<HookedCallback>(module->calls);
  Trainer trainer = make_trainer({.max_epochs = 1, .num_sanity_val_steps = 1, .callbacks = {callback}});
  trainer.set_checkpoint_io(std::make_shared<RecordingCheckpointIO>());
  trainer.fit(*module);

  const std::vector<std::string> train_batch =
      concat({kTransfer,
              {"Callback.on_train_batch_start", "on_train_batch_start", "training_step", "Callback.on_before_backward",
               "on_before_backward", "Callback.on_after_backward", "on_after_backward", "configure_gradient_clipping",
               "Callback.on_before_optimizer_step", "on_before_optimizer_step", "Callback.on_before_zero_grad",
               "on_before_zero_grad", "on_train_batch_end", "Callback.on_train_batch_end"}});
  const std::vector<std::string> fit = concat({
      {"configure_callbacks", "setup(fit)", "configure_model", "Callback.on_before_configure_optimizers",
       "configure_optimizers", "Callback.setup", "Callback.on_fit_start", "on_fit_start",
       "Callback.on_sanity_check_start"},
      validation_pass(1),  // the sanity check
      {"Callback.on_sanity_check_end", "Callback.on_train_start", "on_train_start", "Callback.on_train_epoch_start",
       "on_train_epoch_start"},
      repeat(2, train_batch),
      validation_pass(1),  // the epoch's validation, before on_train_epoch_end
      {"on_train_epoch_end", "lr_scheduler_step", "Callback.on_validation_end",
       // the default ModelCheckpoint (after the user's callbacks) saves here
       "Callback.on_save_checkpoint", "on_save_checkpoint", "Callback.on_train_epoch_end", "Callback.on_train_end",
       "on_train_end", "Callback.on_fit_end", "on_fit_end", "teardown(fit)"},
  });
  EXPECT_EQ(module->calls, fit);

  module->calls.clear();
  trainer.validate(*module);
  EXPECT_EQ(module->calls, concat({{"configure_callbacks", "setup(validate)", "configure_model"},
                                   validation_pass(1),
                                   {"teardown(validate)"}}));

  module->calls.clear();
  trainer.test(*module);
  EXPECT_EQ(module->calls, concat({{"configure_callbacks", "setup(test)", "configure_model", "on_test_start",
                                    "Callback.on_test_epoch_start", "on_test_epoch_start"},
                                   kTransfer,
                                   {"Callback.on_test_batch_start", "on_test_batch_start", "test_step",
                                    "Callback.on_test_batch_end", "on_test_batch_end", "Callback.on_test_epoch_end",
                                    "on_test_epoch_end", "on_test_end", "teardown(test)"}}));

  module->calls.clear();
  trainer.predict(*module);
  EXPECT_EQ(module->calls, concat({{"configure_callbacks", "setup(predict)", "configure_model",
                                    "Callback.on_predict_start", "on_predict_start", "on_predict_epoch_start"},
                                   kTransfer,
                                   {"Callback.on_predict_batch_start", "on_predict_batch_start", "predict_step",
                                    "Callback.on_predict_batch_end", "on_predict_batch_end", "on_predict_epoch_end",
                                    "Callback.on_predict_end", "on_predict_end", "teardown(predict)"}}));
}

TEST_F(TrainerTest, ManualOptimizationCallsTheBackwardHooksAroundManualBackward) {
  auto module = std::make_unique<HookedModule>(TinyOptions{.train_size = 4, .val_size = 4, .manual = true});
  Trainer trainer = make_trainer({.max_epochs = 1, .enable_checkpointing = false});
  trainer.fit(*module);
  const auto step = std::find(module->calls.begin(), module->calls.end(), "training_step");
  ASSERT_NE(step, module->calls.end());
  // training_step calls manual_backward and steps: the hooks run inside it, and Lightning calls
  // neither configure_gradient_clipping nor on_before_zero_grad under manual optimization.
  EXPECT_EQ(std::vector<std::string>(step, step + 4),
            (std::vector<std::string>{"training_step", "on_before_backward", "on_after_backward",
                                      "on_before_optimizer_step"}));
  EXPECT_EQ(module->count("configure_gradient_clipping"), 0);
  EXPECT_EQ(module->count("on_before_zero_grad"), 0);
}

/// Adds 1 to the inputs before the transfer, doubles the targets after it, and records what the
/// steps saw.
class TransformingModule : public TinyModule {
 public:
  using TinyModule::TinyModule;
  Batch on_before_batch_transfer(Batch batch, int64_t) override {
    batch.data = batch.data + 1;
    return batch;
  }
  Batch transfer_batch_to_device(Batch batch, torch::Device device, int64_t dataloader_idx) override {
    devices.push_back(device.str());
    return TinyModule::transfer_batch_to_device(std::move(batch), device, dataloader_idx);
  }
  Batch on_after_batch_transfer(Batch batch, int64_t) override {
    batch.target = batch.target * 2;
    return batch;
  }
  torch::Tensor training_step(const Batch& batch, int64_t batch_idx) override {
    if (batch_idx == 0) first_train = {batch.data.clone(), batch.target.clone()};
    return TinyModule::training_step(batch, batch_idx);
  }
  void validation_step(const Batch& batch, int64_t batch_idx) override {
    if (batch_idx == 0) first_val = {batch.data.clone(), batch.target.clone()};
  }
  torch::Tensor predict_step(const Batch& batch, int64_t) override { return batch.data; }

  std::pair<torch::Tensor, torch::Tensor> first_train;
  std::pair<torch::Tensor, torch::Tensor> first_val;
  std::vector<std::string> devices;
};

TEST_F(TrainerTest, TheBatchTransferHooksTransformWhatEveryStepSees) {
  auto module = std::make_unique<TransformingModule>(TinyOptions{.train_size = 8, .val_size = 4, .shuffle = false});
  Trainer trainer = make_trainer({.max_epochs = 1, .num_sanity_val_steps = 0, .enable_checkpointing = false});
  trainer.fit(*module);
  const Batch train = module->train_data()->get_batch(torch::arange(4));
  const Batch val = module->val_data()->get_batch(torch::arange(4));
  ASSERT_TRUE(module->first_train.first.defined());
  EXPECT_TRUE(torch::equal(module->first_train.first, train.data + 1));
  EXPECT_TRUE(torch::equal(module->first_train.second, train.target * 2));
  ASSERT_TRUE(module->first_val.first.defined());
  EXPECT_TRUE(torch::equal(module->first_val.first, val.data + 1));
  EXPECT_TRUE(torch::equal(module->first_val.second, val.target * 2));
  // 2 training and 1 validation batch, each moved to the run's device.
  EXPECT_EQ(module->devices, (std::vector<std::string>{"cpu", "cpu", "cpu"}));

  const std::vector<torch::Tensor> predictions = trainer.predict(*module);
  ASSERT_EQ(predictions.size(), 1u);
  EXPECT_TRUE(torch::equal(predictions[0], val.data + 1));
}

/// Counts the hooks it sees; two of them are of the same type.
class CountingCallback : public Callback {
 public:
  std::string state_key() const override { return "CountingCallback"; }
  Decision on_train_batch_end(const CallbackContext&, CallbackServices&) override {
    ++batches;
    return {};
  }
  Decision on_test_batch_end(const CallbackContext&, CallbackServices&) override {
    ++test_batches;
    return {};
  }
  int batches = 0;
  int test_batches = 0;
};

/// Another type, which the module's CountingCallback must not replace.
class OtherCountingCallback : public CountingCallback {
 public:
  std::string state_key() const override { return "OtherCountingCallback"; }
};

class ModuleWithCallbacks : public TinyModule {
 public:
  using TinyModule::TinyModule;
  std::vector<std::shared_ptr<Callback>> configure_callbacks() override { return {own}; }
  std::shared_ptr<CountingCallback> own = std::make_shared<CountingCallback>();
};

TEST_F(TrainerTest, ConfigureCallbacksAddsTheModulesCallbacksReplacingTheTrainersOfTheSameType) {
  auto module = std::make_unique<ModuleWithCallbacks>(TinyOptions{.train_size = 8, .val_size = 4});
  auto replaced = std::make_shared<CountingCallback>();
  auto kept = std::make_shared<OtherCountingCallback>();
  Trainer trainer = make_trainer({.max_epochs = 1, .callbacks = {replaced, kept}, .enable_checkpointing = false});
  trainer.fit(*module);
  EXPECT_EQ(module->own->batches, 2);
  EXPECT_EQ(replaced->batches, 0) << "the module's CountingCallback replaces the Trainer's";
  EXPECT_EQ(kept->batches, 2);
  trainer.test(*module);
  EXPECT_EQ(module->own->test_batches, 1);
  EXPECT_EQ(replaced->test_batches, 0);
}

/// Throws from training_step at `train_batch` and from test_step, recording its teardowns.
class ThrowingModule : public TinyModule {
 public:
  using TinyModule::TinyModule;
  torch::Tensor training_step(const Batch& batch, int64_t batch_idx) override {
    if (batch_idx == 1) throw std::runtime_error("training_step failed at batch 1");
    return TinyModule::training_step(batch, batch_idx);
  }
  void test_step(const Batch&, int64_t) override { throw std::runtime_error("test_step failed"); }
  void teardown(Stage stage) override { calls.push_back(fmt::format("teardown({})", to_string(stage))); }
};

TEST_F(TrainerTest, OnExceptionSeesTheErrorOfAFailingStepWhichStillPropagates) {
  auto module = std::make_unique<ThrowingModule>(TinyOptions{.train_size = 8, .val_size = 4});
  std::vector<std::string> seen;
  auto callback = std::make_shared<HookedCallback>(seen);
  Trainer trainer = make_trainer({.max_epochs = 1, .callbacks = {callback}, .enable_checkpointing = false});
  EXPECT_THROW(
      {
        try {
          trainer.fit(*module);
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "training_step failed at batch 1");
          throw;
        }
      },
      std::runtime_error);
  EXPECT_EQ(std::count(seen.begin(), seen.end(), "Callback.on_exception: training_step failed at batch 1"), 1);
  EXPECT_EQ(module->count("teardown(fit)"), 1) << "teardown runs also when the stage fails";

  seen.clear();
  EXPECT_THROW(trainer.test(*module), std::runtime_error);
  EXPECT_EQ(std::count(seen.begin(), seen.end(), "Callback.on_exception: test_step failed"), 1);
  EXPECT_EQ(module->count("teardown(test)"), 1);
}

/// Keeps its optimizer (to read its learning rate); with `freeze_schedule`, lr_scheduler_step
/// records its calls and never steps the scheduler.
class ScheduleModule : public TinyModule {
 public:
  ScheduleModule(TinyOptions options, bool freeze_schedule)
      : TinyModule(std::move(options)), freeze_schedule_(freeze_schedule) {}
  OptimizerConfig configure_optimizers() override {
    OptimizerConfig config = TinyModule::configure_optimizers();
    optimizer = config.optimizers.at(0);
    return config;
  }
  void lr_scheduler_step(LRScheduler& scheduler, std::optional<double> metric) override {
    ++scheduler_steps;
    had_metric = had_metric || metric.has_value();
    if (!freeze_schedule_) TinyModule::lr_scheduler_step(scheduler, metric);
  }
  double lr() const { return optimizer->param_groups()[0].options().get_lr(); }

  std::shared_ptr<torch::optim::Optimizer> optimizer;
  int scheduler_steps = 0;
  bool had_metric = false;

 private:
  bool freeze_schedule_;
};

TEST_F(TrainerTest, TheLoopStepsSchedulersThroughLrSchedulerStep) {
  // StepLR(step_size=2, gamma=0.5) at epoch interval from lr 0.1: two epochs halve it once.
  const TinyOptions options{.train_size = 8, .val_size = 4, .lr = 0.1, .scheduler = Interval::kEpoch};
  ScheduleModule stepped(options, /*freeze_schedule=*/false);
  make_trainer({.max_epochs = 2, .enable_checkpointing = false}).fit(stepped);
  EXPECT_EQ(stepped.scheduler_steps, 2);
  EXPECT_DOUBLE_EQ(stepped.lr(), 0.05);

  ScheduleModule frozen(options, /*freeze_schedule=*/true);
  make_trainer({.max_epochs = 2, .enable_checkpointing = false}).fit(frozen);
  EXPECT_EQ(frozen.scheduler_steps, 2);
  EXPECT_FALSE(frozen.had_metric) << "StepLR needs no metric";
  EXPECT_DOUBLE_EQ(frozen.lr(), 0.1) << "the override did not step, so nothing else may have";
}

/// Records what configure_gradient_clipping is given and zeroes every gradient instead of
/// clipping, so the optimizer steps change nothing.
class ZeroingClipModule : public TinyModule {
 public:
  using TinyModule::TinyModule;
  void configure_gradient_clipping(torch::optim::Optimizer& optimizer, std::optional<double> value,
                                   GradientClipAlgorithm algorithm) override {
    given.emplace_back(value, algorithm);
    clip_gradients(optimizer, 1e-30, GradientClipAlgorithm::kValue);
    for (auto& group : optimizer.param_groups())
      for (auto& p : group.params())
        if (p.grad().defined()) p.grad().zero_();
  }
  std::vector<std::pair<std::optional<double>, GradientClipAlgorithm>> given;
};

TEST_F(TrainerTest, TheLoopClipsGradientsThroughConfigureGradientClipping) {
  const TinyOptions options{.train_size = 8, .val_size = 4};
  auto module = std::make_unique<ZeroingClipModule>(options);
  const auto before = parameters_of(*module);
  make_trainer({.max_epochs = 1,
                .gradient_clip_val = 0.5,
                .gradient_clip_algorithm = GradientClipAlgorithm::kValue,
                .enable_checkpointing = false})
      .fit(*module);
  ASSERT_EQ(module->given.size(), 2u) << "once per optimizer step";
  EXPECT_EQ(module->given[0].first, 0.5);
  EXPECT_EQ(module->given[0].second, GradientClipAlgorithm::kValue);
  EXPECT_TRUE(bit_identical(parameters_of(*module), before)) << "the override's zero gradients were not used";

  // The default clips with the Trainer's value, and training changes the weights.
  auto plain = std::make_unique<TinyModule>(options);
  const auto plain_before = parameters_of(*plain);
  make_trainer({.max_epochs = 1, .gradient_clip_val = 0.5, .enable_checkpointing = false}).fit(*plain);
  EXPECT_FALSE(bit_identical(parameters_of(*plain), plain_before));
}

}  // namespace
}  // namespace volt
