#include "volt/callbacks/weight_averaging.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "volt/callbacks/testing_services.h"
#include "volt/core/error.h"
#include "volt/module/lightning_module.h"

namespace volt {
namespace {

/// One Linear layer (optionally a BatchNorm) whose weights the tests set by hand.
class Holder : public LightningModule {
 public:
  explicit Holder(bool batch_norm = false) : LightningModule("Holder") {
    linear = register_module("linear", torch::nn::Linear(2, 1));
    if (batch_norm) register_module("bn", torch::nn::BatchNorm1d(1));
  }
  torch::Tensor training_step(const Batch&, int64_t) override { return {}; }
  OptimizerConfig configure_optimizers() override { return {}; }
  /// Sets every parameter to `value`.
  void fill(double value) {
    torch::NoGradGuard no_grad;
    for (auto& p : parameters()) p.fill_(value);
  }
  torch::nn::Linear linear{nullptr};
};

/// A module, its one SGD optimizer, and a context pointing at both.
struct AveragingRig {
  explicit AveragingRig(bool batch_norm = false, double lr = 1.0) : module(batch_norm) {
    optimizers.push_back(std::make_shared<torch::optim::SGD>(module.parameters(), torch::optim::SGDOptions(lr)));
    context.module = &module;
    context.optimizers = &optimizers;
  }
  double lr() const { return optimizers.front()->param_groups().front().options().get_lr(); }
  Holder module;
  std::vector<std::shared_ptr<torch::optim::Optimizer>> optimizers;
  CallbackContext context;
  testing::RecordingServices services;
};

double weight_of(Holder& module) { return module.linear->weight[0][0].item<double>(); }

/// Runs `swa`'s epoch starts for `epochs` epochs, the weights being epoch + 1 during epoch `epoch`'s
/// start (so the average of epochs a..b is known), then the end of training.
void run_swa(StochasticWeightAveraging& swa, AveragingRig& rig, int64_t epochs, std::vector<double>* lrs = nullptr) {
  swa.on_fit_start(rig.context, rig.services);
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    rig.context.epoch = epoch;
    rig.module.fill(static_cast<double>(epoch + 1));
    swa.on_train_epoch_start(rig.context, rig.services);
    if (lrs != nullptr) lrs->push_back(rig.lr());
  }
  rig.context.epoch = epochs;
  swa.on_train_end(rig.context, rig.services);
}

TEST(StochasticWeightAveraging, AveragesTheWeightsEachEpochStartsWithFromSwaEpochStart) {
  AveragingRig rig;
  StochasticWeightAveraging swa({.swa_lrs = {0.5}, .swa_epoch_start = 3});
  swa.setup({.max_epochs = 5});
  run_swa(swa, rig, 5);
  // 0-based epochs 2, 3, 4 start with weights 3, 4, 5 (Lightning's points).
  EXPECT_EQ(swa.swa_start(), 2);
  EXPECT_EQ(swa.n_averaged(), 3);
  EXPECT_DOUBLE_EQ(weight_of(rig.module), 4.0);
}

TEST(StochasticWeightAveraging, AFractionStartsAtThatPartOfMaxEpochs) {
  AveragingRig rig;
  StochasticWeightAveraging swa({.swa_lrs = {0.5}, .swa_epoch_start = 0.5});
  swa.setup({.max_epochs = 6});
  run_swa(swa, rig, 6);
  EXPECT_EQ(swa.swa_start(), 2);                 // int(6 * 0.5) = 3, 1-based
  EXPECT_DOUBLE_EQ(weight_of(rig.module), 4.5);  // mean of 3..6
}

TEST(StochasticWeightAveraging, AStoppedRunKeepsItsOwnWeights) {
  AveragingRig rig;
  StochasticWeightAveraging swa({.swa_lrs = {0.5}, .swa_epoch_start = 1});
  swa.setup({.max_epochs = 5});
  swa.on_fit_start(rig.context, rig.services);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    rig.context.epoch = epoch;
    rig.module.fill(static_cast<double>(epoch + 1));
    swa.on_train_epoch_start(rig.context, rig.services);
  }
  rig.context.epoch = 3;  // stopped before max_epochs
  swa.on_train_end(rig.context, rig.services);
  EXPECT_DOUBLE_EQ(weight_of(rig.module), 3.0);
}

TEST(StochasticWeightAveraging, LearningRatesFollowTorchsSwalr) {
  // SWALR(cos, anneal_epochs=2) from lr 1 to 0.2: epochs start at 1, then alpha = 0.5, then 1.
  AveragingRig rig(false, 1.0);
  std::vector<double> lrs;
  StochasticWeightAveraging swa({.swa_lrs = {0.2}, .swa_epoch_start = 1, .annealing_epochs = 2});
  swa.setup({.max_epochs = 4});
  run_swa(swa, rig, 4, &lrs);
  ASSERT_EQ(lrs.size(), 4u);
  EXPECT_DOUBLE_EQ(lrs[0], 1.0);
  EXPECT_NEAR(lrs[1], 0.2 * 0.5 + 1.0 * 0.5, 1e-12);
  EXPECT_NEAR(lrs[2], 0.2, 1e-12);
  EXPECT_NEAR(lrs[3], 0.2, 1e-12);

  AveragingRig linear(false, 1.0);
  lrs.clear();
  StochasticWeightAveraging lin(
      {.swa_lrs = {0.2}, .swa_epoch_start = 1, .annealing_epochs = 4, .annealing_strategy = "linear"});
  lin.setup({.max_epochs = 3});
  run_swa(lin, linear, 3, &lrs);
  EXPECT_NEAR(lrs[1], 0.25 * 0.2 + 0.75 * 1.0, 1e-12);
  EXPECT_NEAR(lrs[2], 0.5 * 0.2 + 0.5 * 1.0, 1e-12);

  AveragingRig at_once(false, 1.0);
  lrs.clear();
  StochasticWeightAveraging zero({.swa_lrs = {0.2}, .swa_epoch_start = 1, .annealing_epochs = 0});
  zero.setup({.max_epochs = 2});
  run_swa(zero, at_once, 2, &lrs);
  EXPECT_DOUBLE_EQ(lrs[0], 0.2);
}

TEST(StochasticWeightAveraging, AResumedEpochStartNeitherAveragesNorStepsAgain) {
  AveragingRig rig(false, 1.0);
  StochasticWeightAveraging swa({.swa_lrs = {0.2}, .swa_epoch_start = 1, .annealing_epochs = 4});
  swa.setup({.max_epochs = 4});
  swa.on_fit_start(rig.context, rig.services);
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    rig.context.epoch = epoch;
    rig.module.fill(static_cast<double>(epoch + 1));
    swa.on_train_epoch_start(rig.context, rig.services);
  }
  const double lr = rig.lr();
  StochasticWeightAveraging resumed({.swa_lrs = {0.2}, .swa_epoch_start = 1, .annealing_epochs = 4});
  resumed.setup({.max_epochs = 4});
  resumed.load_state_dict(swa.state_dict());
  resumed.on_fit_start(rig.context, rig.services);
  rig.module.fill(100.0);  // moved inside epoch 1: a second average at its start would show
  resumed.on_train_epoch_start(rig.context, rig.services);
  EXPECT_EQ(resumed.n_averaged(), 2);
  EXPECT_EQ(rig.lr(), lr);
  EXPECT_TRUE(torch::equal(resumed.average().at("linear.weight"), swa.average().at("linear.weight")));
}

TEST(StochasticWeightAveraging, ACustomAvgFnIsUsed) {
  AveragingRig rig;
  StochasticWeightAveraging swa({.swa_lrs = {0.5},
                                 .swa_epoch_start = 1,
                                 .avg_fn = [](const torch::Tensor& averaged, const torch::Tensor& current, int64_t) {
                                   return torch::max(averaged, current);
                                 }});
  swa.setup({.max_epochs = 3});
  run_swa(swa, rig, 3);
  EXPECT_DOUBLE_EQ(weight_of(rig.module), 3.0);
}

TEST(StochasticWeightAveraging, RefusesWhatItCannotHandle) {
  const auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { StochasticWeightAveraging({.swa_lrs = {}}); }).find("HINT"), std::string::npos);
  EXPECT_NE(message([] { StochasticWeightAveraging({.swa_lrs = {-1.0}}); }).find("> 0"), std::string::npos);
  EXPECT_NE(message([] { StochasticWeightAveraging({.swa_lrs = {0.1}, .swa_epoch_start = 0}); }).find("1-based"),
            std::string::npos);
  EXPECT_NE(message([] { StochasticWeightAveraging({.swa_lrs = {0.1}, .swa_epoch_start = 1.5}); }).find("fraction"),
            std::string::npos);
  EXPECT_NE(
      message([] { StochasticWeightAveraging({.swa_lrs = {0.1}, .annealing_strategy = "step"}); }).find("\"cos\""),
      std::string::npos);

  const auto fit_start = [&message](FitInfo info, bool batch_norm, size_t optimizers, size_t lrs) {
    AveragingRig rig(batch_norm);
    while (rig.optimizers.size() < optimizers) rig.optimizers.push_back(rig.optimizers.front());
    StochasticWeightAveraging swa({.swa_lrs = std::vector<double>(lrs, 0.1)});
    swa.setup(info);
    return message([&] { swa.on_fit_start(rig.context, rig.services); });
  };
  EXPECT_EQ(fit_start({.max_epochs = 3}, false, 1, 1), "no error");
  EXPECT_NE(fit_start({}, false, 1, 1).find("max_epochs"), std::string::npos);
  EXPECT_NE(fit_start({.max_epochs = 3}, false, 2, 1).find("1 optimizer"), std::string::npos);
  EXPECT_NE(fit_start({.max_epochs = 3, .num_lr_schedulers = 1}, false, 1, 1).find("scheduler"), std::string::npos);
  const std::string bn = fit_start({.max_epochs = 3}, true, 1, 1);
  EXPECT_NE(bn.find("BatchNorm"), std::string::npos) << bn;
  EXPECT_NE(bn.find("HINT:"), std::string::npos) << bn;
  EXPECT_NE(fit_start({.max_epochs = 3}, false, 1, 2).find("param groups"), std::string::npos);
}

TEST(EMAWeightAveraging, ShouldUpdateFollowsLightning) {
  EMAWeightAveraging every;
  EXPECT_TRUE(every.should_update(0, std::nullopt));
  EXPECT_FALSE(every.should_update(std::nullopt, 0));
  EMAWeightAveraging some({.update_every_n_steps = 3, .update_starting_at_step = 4});
  EXPECT_FALSE(some.should_update(3, std::nullopt));
  EXPECT_FALSE(some.should_update(4, std::nullopt));
  EXPECT_TRUE(some.should_update(6, std::nullopt));
  EMAWeightAveraging epochs({.update_every_n_steps = 0, .update_starting_at_epoch = 1});
  EXPECT_FALSE(epochs.should_update(0, std::nullopt));
  EXPECT_FALSE(epochs.should_update(std::nullopt, 0));
  EXPECT_TRUE(epochs.should_update(std::nullopt, 1));
  EXPECT_THROW(EMAWeightAveraging({.decay = 1.5}), Error);
}

TEST(EMAWeightAveraging, MovesTowardTheWeightsOncePerStepAndSwapsForValidation) {
  AveragingRig rig;
  rig.module.fill(0.0);
  EMAWeightAveraging ema({.decay = 0.5});
  ema.setup({});
  ema.on_fit_start(rig.context, rig.services);
  double expected = 0.0;
  for (int64_t step = 1; step <= 3; ++step) {
    rig.module.fill(static_cast<double>(step * 4));
    rig.context.global_step = step;
    ema.on_train_batch_end(rig.context, rig.services);
    ema.on_train_batch_end(rig.context, rig.services);  // same step (accumulation): no second update
    expected = step == 1 ? 4.0 : 0.5 * expected + 0.5 * step * 4;
  }
  EXPECT_EQ(ema.n_averaged(), 3);
  ema.on_validation_epoch_start(rig.context, rig.services);
  EXPECT_DOUBLE_EQ(weight_of(rig.module), expected);
  ema.on_validation_epoch_end(rig.context, rig.services);
  EXPECT_DOUBLE_EQ(weight_of(rig.module), 12.0);
  ema.on_train_end(rig.context, rig.services);
  EXPECT_DOUBLE_EQ(weight_of(rig.module), expected);
}

TEST(EMAWeightAveraging, CheckpointsHoldTheAverageAsWeightsAndResumeIt) {
  AveragingRig rig;
  EMAWeightAveraging ema({.decay = 0.9});
  ema.setup({});
  ema.on_fit_start(rig.context, rig.services);
  rig.module.fill(1.0);
  rig.context.global_step = 1;
  ema.on_train_batch_end(rig.context, rig.services);
  rig.module.fill(3.0);  // trained on, not averaged yet

  // Lightning's layout: the average is the checkpoint's weights, the trained ones beside them.
  StateDict checkpoint = make_state_dict();
  StateDict weights = make_state_dict();
  for (const auto& item : rig.module.named_parameters()) weights.insert(item.key(), item.value().detach().clone());
  checkpoint.insert("state_dict", weights);
  ema.on_save_checkpoint(rig.context, checkpoint);
  const auto tensor_at = [&checkpoint](const char* key) {
    return checkpoint.at(key).toGenericDict().at("linear.weight").toTensor()[0][0].item<double>();
  };
  EXPECT_DOUBLE_EQ(tensor_at("state_dict"), 1.0);
  EXPECT_DOUBLE_EQ(tensor_at("current_model_state"), 3.0);

  // Saved during a validation pass, with the average swapped into the module: the same layout.
  ema.on_validation_epoch_start(rig.context, rig.services);
  StateDict during = make_state_dict();
  StateDict swapped_weights = make_state_dict();
  for (const auto& item : rig.module.named_parameters())
    swapped_weights.insert(item.key(), item.value().detach().clone());
  during.insert("state_dict", swapped_weights);
  ema.on_save_checkpoint(rig.context, during);
  ema.on_validation_epoch_end(rig.context, rig.services);
  EXPECT_DOUBLE_EQ(during.at("state_dict").toGenericDict().at("linear.weight").toTensor()[0][0].item<double>(), 1.0);
  EXPECT_DOUBLE_EQ(during.at("current_model_state").toGenericDict().at("linear.weight").toTensor()[0][0].item<double>(),
                   3.0);
  EXPECT_DOUBLE_EQ(weight_of(rig.module), 3.0);

  // A resume: the Trainer loads "state_dict" into the module, then the callback's state and hook.
  AveragingRig other;
  {
    torch::NoGradGuard no_grad;
    for (auto& item : other.module.named_parameters())
      item.value().copy_(checkpoint.at("state_dict").toGenericDict().at(item.key()).toTensor());
  }
  EMAWeightAveraging resumed({.decay = 0.9});
  resumed.setup({});
  resumed.load_state_dict(ema.state_dict());
  resumed.on_load_checkpoint(other.context, checkpoint);
  EXPECT_DOUBLE_EQ(weight_of(other.module), 3.0);
  resumed.on_fit_start(other.context, other.services);  // keeps the loaded average
  other.context.global_step = 1;
  resumed.on_train_batch_end(other.context, other.services);  // step 1 was averaged already
  EXPECT_EQ(resumed.n_averaged(), 1);
  other.module.fill(7.0);
  other.context.global_step = 2;
  resumed.on_train_batch_end(other.context, other.services);
  EXPECT_NEAR(resumed.average().at("linear.weight")[0][0].item<double>(), 0.9 * 1.0 + 0.1 * 7.0, 1e-6);
}

}  // namespace
}  // namespace volt
