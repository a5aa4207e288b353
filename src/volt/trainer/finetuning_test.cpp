// BackboneFinetuning in real fits: the backbone stays put until its epoch and then trains at its
// own rising learning rate, and a run stopped before or after the unfreeze (inside an epoch too)
// and resumed ends bit-identical to one that never stopped.
#include "volt/callbacks/finetuning.h"

#include <gtest/gtest.h>

#include "volt/trainer/trainer_testing.h"

namespace volt {
namespace {

using namespace volt::trainer_testing;  // NOLINT: the shared fixture and helpers
using Weights = std::map<std::string, torch::Tensor>;

/// A pretrained-style backbone (Linear + BatchNorm + ReLU) under a Linear head; SGD with momentum
/// over the trainable parameters only, so the optimizer's state matters on resume.
class FinetuneModule : public LightningModule {
 public:
  FinetuneModule() : LightningModule("FinetuneModule") {
    backbone_ = register_module(
        "backbone", torch::nn::Sequential(torch::nn::Linear(4, 6), torch::nn::BatchNorm1d(6), torch::nn::ReLU()));
    head_ = register_module("head", torch::nn::Linear(6, 1));
    data_ = make_dataset(16, 1, 1);
  }
  torch::Tensor training_step(const Batch& batch, int64_t) override {
    torch::Tensor loss = torch::mse_loss(head_->forward(backbone_->forward(batch.data)), batch.target);
    log("train/loss", loss);
    return loss;
  }
  OptimizerConfig configure_optimizers() override {
    std::vector<torch::Tensor> trainable;
    for (const auto& p : parameters()) {
      if (p.requires_grad()) trainable.push_back(p);
    }
    OptimizerConfig config;
    config.optimizers.push_back(
        std::make_shared<torch::optim::SGD>(trainable, torch::optim::SGDOptions(0.1).momentum(0.9)));
    return config;
  }
  DataLoader train_dataloader() override { return DataLoader(data_, {.batch_size = 4, .shuffle = true}); }

 private:
  torch::nn::Sequential backbone_{nullptr};
  torch::nn::Linear head_{nullptr};
  std::shared_ptr<TensorDataset> data_;
};

/// The module's weights at each epoch start and the optimizer's learning rates in each epoch.
class FinetuningRecorder : public Callback {
 public:
  std::string state_key() const override { return "FinetuningRecorder"; }
  Decision on_train_batch_start(const CallbackContext& context, CallbackServices&) override {
    if (context.batch_idx != 0) return {};
    at_epoch_start.push_back(parameters_of(*context.module));
    std::vector<double> lrs;
    for (const auto& group : context.optimizers->front()->param_groups()) lrs.push_back(group.options().get_lr());
    epoch_lrs.push_back(lrs);
    return {};
  }
  std::vector<Weights> at_epoch_start;
  std::vector<std::vector<double>> epoch_lrs;
};

bool same(const Weights& a, const Weights& b, const std::string& prefix) {
  for (const auto& [name, tensor] : a) {
    if (name.rfind(prefix, 0) == 0 && !torch::equal(tensor, b.at(name))) return false;
  }
  return true;
}

BackboneFinetuningOptions unfreeze_at(int64_t epoch) { return {.unfreeze_backbone_at_epoch = epoch}; }

class FinetuningTest : public TrainerTest {
 public:
  /// Fits a fresh module (weights from `init_seed`) and returns its final weights.
  Weights fit(TrainerOptions options, std::vector<std::shared_ptr<Callback>> callbacks,
              const std::string& ckpt_path = "", uint64_t init_seed = 7) {
    torch::manual_seed(init_seed);
    FinetuneModule module;
    options.seed = 1;
    options.callbacks = std::move(callbacks);
    Trainer trainer = make_trainer(std::move(options));
    trainer.set_checkpoint_io(io_);
    last_result_ = trainer.fit(module, {}, {}, ckpt_path);
    return parameters_of(module);
  }

  /// Trains `max_epochs` straight, and again stopped at `stop_step` and resumed from that step's
  /// checkpoint in a module with other initial weights: expects the same final weights bit for bit.
  void expect_exact_resume(int64_t unfreeze, int64_t max_epochs, int64_t stop_step, const std::string& suffix) {
    io_ = std::make_shared<InMemoryCheckpointIO>();
    const auto callbacks = [&] {
      return std::vector<std::shared_ptr<Callback>>{std::make_shared<BackboneFinetuning>(unfreeze_at(unfreeze))};
    };
    const Weights straight = fit({.max_epochs = max_epochs, .enable_checkpointing = false}, callbacks());
    std::vector<std::shared_ptr<Callback>> stopping = callbacks();
    stopping.push_back(
        std::make_shared<ModelCheckpoint>(ModelCheckpointOptions{.save_top_k = -1, .every_n_train_steps = stop_step}));
    fit({.max_epochs = max_epochs, .max_steps = stop_step}, stopping);
    const std::string path = path_ending_with(io_->paths(), suffix);
    const Weights resumed = fit({.max_epochs = max_epochs}, callbacks(), path, /*init_seed=*/99);
    EXPECT_EQ(last_result_.resumed_from, path);
    EXPECT_TRUE(bit_identical(resumed, straight)) << "stopped at step " << stop_step;
  }

 protected:
  std::shared_ptr<InMemoryCheckpointIO> io_ = std::make_shared<InMemoryCheckpointIO>();
  FitResult last_result_;
};

TEST_F(FinetuningTest, TheBackboneStaysPutUntilItsEpochThenTrainsAtItsOwnRisingRate) {
  auto recorder = std::make_shared<FinetuningRecorder>();
  const Weights final =
      fit({.max_epochs = 4}, {recorder, std::make_shared<BackboneFinetuning>(unfreeze_at(2))}, "", /*init_seed=*/7);
  ASSERT_EQ(recorder->at_epoch_start.size(), 4u);
  // Epochs 0 and 1 train the head and the BatchNorm (train_bn), not the backbone's Linear.
  EXPECT_TRUE(same(recorder->at_epoch_start[0], recorder->at_epoch_start[2], "backbone.0."));
  EXPECT_FALSE(same(recorder->at_epoch_start[0], recorder->at_epoch_start[2], "head."));
  EXPECT_FALSE(same(recorder->at_epoch_start[0], recorder->at_epoch_start[2], "backbone.1."));
  // From epoch 2 it trains.
  EXPECT_FALSE(same(recorder->at_epoch_start[2], recorder->at_epoch_start[3], "backbone.0."));
  EXPECT_FALSE(same(recorder->at_epoch_start[3], final, "backbone.0."));
  // Its group: a tenth of the head's 0.1 at the unfreeze, doubled the epoch after.
  EXPECT_EQ(recorder->epoch_lrs[1].size(), 1u);
  ASSERT_EQ(recorder->epoch_lrs[2].size(), 2u);
  EXPECT_NEAR(recorder->epoch_lrs[2][1], 0.01, 1e-15);
  EXPECT_NEAR(recorder->epoch_lrs[3][1], 0.02, 1e-15);
  EXPECT_DOUBLE_EQ(recorder->epoch_lrs[3][0], 0.1);
}

TEST_F(FinetuningTest, AResumeBeforeAtOrAfterTheUnfreezeIsBitIdentical) {
  // 4 batches an epoch; the backbone unfreezes at epoch 1 (step 4).
  expect_exact_resume(/*unfreeze=*/1, /*max_epochs=*/3, /*stop_step=*/2, "epoch=0-step=2.ckpt");  // before
  expect_exact_resume(1, 3, 4, "epoch=0-step=4.ckpt");    // at the end of the last frozen epoch
  expect_exact_resume(1, 3, 6, "epoch=1-step=6.ckpt");    // inside the unfreeze's epoch
  expect_exact_resume(1, 3, 10, "epoch=2-step=10.ckpt");  // inside the epoch after, its rate doubled
}

TEST_F(FinetuningTest, ControlAResumeWithoutTheCallbacksStateCannotLoadTheOptimizer) {
  // The optimizer's saved state holds the backbone's group: without BackboneFinetuning's state
  // nothing adds that group before it loads, and the resume is refused instead of going on wrong.
  io_ = std::make_shared<InMemoryCheckpointIO>();
  fit({.max_epochs = 3, .max_steps = 6},
      {std::make_shared<BackboneFinetuning>(unfreeze_at(1)),
       std::make_shared<ModelCheckpoint>(ModelCheckpointOptions{.save_top_k = -1, .every_n_train_steps = 6})});
  const std::string path = path_ending_with(io_->paths(), "epoch=1-step=6.ckpt");
  StateDict checkpoint = load_dict(*io_, path);
  StateDict states = checkpoint.at("callbacks").toGenericDict();
  ASSERT_TRUE(states.erase("BackboneFinetuning"));
  io_->save(checkpoint, path);
  try {
    fit({.max_epochs = 3}, {std::make_shared<BackboneFinetuning>(unfreeze_at(1))}, path);
    FAIL() << "resumed without the backbone's param group";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("param group"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace volt
