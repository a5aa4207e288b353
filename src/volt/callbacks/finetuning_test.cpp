#include "volt/callbacks/finetuning.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "volt/callbacks/testing_services.h"
#include "volt/core/error.h"
#include "volt/module/lightning_module.h"

namespace volt {
namespace {

/// A backbone (Linear + BatchNorm) under a head, as a fine-tune has them.
class Net : public LightningModule {
 public:
  Net() : LightningModule("Net") {
    backbone = register_module("backbone", torch::nn::Sequential(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4)));
    head = register_module("head", torch::nn::Linear(4, 1));
  }
  torch::Tensor training_step(const Batch&, int64_t) override { return {}; }
  OptimizerConfig configure_optimizers() override { return {}; }
  torch::nn::Sequential backbone{nullptr};
  torch::nn::Linear head{nullptr};
};

/// The names of `module`'s parameters with requires_grad, in order.
std::vector<std::string> trainable(LightningModule& module) {
  std::vector<std::string> names;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (item.value().requires_grad()) names.push_back(item.key());
  }
  return names;
}

/// SGD over the trainable parameters only, as a fine-tune's configure_optimizers builds it.
std::shared_ptr<torch::optim::Optimizer> trainable_sgd(LightningModule& module, double lr) {
  std::vector<torch::Tensor> params;
  for (const auto& p : module.parameters()) {
    if (p.requires_grad()) params.push_back(p);
  }
  return std::make_shared<torch::optim::SGD>(params, torch::optim::SGDOptions(lr).momentum(0.9));
}

double group_lr(const torch::optim::Optimizer& optimizer, size_t group) {
  return optimizer.param_groups()[group].options().get_lr();
}

/// A module, the callback's view of it and its one optimizer (built after the freeze).
struct FinetuningRig {
  explicit FinetuningRig(BaseFinetuning& finetuning, double lr = 0.1) {
    finetuning.on_before_configure_optimizers(net);
    optimizers.push_back(trainable_sgd(net, lr));
    context.module = &net;
    context.optimizers = &optimizers;
  }
  /// Runs the callback's epoch-start hook for `epoch`.
  void start_epoch(Callback& callback, int64_t epoch) {
    context.epoch = epoch;
    callback.on_train_epoch_start(context, services);
  }
  torch::optim::Optimizer& optimizer() { return *optimizers.front(); }
  Net net;
  std::vector<std::shared_ptr<torch::optim::Optimizer>> optimizers;
  CallbackContext context;
  testing::RecordingServices services;
};

TEST(BaseFinetuning, FreezeLeavesBatchNormTrainingOnlyWithTrainBn) {
  Net net;
  BaseFinetuning::freeze(*net.backbone, /*train_bn=*/true);
  EXPECT_EQ(trainable(net),
            (std::vector<std::string>{"backbone.1.weight", "backbone.1.bias", "head.weight", "head.bias"}));
  BaseFinetuning::freeze(*net.backbone, /*train_bn=*/false);
  EXPECT_EQ(trainable(net), (std::vector<std::string>{"head.weight", "head.bias"}));
  BaseFinetuning::make_trainable(*net.backbone);
  EXPECT_EQ(trainable(net).size(), 6u);
}

TEST(BaseFinetuning, UnfreezeAddsOnlyParametersTheOptimizerLacksAtTheGivenOrDividedRate) {
  Net net;
  BaseFinetuning::freeze(*net.backbone, /*train_bn=*/true);
  auto sgd = trainable_sgd(net, 0.1);  // holds the BatchNorm's two parameters already
  const ParamGroupChange change = BaseFinetuning::unfreeze_and_add_param_group(*net.backbone, *sgd);
  EXPECT_EQ(change.added, 2u);                 // the Linear's weight and bias
  EXPECT_EQ(change.already_in_optimizer, 0u);  // the BatchNorm trained all along: expected there
  ASSERT_EQ(sgd->param_groups().size(), 2u);
  EXPECT_DOUBLE_EQ(group_lr(*sgd, 1), 0.1 / 10.0);
  EXPECT_TRUE(sgd->param_groups()[1].params()[0].is_same(net.backbone[0]->named_parameters()["weight"]));
  // The new group takes the optimizer's defaults for its other options, as in Lightning.
  EXPECT_DOUBLE_EQ(static_cast<torch::optim::SGDOptions&>(sgd->param_groups()[1].options()).momentum(), 0.9);
  EXPECT_EQ(trainable(net).size(), 6u);

  // Everything is in the optimizer now: nothing more to add.
  const ParamGroupChange again = BaseFinetuning::unfreeze_and_add_param_group(*net.backbone, *sgd, 0.5);
  EXPECT_EQ(again.added, 0u);
  EXPECT_EQ(again.already_in_optimizer, 0u);
  EXPECT_EQ(sgd->param_groups().size(), 2u);
}

TEST(BaseFinetuning, FrozenParametersAnOptimizerOverEverythingHeldAreCountedNotAdded) {
  Net net;
  BaseFinetuning::freeze(*net.backbone, /*train_bn=*/true);
  auto sgd = std::make_shared<torch::optim::SGD>(net.parameters(), torch::optim::SGDOptions(0.1));
  const ParamGroupChange change = BaseFinetuning::unfreeze_and_add_param_group(*net.backbone, *sgd);
  EXPECT_EQ(change.added, 0u);
  EXPECT_EQ(change.already_in_optimizer, 2u);  // the Linear's, frozen until now
  EXPECT_EQ(sgd->param_groups().size(), 1u);
  EXPECT_EQ(trainable(net).size(), 6u);
}

TEST(BaseFinetuning, UnfreezeWithoutTrainBnKeepsBatchNormFrozenAndOutOfTheGroup) {
  Net net;
  BaseFinetuning::freeze(*net.backbone, /*train_bn=*/false);
  auto sgd = trainable_sgd(net, 0.1);
  const ParamGroupChange change =
      BaseFinetuning::unfreeze_and_add_param_group(*net.backbone, *sgd, 0.02, 10.0, /*train_bn=*/false);
  EXPECT_EQ(change.added, 2u);
  EXPECT_DOUBLE_EQ(group_lr(*sgd, 1), 0.02);
  EXPECT_EQ(trainable(net),
            (std::vector<std::string>{"backbone.0.weight", "backbone.0.bias", "head.weight", "head.bias"}));
}

TEST(BackboneFinetuning, FreezesTheBackboneThenUnfreezesItAtItsEpochWithARisingAlignedRate) {
  BackboneFinetuning finetuning({.unfreeze_backbone_at_epoch = 2});
  FinetuningRig rig(finetuning);
  EXPECT_EQ(trainable(rig.net).size(), 4u);  // head + BatchNorm (train_bn)
  EXPECT_EQ(rig.optimizer().param_groups().size(), 1u);
  std::vector<double> backbone_lrs;
  for (int64_t epoch = 0; epoch < 7; ++epoch) {
    rig.start_epoch(finetuning, epoch);
    EXPECT_EQ(rig.optimizer().param_groups().size(), epoch < 2 ? 1u : 2u) << epoch;
    if (epoch >= 2) backbone_lrs.push_back(group_lr(rig.optimizer(), 1));
  }
  EXPECT_EQ(trainable(rig.net).size(), 6u);
  // 0.1 * 0.1 at the unfreeze, then doubled each epoch until it would pass the head's 0.1.
  ASSERT_EQ(backbone_lrs.size(), 5u);
  EXPECT_NEAR(backbone_lrs[0], 0.01, 1e-15);
  EXPECT_NEAR(backbone_lrs[1], 0.02, 1e-15);
  EXPECT_NEAR(backbone_lrs[2], 0.04, 1e-15);
  EXPECT_NEAR(backbone_lrs[3], 0.08, 1e-15);
  EXPECT_NEAR(backbone_lrs[4], 0.1, 1e-15);
  EXPECT_DOUBLE_EQ(group_lr(rig.optimizer(), 0), 0.1);
}

TEST(BackboneFinetuning, TakesAnInitialRateALambdaAndMayPassTheHeadWithoutAlignment) {
  BackboneFinetuning finetuning({.unfreeze_backbone_at_epoch = 0,
                                 .lambda_func = [](int64_t epoch) { return static_cast<double>(epoch); },
                                 .backbone_initial_lr = 0.05,
                                 .should_align = false});
  FinetuningRig rig(finetuning);
  rig.start_epoch(finetuning, 0);
  EXPECT_DOUBLE_EQ(group_lr(rig.optimizer(), 1), 0.05);
  rig.start_epoch(finetuning, 1);
  EXPECT_DOUBLE_EQ(group_lr(rig.optimizer(), 1), 0.1);  // lambda(2) * 0.05
  rig.start_epoch(finetuning, 2);
  EXPECT_NEAR(group_lr(rig.optimizer(), 1), 0.3, 1e-15);  // lambda(3) * 0.1, above the head's 0.1
  EXPECT_EQ(finetuning.previous_backbone_lr(), group_lr(rig.optimizer(), 1));
}

TEST(BackboneFinetuning, AnEpochAlreadyFinetunedIsNotFinetunedAgain) {
  // A resume inside an epoch starts it again: its rate must not be multiplied twice.
  BackboneFinetuning finetuning({.unfreeze_backbone_at_epoch = 0});
  FinetuningRig rig(finetuning);
  rig.start_epoch(finetuning, 0);
  rig.start_epoch(finetuning, 1);
  const double lr = group_lr(rig.optimizer(), 1);
  rig.start_epoch(finetuning, 1);
  EXPECT_EQ(group_lr(rig.optimizer(), 1), lr);
  EXPECT_EQ(rig.optimizer().param_groups().size(), 2u);
}

TEST(BackboneFinetuning, ItsStateRebuildsTheBackbonesGroupInAFreshModuleAndOptimizer) {
  BackboneFinetuning finetuning({.unfreeze_backbone_at_epoch = 1});
  FinetuningRig rig(finetuning);
  for (int64_t epoch = 0; epoch < 3; ++epoch) rig.start_epoch(finetuning, epoch);
  const StateDict state = finetuning.state_dict();

  BackboneFinetuning resumed({.unfreeze_backbone_at_epoch = 1});
  FinetuningRig fresh(resumed);  // frozen again, one group
  resumed.load_state_dict(state);
  resumed.restore_optimizer_layout(fresh.net, fresh.optimizers);
  ASSERT_EQ(fresh.optimizer().param_groups().size(), 2u);
  EXPECT_EQ(group_lr(fresh.optimizer(), 1), group_lr(rig.optimizer(), 1));
  EXPECT_TRUE(
      fresh.optimizer().param_groups()[1].params()[0].is_same(fresh.net.backbone[0]->named_parameters()["weight"]));
  EXPECT_EQ(trainable(fresh.net), trainable(rig.net));
  EXPECT_EQ(resumed.previous_backbone_lr(), finetuning.previous_backbone_lr());
  // The next epoch goes on from the saved rate.
  rig.start_epoch(finetuning, 3);
  fresh.start_epoch(resumed, 3);
  EXPECT_EQ(group_lr(fresh.optimizer(), 1), group_lr(rig.optimizer(), 1));

  // A rebuild happens once, for the restore it was loaded for.
  resumed.restore_optimizer_layout(fresh.net, fresh.optimizers);
  EXPECT_EQ(fresh.optimizer().param_groups().size(), 2u);
}

TEST(BackboneFinetuning, AStateForAnotherOptimizerSetupIsRefusedWithAHint) {
  BackboneFinetuning finetuning({.unfreeze_backbone_at_epoch = 0});
  FinetuningRig rig(finetuning);
  rig.start_epoch(finetuning, 0);
  BackboneFinetuning resumed({.unfreeze_backbone_at_epoch = 0});
  FinetuningRig fresh(resumed);
  fresh.optimizers.push_back(trainable_sgd(fresh.net, 0.1));
  resumed.load_state_dict(finetuning.state_dict());
  try {
    resumed.restore_optimizer_layout(fresh.net, fresh.optimizers);
    FAIL() << "two optimizers were accepted for a state of one";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("HINT:"), std::string::npos) << e.what();
  }
}

TEST(BackboneFinetuning, AModuleWithoutABackboneIsRefusedNamingItsChildren) {
  BackboneFinetuning finetuning({.backbone = "encoder"});
  Net net;
  try {
    finetuning.on_before_configure_optimizers(net);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'encoder'"), std::string::npos) << what;
    EXPECT_NE(what.find("'backbone', 'head'"), std::string::npos) << what;
    EXPECT_NE(what.find("HINT:"), std::string::npos) << what;
  }
  // A dotted path reaches a grandchild.
  BackboneFinetuning deeper({.backbone = "backbone.0"});
  deeper.on_before_configure_optimizers(net);
  EXPECT_EQ(trainable(net).size(), 4u);
}

TEST(BackboneFinetuning, RefusesOptionsOutOfRange) {
  EXPECT_THROW(BackboneFinetuning({.unfreeze_backbone_at_epoch = -1}), Error);
  EXPECT_THROW(BackboneFinetuning({.backbone_initial_ratio_lr = 0}), Error);
  EXPECT_THROW(BackboneFinetuning({.backbone_initial_lr = -0.1}), Error);
  EXPECT_THROW(BackboneFinetuning({.initial_denom_lr = 0}), Error);
  EXPECT_THROW(BackboneFinetuning({.backbone = ""}), Error);
}

}  // namespace
}  // namespace volt
