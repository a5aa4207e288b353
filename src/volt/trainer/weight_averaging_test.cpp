// StochasticWeightAveraging and EMAWeightAveraging in real fits: the final weights equal an
// average computed here from the weights a recording callback saw, and a run stopped at a
// checkpoint (inside an epoch too) and resumed ends bit-identical to one that never stopped.
#include "volt/callbacks/weight_averaging.h"

#include <gtest/gtest.h>

#include "volt/trainer/trainer_testing.h"

namespace volt {
namespace {

using namespace volt::trainer_testing;  // NOLINT: the shared fixture and helpers
using Weights = std::map<std::string, torch::Tensor>;

/// Records the module's weights where the averages read them, and the learning rate of each epoch.
class AveragingRecorder : public Callback {
 public:
  std::string state_key() const override { return "AveragingRecorder"; }
  Decision on_train_epoch_start(const CallbackContext& context, CallbackServices&) override {
    at_epoch_start.push_back(parameters_of(*context.module));
    return {};
  }
  Decision on_train_batch_start(const CallbackContext& context, CallbackServices&) override {
    if (context.batch_idx == 0) epoch_lrs.push_back(context.optimizers->front()->param_groups()[0].options().get_lr());
    return {};
  }
  Decision on_train_batch_end(const CallbackContext& context, CallbackServices&) override {
    after_step.push_back(parameters_of(*context.module));
    return {};
  }
  Decision on_validation_batch_start(const CallbackContext& context, CallbackServices&) override {
    if (!context.sanity_checking) validated_with.push_back(parameters_of(*context.module));
    return {};
  }
  std::vector<Weights> at_epoch_start;
  std::vector<double> epoch_lrs;
  std::vector<Weights> after_step;
  std::vector<Weights> validated_with;
};

/// Success when every tensor of `a` is within `tolerance` of `b`'s.
::testing::AssertionResult close(const Weights& a, const Weights& b, double tolerance = 1e-6) {
  for (const auto& [name, tensor] : a) {
    if (!b.count(name) || !torch::allclose(tensor, b.at(name), 0.0, tolerance))
      return ::testing::AssertionFailure() << name << " differs";
  }
  return ::testing::AssertionSuccess();
}

using CallbackFactory = std::function<std::vector<std::shared_ptr<Callback>>()>;

class WeightAveragingTest : public TrainerTest {
 public:
  /// Fits a fresh module (weights from `init_seed`) with `callbacks` and returns its final weights.
  Weights fit(TrainerOptions options, std::vector<std::shared_ptr<Callback>> callbacks,
              const std::string& ckpt_path = "", uint64_t init_seed = 7, TinyOptions module_options = {}) {
    auto module = make_module(module_options, init_seed);
    options.seed = 1;
    options.callbacks = std::move(callbacks);
    Trainer trainer = make_trainer(std::move(options));
    trainer.set_checkpoint_io(io_);
    last_result_ = trainer.fit(*module, {}, {}, ckpt_path);
    return parameters_of(*module);
  }

  /// Trains `max_epochs` straight, and again stopped at `stop_step` (with a checkpoint there)
  /// and resumed from that checkpoint in a module with other initial weights; expects the same
  /// final weights bit for bit, or (`drop_state`, the control) different ones when the
  /// checkpoint loses the callback state (or the top-level entry) named `drop_state`.
  void expect_exact_resume(const CallbackFactory& callbacks, int64_t max_epochs, int64_t stop_step,
                           const std::string& suffix, const std::string& drop_state = "") {
    io_ = std::make_shared<InMemoryCheckpointIO>();
    const Weights straight = fit({.max_epochs = max_epochs, .enable_checkpointing = false}, callbacks());
    std::vector<std::shared_ptr<Callback>> stopping = callbacks();
    stopping.push_back(
        std::make_shared<ModelCheckpoint>(ModelCheckpointOptions{.save_top_k = -1, .every_n_train_steps = stop_step}));
    fit({.max_epochs = max_epochs, .max_steps = stop_step}, stopping);
    const std::string path = path_ending_with(io_->paths(), suffix);
    if (!drop_state.empty()) {
      StateDict checkpoint = load_dict(*io_, path);
      StateDict states = checkpoint.at("callbacks").toGenericDict();
      // A callback's state, or else a key of the checkpoint itself.
      if (!states.erase(drop_state)) {
        ASSERT_TRUE(checkpoint.erase(drop_state)) << drop_state;
      }
      io_->save(checkpoint, path);
    }
    const Weights resumed = fit({.max_epochs = max_epochs}, callbacks(), path, /*init_seed=*/99);
    EXPECT_EQ(last_result_.resumed_from, path);
    if (drop_state.empty()) {
      EXPECT_TRUE(bit_identical(resumed, straight));
    } else {
      EXPECT_FALSE(bit_identical(resumed, straight)) << "the control resumed exactly without " << drop_state;
    }
  }

 protected:
  std::shared_ptr<InMemoryCheckpointIO> io_ = std::make_shared<InMemoryCheckpointIO>();
  FitResult last_result_;
};

// 4 training batches an epoch (TinyModule's defaults), SGD at lr 0.1.
StochasticWeightAveragingOptions swa_options() {
  return {.swa_lrs = {0.05}, .swa_epoch_start = 2, .annealing_epochs = 2};
}

TEST_F(WeightAveragingTest, SwaEndsWithTheAverageOfTheWeightsEachEpochFromSwaEpochStartBeganWith) {
  auto recorder = std::make_shared<AveragingRecorder>();
  const Weights final = fit({.max_epochs = 4}, {recorder, std::make_shared<StochasticWeightAveraging>(swa_options())});
  ASSERT_EQ(recorder->at_epoch_start.size(), 4u);

  // Epochs 1, 2, 3 (0-based) are averaged: swa_epoch_start = 2 counts from 1, as Lightning's.
  Weights mean;
  Weights running;
  for (const auto& [name, first] : recorder->at_epoch_start[1]) {
    mean[name] = (first + recorder->at_epoch_start[2].at(name) + recorder->at_epoch_start[3].at(name)) / 3;
    torch::Tensor average = first.clone();
    for (int64_t n = 1; n < 3; ++n) {
      const torch::Tensor& current = recorder->at_epoch_start[1 + n].at(name);
      average = average + (current - average) / (n + 1);
    }
    running[name] = average;
  }
  EXPECT_TRUE(close(final, mean));
  EXPECT_TRUE(bit_identical(final, running));
  // Control: the weights trained on are not the average.
  EXPECT_FALSE(close(recorder->after_step.back(), mean));

  // SWALR(cos, 2 epochs) from 0.1 to 0.05, from the first averaged epoch.
  ASSERT_EQ(recorder->epoch_lrs.size(), 4u);
  EXPECT_DOUBLE_EQ(recorder->epoch_lrs[0], 0.1);
  EXPECT_DOUBLE_EQ(recorder->epoch_lrs[1], 0.1);
  EXPECT_NEAR(recorder->epoch_lrs[2], 0.075, 1e-12);
  EXPECT_NEAR(recorder->epoch_lrs[3], 0.05, 1e-12);
}

TEST_F(WeightAveragingTest, SwaRefusesALearningRateSchedulerWithAHint) {
  try {
    auto module = make_module({.scheduler = Interval::kEpoch});
    make_trainer({.max_epochs = 2, .callbacks = {std::make_shared<StochasticWeightAveraging>(swa_options())}})
        .fit(*module);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scheduler"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("HINT:"), std::string::npos) << e.what();
  }
}

TEST_F(WeightAveragingTest, SwaResumedInsideAnAveragedEpochIsBitIdentical) {
  const CallbackFactory swa = [] {
    return std::vector<std::shared_ptr<Callback>>{std::make_shared<StochasticWeightAveraging>(swa_options())};
  };
  // Step 6 is inside epoch 1 (averaged at its start, SWALR started); step 9 inside epoch 2 (SWALR stepped).
  expect_exact_resume(swa, 3, 6, "epoch=1-step=6.ckpt");
  expect_exact_resume(swa, 3, 9, "epoch=2-step=9.ckpt");
  // Step 4 ends epoch 0, before SWA begins.
  expect_exact_resume(swa, 3, 4, "epoch=0-step=4.ckpt");
}

TEST_F(WeightAveragingTest, SwaResumedBetweenAnnealingStepsContinuesTheLearningRates) {
  // Resumed inside epoch 2 with SWALR one real step in and two to go: the learning rates after the
  // resume depend on the saved step count, not only on the optimizer's current learning rate. (5
  // epochs: the weights the last epoch trains are not in the average, so its rate would not show.)
  const CallbackFactory swa = [] {
    return std::vector<std::shared_ptr<Callback>>{std::make_shared<StochasticWeightAveraging>(
        StochasticWeightAveragingOptions{.swa_lrs = {0.02}, .swa_epoch_start = 2, .annealing_epochs = 3})};
  };
  expect_exact_resume(swa, 5, 9, "epoch=2-step=9.ckpt");
}

TEST_F(WeightAveragingTest, ControlSwaResumedWithoutItsStateIsNotIdentical) {
  const CallbackFactory swa = [] {
    return std::vector<std::shared_ptr<Callback>>{std::make_shared<StochasticWeightAveraging>(swa_options())};
  };
  expect_exact_resume(swa, 3, 9, "epoch=2-step=9.ckpt", "StochasticWeightAveraging");
}

TEST_F(WeightAveragingTest, EmaEndsWithTheMovingAverageOfEveryStepAndValidatesWithIt) {
  constexpr double kDecay = 0.9;
  auto recorder = std::make_shared<AveragingRecorder>();
  const Weights final = fit(
      {.max_epochs = 2}, {recorder, std::make_shared<EMAWeightAveraging>(EMAWeightAveragingOptions{.decay = kDecay})});
  const std::vector<Weights>& steps = recorder->after_step;
  ASSERT_EQ(steps.size(), 8u);

  // The same recurrence as torch's get_ema_avg_fn (bit for bit), and its closed form (close).
  std::vector<Weights> ema(steps.size());
  for (size_t k = 0; k < steps.size(); ++k) {
    for (const auto& [name, current] : steps[k])
      ema[k][name] = k == 0 ? current.clone() : kDecay * ema[k - 1].at(name) + (1.0 - kDecay) * current;
  }
  Weights closed;
  for (const auto& [name, first] : steps[0]) {
    torch::Tensor sum = std::pow(kDecay, 7) * first.to(torch::kDouble);
    for (int k = 1; k < 8; ++k)
      sum = sum + (1 - kDecay) * std::pow(kDecay, 7 - k) * steps[k].at(name).to(torch::kDouble);
    closed[name] = sum.to(torch::kFloat);
  }
  EXPECT_TRUE(bit_identical(final, ema.back()));
  EXPECT_TRUE(close(final, closed, 1e-5));
  EXPECT_FALSE(close(steps.back(), closed, 1e-5)) << "control: the trained weights are not the average";

  // Each epoch's validation (2 batches) ran on the average of that epoch's steps; training went
  // on from the trained weights (or the steps after would not match a straight run's).
  ASSERT_EQ(recorder->validated_with.size(), 4u);
  EXPECT_TRUE(bit_identical(recorder->validated_with[0], ema[3]));
  EXPECT_TRUE(bit_identical(recorder->validated_with[3], ema[7]));
  const Weights plain = fit({.max_epochs = 2}, {});
  EXPECT_TRUE(bit_identical(plain, steps.back()));
}

TEST_F(WeightAveragingTest, EmaCheckpointsHoldTheAverageAsTheirWeights) {
  auto recorder = std::make_shared<AveragingRecorder>();
  fit({.max_epochs = 1}, {recorder, std::make_shared<EMAWeightAveraging>(EMAWeightAveragingOptions{.decay = 0.5})});
  const std::string path = path_ending_with(io_->paths(), "epoch=0-step=4.ckpt");
  Weights current;
  for (const auto& e : load_dict(*io_, path).at("current_model_state").toGenericDict())
    current[e.key().toStringRef()] = e.value().toTensor();
  // Lightning's layout: what was validated (and what load_weights or test(ckpt_path) read) is the average.
  EXPECT_TRUE(bit_identical(weights_in(*io_, path), recorder->validated_with.back()));
  EXPECT_TRUE(bit_identical(current, recorder->after_step.back()));
  EXPECT_FALSE(bit_identical(current, recorder->validated_with.back())) << "control: the two differ";
}

TEST_F(WeightAveragingTest, EmaWithoutValidationSwapValidatesTheTrainedWeights) {
  auto recorder = std::make_shared<AveragingRecorder>();
  fit({.max_epochs = 1}, {recorder, std::make_shared<EMAWeightAveraging>(
                                        EMAWeightAveragingOptions{.decay = 0.5, .use_average_for_validation = false})});
  ASSERT_EQ(recorder->validated_with.size(), 2u);
  EXPECT_TRUE(bit_identical(recorder->validated_with[0], recorder->after_step.back()));
}

TEST_F(WeightAveragingTest, EmaResumedInsideAnEpochIsBitIdentical) {
  const CallbackFactory ema = [] {
    return std::vector<std::shared_ptr<Callback>>{
        std::make_shared<EMAWeightAveraging>(EMAWeightAveragingOptions{.decay = 0.9})};
  };
  expect_exact_resume(ema, 2, 3, "epoch=0-step=3.ckpt");
  expect_exact_resume(ema, 2, 6, "epoch=1-step=6.ckpt");
  const CallbackFactory sparse = [] {
    return std::vector<std::shared_ptr<Callback>>{std::make_shared<EMAWeightAveraging>(
        EMAWeightAveragingOptions{.decay = 0.8, .update_every_n_steps = 2, .update_starting_at_step = 2})};
  };
  expect_exact_resume(sparse, 2, 5, "epoch=1-step=5.ckpt");
}

TEST_F(WeightAveragingTest, ControlEmaResumedWithoutItsStateIsNotIdentical) {
  const CallbackFactory ema = [] {
    return std::vector<std::shared_ptr<Callback>>{
        std::make_shared<EMAWeightAveraging>(EMAWeightAveragingOptions{.decay = 0.9})};
  };
  // The trained weights: the resumed run would train on from the average.
  expect_exact_resume(ema, 2, 6, "epoch=1-step=6.ckpt", "current_model_state");
}

}  // namespace
}  // namespace volt
