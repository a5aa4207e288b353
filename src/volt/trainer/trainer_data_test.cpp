// The Trainer with data of every kind: DataModules, streams (IterableDataset) through fit,
// validate and a mid-epoch resume, and the limits a stream refuses.
#include <gtest/gtest.h>

#include "volt/callbacks/model_checkpoint.h"
#include "volt/trainer/trainer_testing.h"

namespace volt {
namespace {

using namespace volt::trainer_testing;  // NOLINT: the shared fixture and helpers

/// Records its hooks; serves TinyModule-shaped data (4 features, 1 target); can fail in setup.
class RecordingData : public DataModule {
 public:
  void prepare_data() override { calls.push_back("prepare_data"); }
  void setup(Stage stage) override {
    calls.push_back(std::string("setup(") + to_string(stage) + ")");
    train_ = make_dataset(12, 1, 1);
    val_ = make_dataset(8, 2, 1);
  }
  void teardown(Stage stage) override { calls.push_back(std::string("teardown(") + to_string(stage) + ")"); }
  DataLoader train_dataloader() override {
    calls.push_back("train_dataloader");
    return DataLoader(train_, {.batch_size = 4});
  }
  DataLoader val_dataloader() override {
    calls.push_back("val_dataloader");
    return DataLoader(val_, {.batch_size = 4});
  }
  DataLoader test_dataloader() override {
    calls.push_back("test_dataloader");
    return DataLoader(val_, {.batch_size = 8});
  }
  std::vector<std::string> calls;

 private:
  std::shared_ptr<TensorDataset> train_;
  std::shared_ptr<TensorDataset> val_;
};

TEST_F(TrainerTest, ADataModuleIsPreparedSetUpAndTornDownAroundEachStage) {
  auto module = make_module({.no_train_data = true});
  RecordingData data;
  Trainer trainer = make_trainer({.max_epochs = 1, .num_sanity_val_steps = 0, .enable_checkpointing = false});
  const FitResult fit = trainer.fit(*module, data);
  EXPECT_EQ(fit.global_step, 3);  // 12 examples of the DataModule in batches of 4
  const EvalResult test = trainer.test(*module, data);
  EXPECT_EQ(test.examples, 8);
  EXPECT_EQ(data.calls, (std::vector<std::string>{"prepare_data", "setup(fit)", "train_dataloader", "val_dataloader",
                                                  "teardown(fit)", "prepare_data", "setup(test)", "test_dataloader",
                                                  "teardown(test)"}));
}

TEST_F(TrainerTest, ADataModuleIsTornDownWhenTheStageFails) {
  auto module = make_module({.detached_loss = true, .no_train_data = true});
  RecordingData data;
  Trainer trainer = make_trainer({.max_epochs = 1, .num_sanity_val_steps = 0, .enable_checkpointing = false});
  EXPECT_THROW(trainer.fit(*module, data), Error);
  ASSERT_FALSE(data.calls.empty());
  EXPECT_EQ(data.calls.back(), "teardown(fit)");
}

TEST(Stage, NamesRoundTrip) {
  for (const Stage stage : {Stage::kFit, Stage::kValidate, Stage::kTest, Stage::kPredict}) {
    EXPECT_EQ(parse_stage(to_string(stage)), stage);
  }
  EXPECT_THROW(parse_stage("train"), Error);
}

/// TinyModule with two validation loaders (8 and 12 examples) and two test loaders, recording
/// which loader each evaluation step read.
class TwoLoaders : public TinyModule {
 public:
  TwoLoaders() : TinyModule({.val_size = 8}) {}
  std::vector<DataLoader> val_dataloaders() override {
    return {DataLoader(make_dataset(8, 2, 1), {.batch_size = 4}),
            DataLoader(make_dataset(12, 3, 1), {.batch_size = 4})};
  }
  std::vector<DataLoader> test_dataloaders() override { return val_dataloaders(); }
  void validation_step(const Batch& batch, int64_t batch_idx) override {
    seen_idx.push_back(dataloader_idx());
    TinyModule::validation_step(batch, batch_idx);
  }
  std::vector<int64_t> seen_idx;
};

TEST_F(TrainerTest, SeveralValidationLoadersNameTheirMetricsByDataloaderIdx) {
  TwoLoaders module;
  Trainer trainer = make_trainer({.max_epochs = 1, .num_sanity_val_steps = 1, .enable_checkpointing = false});
  const FitResult fit = trainer.fit(module);
  // The sanity check takes one batch of each loader; validation all 2 + 3.
  EXPECT_EQ(module.seen_idx, (std::vector<int64_t>{0, 1, 0, 0, 1, 1, 1}));
  EXPECT_EQ(module.count("on_validation_epoch_start"), 2);  // once per run, not per loader
  EXPECT_EQ(fit.metrics.at("val/examples/dataloader_idx_0"), 8);
  EXPECT_EQ(fit.metrics.at("val/examples/dataloader_idx_1"), 12);
  EXPECT_EQ(fit.metrics.count("val/loss/dataloader_idx_1"), 1u);
  EXPECT_EQ(fit.metrics.count("val/loss"), 0u);
  const EvalResult test = trainer.test(module);
  EXPECT_EQ(test.examples, 20);
  EXPECT_EQ(test.batches, 5);
  EXPECT_EQ(test.metrics.count("test/loss/dataloader_idx_0"), 1u);
  EXPECT_EQ(module.dataloader_idx(), 0) << "dataloader_idx is 0 again outside evaluation";
}

/// TinyModule's regression data as a stream of uneven shards.
class RegressionStream : public IterableDataset {
 public:
  RegressionStream(std::shared_ptr<TensorDataset> data, std::vector<int64_t> sizes)
      : data_(std::move(data)), sizes_(std::move(sizes)) {}
  int64_t num_shards() const override { return static_cast<int64_t>(sizes_.size()); }
  std::unique_ptr<ExampleReader> open(int64_t shard) const override {
    int64_t first = 0;
    for (int64_t s = 0; s < shard; ++s) first += sizes_[s];
    return std::make_unique<Reader>(data_, first, first + sizes_[shard]);
  }

 private:
  class Reader : public ExampleReader {
   public:
    Reader(std::shared_ptr<TensorDataset> data, int64_t next, int64_t end)
        : data_(std::move(data)), next_(next), end_(end) {}
    std::optional<Example> next() override {
      if (next_ >= end_) return std::nullopt;
      const Batch one = data_->get_batch(torch::tensor({next_++}));
      return Example{.data = one.data[0], .target = one.target[0]};
    }

   private:
    std::shared_ptr<TensorDataset> data_;
    int64_t next_;
    int64_t end_;
  };
  std::shared_ptr<TensorDataset> data_;
  std::vector<int64_t> sizes_;
};

DataLoader stream_loader(int64_t batch_size = 4) {
  return DataLoader(std::static_pointer_cast<const IterableDataset>(
                        std::make_shared<RegressionStream>(make_dataset(30, 1, 1), std::vector<int64_t>{7, 3, 12, 8})),
                    {.batch_size = batch_size, .shuffle = true, .shuffle_buffer = 5});
}

std::vector<torch::Tensor> parameter_list(TinyModule& module) {
  std::vector<torch::Tensor> out;
  for (const auto& p : module.parameters()) out.push_back(p.detach().clone());
  return out;
}

TEST_F(TrainerTest, AStreamTrainsUntilItEndsAndValidatesAtTheEpochsEnd) {
  auto module = make_module();
  Trainer trainer = make_trainer({.max_epochs = 2, .num_sanity_val_steps = 0, .enable_checkpointing = false});
  const FitResult result = trainer.fit(*module, stream_loader(), stream_loader(5));
  EXPECT_EQ(result.global_step, 2 * 8);  // ceil(30 / 4) = 8 batches a lane: one lane
  EXPECT_EQ(module->count("validation_step"), 2 * 6);
  const EvalResult val = trainer.validate(*module, stream_loader(7));
  EXPECT_EQ(val.examples, 30);
  EXPECT_EQ(val.batches, 5);
}

TEST_F(TrainerTest, AStreamTakesCountsNotFractions) {
  auto module = make_module();
  Trainer counted = make_trainer({.max_epochs = 1, .limit_train_batches = 3, .enable_checkpointing = false});
  EXPECT_EQ(counted.fit(*module, stream_loader()).global_step, 3);
  Trainer fraction = make_trainer({.max_epochs = 1, .limit_train_batches = 0.5, .enable_checkpointing = false});
  try {
    fraction.fit(*module, stream_loader());
    ADD_FAILURE() << "a fraction of a stream was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("limit_train_batches=0.5 is a fraction of an epoch"), std::string::npos)
        << e.what();
  }
  Trainer interval = make_trainer({.max_epochs = 1, .val_check_interval = 0.25, .enable_checkpointing = false});
  EXPECT_THROW(interval.fit(*module, stream_loader(), stream_loader()), Error);
}

TEST_F(TrainerTest, AStreamResumedInsideAnEpochEndsBitIdentical) {
  auto straight = make_module();
  make_trainer({.max_epochs = 2, .enable_checkpointing = false}).fit(*straight, stream_loader());

  auto first = make_module();
  auto last = std::make_shared<ModelCheckpoint>(
      ModelCheckpointOptions{.dirpath = (root_ / "ckpt").string(), .save_last = true});
  make_trainer({.max_epochs = 2, .max_steps = 11, .callbacks = {last}}).fit(*first, stream_loader());
  auto second = make_module();
  const FitResult resumed = make_trainer({.max_epochs = 2, .enable_checkpointing = false})
                                .fit(*second, stream_loader(), {}, (root_ / "ckpt" / "last.ckpt").string());
  EXPECT_EQ(resumed.global_step, 16);
  const auto a = parameter_list(*straight);
  const auto b = parameter_list(*second);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
}

// ---- reload_dataloaders_every_n_epochs ----------------------------------------------------------

/// TinyModule whose training data grows with the epoch it is asked at (4 examples per epoch + 1).
class ReloadingModule : public TinyModule {
 public:
  using TinyModule::TinyModule;
  DataLoader train_dataloader() override {
    train_calls.push_back(current_epoch());
    return DataLoader(make_dataset(4 * (current_epoch() + 1), 1, 1), {.batch_size = 4});
  }
  DataLoader val_dataloader() override {
    val_calls.push_back(current_epoch());
    return TinyModule::val_dataloader();
  }
  std::vector<int64_t> train_calls;
  std::vector<int64_t> val_calls;
};

TEST_F(TrainerTest, LoadersAreAskedForAgainAtEveryNthEpochAndTheirNewLengthCounts) {
  torch::manual_seed(7);
  ReloadingModule module;
  Trainer trainer = make_trainer({.max_epochs = 5,
                                  .num_sanity_val_steps = 0,
                                  .reload_dataloaders_every_n_epochs = 2,
                                  .enable_checkpointing = false});
  const FitResult result = trainer.fit(module);
  EXPECT_EQ(module.train_calls, (std::vector<int64_t>{0, 2, 4}));
  EXPECT_EQ(module.val_calls, (std::vector<int64_t>{0, 2, 4}));
  // Epochs 0-1 train 1 batch each, 2-3 three each, 4 five.
  EXPECT_EQ(result.global_step, 1 + 1 + 3 + 3 + 5);
}

TEST_F(TrainerTest, WithoutReloadingTheFirstLoadersServeEveryEpoch) {
  torch::manual_seed(7);
  ReloadingModule module;
  Trainer trainer = make_trainer({.max_epochs = 3, .num_sanity_val_steps = 0, .enable_checkpointing = false});
  EXPECT_EQ(trainer.fit(module).global_step, 3);
  EXPECT_EQ(module.train_calls, (std::vector<int64_t>{0}));
}

TEST_F(TrainerTest, LoadersPassedToFitAreKeptWhenReloading) {
  torch::manual_seed(7);
  ReloadingModule module;
  Trainer trainer = make_trainer({.max_epochs = 3,
                                  .num_sanity_val_steps = 0,
                                  .reload_dataloaders_every_n_epochs = 1,
                                  .enable_checkpointing = false});
  const FitResult result = trainer.fit(module, DataLoader(make_dataset(8, 1, 1), {.batch_size = 4}));
  EXPECT_TRUE(module.train_calls.empty());
  EXPECT_EQ(module.val_calls, (std::vector<int64_t>{0, 1, 2})) << "validation still comes from the hook";
  EXPECT_EQ(result.global_step, 6);
}

TEST_F(TrainerTest, AResumedRunReloadsAtItsStartAndThenAtTheSameEpochsAsAnUninterruptedOne) {
  torch::manual_seed(7);
  ReloadingModule straight;
  make_trainer({.max_epochs = 5,
                .num_sanity_val_steps = 0,
                .reload_dataloaders_every_n_epochs = 2,
                .seed = 3,
                .enable_checkpointing = false})
      .fit(straight);
  std::string ckpt;
  {
    torch::manual_seed(7);
    ReloadingModule module;
    Trainer trainer =
        make_trainer({.max_epochs = 3, .num_sanity_val_steps = 0, .reload_dataloaders_every_n_epochs = 2});
    ckpt = trainer.fit(module).last_model_path;
  }
  torch::manual_seed(7);
  ReloadingModule module;
  Trainer trainer = make_trainer({.max_epochs = 5,
                                  .num_sanity_val_steps = 0,
                                  .reload_dataloaders_every_n_epochs = 2,
                                  .seed = 3,
                                  .enable_checkpointing = false});
  const FitResult result = trainer.fit(module, {}, {}, ckpt);
  // Asked once before the checkpoint is read (epoch 0); at the resumed start as the uninterrupted
  // run asked for epoch 3's loaders (at epoch 2); then at 4. The same data, the same steps.
  EXPECT_EQ(module.train_calls, (std::vector<int64_t>{0, 2, 4}));
  EXPECT_EQ(result.global_step, 1 + 1 + 3 + 3 + 5);
  EXPECT_TRUE(bit_identical(trainer_testing::parameters_of(module), trainer_testing::parameters_of(straight)));
}

TEST_F(TrainerTest, ADataModuleIsAskedForNewLoadersWhenReloading) {
  auto module = make_module({.no_train_data = true});
  RecordingData data;
  Trainer trainer = make_trainer({.max_epochs = 2,
                                  .num_sanity_val_steps = 0,
                                  .reload_dataloaders_every_n_epochs = 1,
                                  .enable_checkpointing = false});
  trainer.fit(*module, data);
  EXPECT_EQ(data.calls, (std::vector<std::string>{"prepare_data", "setup(fit)", "train_dataloader", "val_dataloader",
                                                  "train_dataloader", "val_dataloader", "teardown(fit)"}));
}

TEST(RunPlan, ReloadingEveryNegativeEpochsIsRefused) {
  TrainerOptions options;
  options.reload_dataloaders_every_n_epochs = -1;
  EXPECT_THROW(Trainer(options, Env(Env::Vars{}), MachineInfo{1, "/tmp"}), Error);
}

}  // namespace
}  // namespace volt
