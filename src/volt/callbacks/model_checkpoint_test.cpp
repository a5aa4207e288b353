#include "volt/callbacks/model_checkpoint.h"

#include <gtest/gtest.h>

#include "volt/callbacks/testing_services.h"
#include "volt/core/error.h"

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

TEST(ModelCheckpoint, InvalidOptionsAreClearErrors) {
  EXPECT_THROW(ModelCheckpoint({.save_top_k = -2}), Error);
  EXPECT_THROW(ModelCheckpoint({.save_top_k = 3}), Error);  // no monitor to rank by
}

}  // namespace
}  // namespace volt
