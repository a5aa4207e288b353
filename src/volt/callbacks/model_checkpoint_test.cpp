#include "volt/callbacks/model_checkpoint.h"

#include <gtest/gtest.h>

#include "volt/callbacks/testing_services.h"
#include "volt/core/error.h"
#include "volt/core/testing.h"
#include "volt/module/lightning_module.h"

namespace volt {
namespace {

struct CheckpointRun {
  ModelCheckpoint checkpoint;
  testing::RecordingServices services;
  std::map<std::string, double> metrics;

  void validate(int64_t epoch, int64_t step) {
    CallbackContext context;
    context.epoch = epoch;
    context.global_step = step;
    context.metrics = &metrics;
    checkpoint.on_validation_end(context, services);
  }
};

TEST(ModelCheckpoint, FilenameTemplateInsertsNamesAndFormats) {
  EXPECT_EQ(ModelCheckpoint::format_filename("{epoch}-{step}", 3, 120, {}, true), "epoch=3-step=120");
  EXPECT_EQ(ModelCheckpoint::format_filename("best-{epoch}-{val/loss:.2f}", 3, 0, {{"val/loss", 0.1234}}, true),
            "best-epoch=3-val_loss=0.12");
  EXPECT_EQ(ModelCheckpoint::format_filename("{epoch}", 3, 0, {}, false), "3");
}

TEST(ModelCheckpoint, KeepsTheTopKByTheMonitoredMetric) {
  CheckpointRun run{ModelCheckpoint({.dirpath = "/ck", .monitor = "val/acc", .mode = Mode::kMax, .save_top_k = 2})};
  run.checkpoint.setup({.has_validation = true});
  for (auto [epoch, acc] : std::vector<std::pair<int, double>>{{0, 0.5}, {1, 0.7}, {2, 0.6}, {3, 0.4}}) {
    run.metrics["val/acc"] = acc;
    run.validate(epoch, (epoch + 1) * 10);
  }
  EXPECT_EQ(run.services.present, (std::set<std::string>{"/ck/epoch=1-step=20.ckpt", "/ck/epoch=2-step=30.ckpt"}));
  EXPECT_EQ(run.checkpoint.best_model_path(), "/ck/epoch=1-step=20.ckpt");
  EXPECT_EQ(run.checkpoint.best_model_score(), 0.7);
  EXPECT_EQ(run.services.saved.size(), 3u);  // epoch 3 was worse than both: not written at all
}

TEST(ModelCheckpoint, WithoutMonitorKeepsTheLatestAndLast) {
  CheckpointRun run{ModelCheckpoint({.dirpath = "/ck", .save_last = true})};
  run.checkpoint.setup({.has_validation = true});
  run.validate(0, 5);
  run.validate(1, 10);
  EXPECT_EQ(run.services.present, (std::set<std::string>{"/ck/epoch=1-step=10.ckpt", "/ck/last.ckpt"}));
  EXPECT_EQ(run.checkpoint.last_model_path(), "/ck/last.ckpt");
}

TEST(ModelCheckpoint, SaveLastAlsoSavesWhereTheFitEndedAfterItsLastSave) {
  CheckpointRun run{ModelCheckpoint({.dirpath = "/ck", .save_last = true})};
  run.checkpoint.setup({.has_validation = true});
  const auto batch = [&run](int64_t step) {
    CallbackContext context;
    context.global_step = step;
    run.checkpoint.on_train_batch_end(context, run.services);
  };
  const auto end = [&run](int64_t epoch, int64_t step) {
    CallbackContext context;
    context.epoch = epoch;
    context.global_step = step;
    run.checkpoint.on_train_end(context, run.services);
  };
  batch(4);
  run.validate(0, 4);
  batch(6);  // max_steps (or a signal, or a callback) stops here, inside epoch 1
  run.services.saved.clear();
  end(1, 6);
  EXPECT_EQ(run.services.saved, (std::vector<std::string>{"/ck/last.ckpt"})) << "last.ckpt is where the fit ended";
  EXPECT_EQ(run.checkpoint.last_model_path(), "/ck/last.ckpt");

  // A fit that ends at the step of its last save, or trains nothing, writes nothing more.
  run.checkpoint.setup({.has_validation = true});
  batch(8);
  run.validate(1, 8);
  run.services.saved.clear();
  end(2, 8);
  EXPECT_TRUE(run.services.saved.empty());
  CheckpointRun resumed{ModelCheckpoint({.dirpath = "/ck", .save_last = true})};
  resumed.checkpoint.setup({.has_validation = true});
  CallbackContext at_end;
  at_end.global_step = 8;
  resumed.checkpoint.on_train_end(at_end, resumed.services);
  EXPECT_TRUE(resumed.services.saved.empty()) << "a resumed fit with nothing left to train";

  // Without save_last nothing is saved at the end, as in Lightning.
  CheckpointRun plain{ModelCheckpoint({.dirpath = "/ck"})};
  plain.checkpoint.setup({.has_validation = true});
  CallbackContext context;
  context.global_step = 2;
  plain.checkpoint.on_train_batch_end(context, plain.services);
  plain.checkpoint.on_train_end(context, plain.services);
  EXPECT_TRUE(plain.services.saved.empty());
}

TEST(ModelCheckpoint, EveryNTrainStepsSavesOnTheBatchHook) {
  ModelCheckpoint checkpoint({.dirpath = "/ck", .save_top_k = -1, .every_n_train_steps = 2});
  checkpoint.setup({.has_validation = false});
  testing::RecordingServices services;
  for (int64_t step = 1; step <= 5; ++step) {
    CallbackContext context;
    context.global_step = step;
    checkpoint.on_train_batch_end(context, services);
    checkpoint.on_train_epoch_end(context, services);  // every_n_epochs defaults to 0 here
  }
  EXPECT_EQ(services.saved, (std::vector<std::string>{"/ck/epoch=0-step=2.ckpt", "/ck/epoch=0-step=4.ckpt"}));
}

TEST(ModelCheckpoint, DefaultDirectoryIsUnderTheLogDir) {
  ModelCheckpoint checkpoint;
  checkpoint.setup({.root_dir = "/r", .log_dir = "/r/lightning_logs/version_0"});
  EXPECT_EQ(checkpoint.dirpath(), "/r/lightning_logs/version_0/checkpoints");
}

TEST(ModelCheckpoint, StateRoundTripRestoresTheBest) {
  CheckpointRun run{ModelCheckpoint({.dirpath = "/ck", .monitor = "loss"})};
  run.checkpoint.setup({.has_validation = true});
  run.metrics["loss"] = 0.3;
  run.validate(0, 1);
  ModelCheckpoint restored({.dirpath = "/ck", .monitor = "loss"});
  restored.setup({.has_validation = true});
  restored.load_state_dict(run.checkpoint.state_dict());
  EXPECT_EQ(restored.best_model_path(), run.checkpoint.best_model_path());
  EXPECT_EQ(restored.best_model_score(), 0.3);
}

/// A module for the hooks that print through one.
struct Quiet : LightningModule {
  torch::Tensor training_step(const Batch&, int64_t) override { return {}; }
  OptimizerConfig configure_optimizers() override { return {}; }
};

TEST(ModelCheckpoint, FromAnotherDirpathOnlyTheBestPathComesBackWithAWarning) {
  CheckpointRun run{ModelCheckpoint({.dirpath = "/ck", .monitor = "loss"})};
  run.checkpoint.setup({.has_validation = true});
  run.metrics["loss"] = 0.3;
  run.validate(0, 1);
  // A resume whose logger opened version_1: the default dirpath moved with it.
  ModelCheckpoint restored({.dirpath = "/ck2", .monitor = "loss"});
  restored.setup({.has_validation = true});
  restored.load_state_dict(run.checkpoint.state_dict());
  EXPECT_EQ(restored.best_model_path(), run.checkpoint.best_model_path());
  EXPECT_FALSE(restored.best_model_score().has_value());
  EXPECT_TRUE(restored.best_k_models().empty());
  Quiet module;
  CallbackContext context;
  context.module = &module;
  ::testing::internal::CaptureStdout();
  restored.on_load_checkpoint(context, make_state_dict());
  restored.on_load_checkpoint(context, make_state_dict());  // said once
  const std::string said = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(said.find("warning: ModelCheckpoint: the dirpath has changed from /ck to /ck2"), 0u) << said;
  EXPECT_NE(said.find("HINT: give ModelCheckpoint a dirpath of its own"), std::string::npos) << said;
  EXPECT_EQ(said.find("warning", 1), std::string::npos) << said;
}

TEST(ModelCheckpoint, StateKeyIsLightningsAndTheOldKeyStaysReadable) {
  EXPECT_EQ(ModelCheckpoint({.monitor = "val/acc", .mode = Mode::kMax}).state_key(),
            "ModelCheckpoint{'monitor': 'val/acc', 'mode': 'max', 'every_n_train_steps': 0, 'every_n_epochs': 1, "
            "'train_time_interval': None}");
  EXPECT_EQ(ModelCheckpoint({.every_n_train_steps = 5}).state_key(),
            "ModelCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 5, 'every_n_epochs': 0, "
            "'train_time_interval': None}");
  EXPECT_EQ(ModelCheckpoint({.monitor = "val/acc", .mode = Mode::kMax}).legacy_state_key(),
            "ModelCheckpoint{'monitor': 'val/acc', 'mode': 'max', 'every_n_train_steps': 0, 'every_n_epochs': 1}");
}

/// Snapshots the callback's state each time a checkpoint is written, as the checkpoint file would.
struct SnapshotServices : testing::RecordingServices {
  const ModelCheckpoint* checkpoint = nullptr;
  std::map<std::string, StateDict> states;
  void save_checkpoint(const std::string& path) override {
    RecordingServices::save_checkpoint(path);
    states.insert_or_assign(path, checkpoint->state_dict());
  }
};

TEST(ModelCheckpoint, ASavedCheckpointRecordsItselfAsLightningDoes) {
  ModelCheckpoint checkpoint({.dirpath = "/ck", .monitor = "val/loss", .save_top_k = 2});
  checkpoint.setup({.has_validation = true});
  SnapshotServices services;
  services.checkpoint = &checkpoint;
  std::map<std::string, double> metrics;
  for (auto [epoch, loss] : std::vector<std::pair<int, double>>{{0, 0.5}, {1, 0.3}, {2, 0.4}}) {
    metrics["val/loss"] = loss;
    CallbackContext context;
    context.epoch = epoch;
    context.global_step = epoch + 1;
    context.metrics = &metrics;
    checkpoint.on_validation_end(context, services);
  }
  const StateDict second = services.states.at("/ck/epoch=1-step=2.ckpt");
  EXPECT_EQ(second.at("best_model_path").toStringRef(), "/ck/epoch=1-step=2.ckpt");
  EXPECT_EQ(internal::score_value(second.at("best_model_score")), 0.3);
  // Lightning ranks the next score against kth_best_model_path, which must be a kept file.
  const StateDict third = services.states.at("/ck/epoch=2-step=3.ckpt");
  EXPECT_EQ(third.at("kth_best_model_path").toStringRef(), "/ck/epoch=2-step=3.ckpt");
  EXPECT_EQ(internal::score_value(third.at("kth_value")), 0.4);
  EXPECT_TRUE(third.at("best_k_models").toGenericDict().contains("/ck/epoch=2-step=3.ckpt"));
  EXPECT_TRUE(third.at("best_model_score").isTensor()) << "Lightning compares scores with torch.lt";
  // The file that fell out of the top 2 goes only after the new one is written.
  EXPECT_EQ(services.removed, std::vector<std::string>{"/ck/epoch=0-step=1.ckpt"});
}

TEST(ModelCheckpoint, ReadsNumbersAndTensorsAsScores) {
  StateDict state = make_state_dict();
  state.insert("dirpath", "/ck");
  state.insert("best_model_path", "/ck/a.ckpt");
  state.insert("best_model_score", 0.25);  // an older Volt's plain number
  c10::Dict<std::string, at::Tensor> best_k;
  best_k.insert("/ck/a.ckpt", internal::score_tensor(0.25));
  state.insert("best_k_models", best_k);
  ModelCheckpoint restored({.dirpath = "/ck", .monitor = "loss"});
  restored.setup({.has_validation = true});
  restored.load_state_dict(state);
  EXPECT_EQ(restored.best_model_score(), 0.25);
  EXPECT_EQ(restored.best_k_models().at("/ck/a.ckpt"), 0.25);
}

TEST(ModelCheckpoint, InvalidOptionsAreClearErrors) {
  EXPECT_THROW(ModelCheckpoint({.save_top_k = -2}), Error);
  EXPECT_THROW(ModelCheckpoint({.save_top_k = 3}), Error);  // no monitor to rank by
  std::string message = volt::testing::error_message(
      [] { ModelCheckpoint({.every_n_train_steps = 10, .train_time_interval = std::chrono::minutes(5)}); });
  EXPECT_NE(message.find("every_n_train_steps=10, every_n_epochs=None, "
                         "train_time_interval=datetime.timedelta(seconds=300)): these triggers are mutually exclusive"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
  message = volt::testing::error_message([] { ModelCheckpoint({.train_time_interval = std::chrono::seconds(0)}); });
  EXPECT_NE(message.find("train_time_interval=datetime.timedelta(0) must be positive"), std::string::npos) << message;
}

TEST(ModelCheckpoint, SaveWeightsOnlyWritesEveryFileWeightsOnly) {
  CheckpointRun run{ModelCheckpoint({.dirpath = "/ck", .save_last = true, .save_weights_only = true})};
  run.checkpoint.setup({.has_validation = true});
  run.validate(0, 10);
  EXPECT_EQ(run.services.saved, (std::vector<std::string>{"/ck/epoch=0-step=10.ckpt", "/ck/last.ckpt"}));
  EXPECT_EQ(run.services.weights_only, (std::set<std::string>{"/ck/epoch=0-step=10.ckpt", "/ck/last.ckpt"}));

  CheckpointRun full{ModelCheckpoint({.dirpath = "/ck"})};
  full.checkpoint.setup({.has_validation = true});
  full.validate(0, 10);
  EXPECT_EQ(full.services.saved.size(), 1u);
  EXPECT_TRUE(full.services.weights_only.empty()) << "full checkpoints by default";
}

TEST(ModelCheckpoint, TrainTimeIntervalSavesWhenThatMuchTimeHasPassed) {
  testing::ManualClock time;
  ModelCheckpoint checkpoint({.dirpath = "/ck", .save_top_k = -1, .train_time_interval = std::chrono::minutes(10)},
                             time.clock());
  checkpoint.setup({.has_validation = false});
  testing::RecordingServices services;
  const auto batch = [&](int64_t step, std::chrono::seconds at) {
    time.now = std::chrono::steady_clock::time_point{} + at;
    CallbackContext context;
    context.global_step = step;
    checkpoint.on_train_batch_end(context, services);
    checkpoint.on_train_epoch_end(context, services);  // no epoch trigger: time replaces it
  };
  batch(1, std::chrono::seconds(5));    // the clock starts at the first batch
  batch(2, std::chrono::seconds(300));  // 4:55 since
  batch(3, std::chrono::seconds(604));  // 9:59
  EXPECT_TRUE(services.saved.empty());
  batch(4, std::chrono::seconds(605));  // 10:00: due
  batch(5, std::chrono::seconds(900));  // 4:55 since that save
  batch(6, std::chrono::seconds(1300));
  EXPECT_EQ(services.saved, (std::vector<std::string>{"/ck/epoch=0-step=4.ckpt", "/ck/epoch=0-step=6.ckpt"}));
  EXPECT_EQ(services.broadcasts, 6) << "asked at every batch, so every process calls the collective alike";

  // A new fit (a resume) counts from its own first batch.
  checkpoint.setup({.has_validation = false});
  services.saved.clear();
  batch(7, std::chrono::seconds(5000));
  batch(8, std::chrono::seconds(5100));
  EXPECT_TRUE(services.saved.empty());
}

TEST(ModelCheckpoint, TrainTimeIntervalFollowsRankZerosClock) {
  testing::ManualClock time;
  ModelCheckpoint checkpoint({.dirpath = "/ck", .train_time_interval = std::chrono::seconds(60)}, time.clock());
  checkpoint.setup({.has_validation = false});
  testing::RecordingServices services;
  CallbackContext context;
  context.global_step = 1;
  checkpoint.on_train_batch_end(context, services);
  // This process's clock says the interval has passed, rank 0's does not: no save here either.
  services.rank0_decision = false;
  time.now += std::chrono::seconds(61);
  context.global_step = 2;
  checkpoint.on_train_batch_end(context, services);
  EXPECT_TRUE(services.saved.empty());
  // Rank 0's says it has, this one's does not: it saves with rank 0.
  services.rank0_decision = true;
  time.now += std::chrono::seconds(1);
  context.global_step = 3;
  checkpoint.on_train_batch_end(context, services);
  EXPECT_EQ(services.saved, (std::vector<std::string>{"/ck/epoch=0-step=3.ckpt"}));
}

TEST(ModelCheckpoint, TrainTimeIntervalIsInTheStateKeyAsLightningWritesIt) {
  EXPECT_EQ(ModelCheckpoint({.train_time_interval = std::chrono::minutes(30)}).state_key(),
            "ModelCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 0, 'every_n_epochs': 0, "
            "'train_time_interval': datetime.timedelta(seconds=1800)}");
  EXPECT_EQ(ModelCheckpoint::timedelta_repr(std::chrono::hours(25) + std::chrono::microseconds(7)),
            "datetime.timedelta(days=1, seconds=3600, microseconds=7)");
  EXPECT_EQ(ModelCheckpoint::timedelta_repr(std::chrono::hours(48)), "datetime.timedelta(days=2)");
  EXPECT_EQ(ModelCheckpoint::timedelta_repr(std::chrono::milliseconds(1500)),
            "datetime.timedelta(seconds=1, microseconds=500000)");
}

}  // namespace
}  // namespace volt
