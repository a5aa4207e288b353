// strategy="pipeline" in real fits: a module whose layers are a volt::Pipe trains as it does on
// one device, a run stopped and resumed ends bit-identical and keeps its partition, and what a
// pipeline cannot run is refused.
#include <gtest/gtest.h>

#include "volt/core/console.h"
#include "volt/core/testing.h"
#include "volt/pipeline/pipe.h"
#include "volt/trainer/trainer_testing.h"

namespace volt {
namespace {

using namespace volt::trainer_testing;  // NOLINT: the shared fixture and helpers
using Weights = std::map<std::string, torch::Tensor>;

/// Five layers in a volt::Pipe (or, with `piped` false, nothing to pipeline), Adam.
class PipedModule : public LightningModule {
 public:
  explicit PipedModule(bool piped = true, uint64_t seed = 3) : LightningModule("PipedModule") {
    torch::manual_seed(static_cast<int64_t>(seed));
    torch::nn::Sequential layers(torch::nn::Linear(4, 16), torch::nn::Tanh(), torch::nn::Linear(16, 16),
                                 torch::nn::Tanh(), torch::nn::Linear(16, 1));
    if (piped) {
      pipe_ = register_module("pipe", Pipe(layers));
    } else {
      plain_ = register_module("plain", layers);
    }
    data_ = make_dataset(48, 1, 1);
  }
  torch::Tensor forward(const torch::Tensor& x) { return pipe_ ? pipe_->forward(x) : plain_->forward(x); }
  torch::Tensor training_step(const Batch& batch, int64_t) override {
    torch::Tensor loss;
    if (per_micro_batch_ && pipe_) {
      const auto rows = static_cast<double>(batch.data.size(0));
      loss = pipe_->train_step(batch.data, [&](const torch::Tensor& out, int64_t begin, int64_t end) {
        return torch::mse_loss(out, batch.target.slice(0, begin, end)) * (static_cast<double>(end - begin) / rows);
      });
    } else {
      loss = torch::mse_loss(forward(batch.data), batch.target);
    }
    log("train/loss", loss);
    return loss;
  }
  /// The loss from Pipe::train_step (per micro-batch, in the plan's schedule), not Pipe::forward.
  bool per_micro_batch_ = false;
  OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(0.01));
  }
  DataLoader train_dataloader() override { return DataLoader(data_, {.batch_size = 12, .shuffle = true}); }
  Pipe pipe_{nullptr};

 private:
  torch::nn::Sequential plain_{nullptr};
  std::shared_ptr<TensorDataset> data_;
};

/// The weights by their place in the layers (the Pipe prefixes "pipe.layers.").
std::vector<torch::Tensor> weights(const LightningModule& module) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : module.parameters()) out.push_back(p.detach().clone());
  return out;
}

class PipelineTrainerTest : public TrainerTest {};

TEST_F(PipelineTrainerTest, TwoAndThreeStagesTrainLikeOneDevice) {
  PipedModule one;
  make_trainer({.max_epochs = 2, .seed = 1, .enable_checkpointing = false}).fit(one);
  for (const int64_t stages : {2, 3}) {
    PipedModule piped;
    auto console = std::make_shared<RecordingConsole>();
    Trainer trainer = make_trainer({.devices = DeviceRequest(stages),
                                    .strategy = StrategyRequest::kPipeline,
                                    .pipeline_chunks = 4,
                                    .max_epochs = 2,
                                    .seed = 1,
                                    .enable_checkpointing = false});
    trainer.set_console(console);
    trainer.fit(piped);
    const auto a = weights(piped);
    const auto b = weights(one);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-5, 1e-6)) << stages << ": " << i;
    EXPECT_EQ(static_cast<int64_t>(piped.pipe_->balance().size()), stages);
    const bool reported = std::any_of(console->infos.begin(), console->infos.end(), [](const std::string& line) {
      return line.find("Pipeline of") != std::string::npos && line.find("auto: balanced") != std::string::npos;
    });
    EXPECT_TRUE(reported) << "no partition line among " << console->infos.size() << " lines";
  }
}

TEST_F(PipelineTrainerTest, OneFOneBThroughTrainStepTrainsLikeOneDeviceAndLikeGPipe) {
  PipedModule one;
  make_trainer({.max_epochs = 2, .seed = 1, .enable_checkpointing = false}).fit(one);
  for (const int64_t stages : {2, 3}) {
    for (const int64_t chunks : {1, 4}) {
      std::vector<std::vector<torch::Tensor>> ends;
      for (const PipelineSchedule schedule : {PipelineSchedule::k1F1B, PipelineSchedule::kGPipe}) {
        PipedModule piped;
        piped.per_micro_batch_ = true;
        make_trainer({.devices = DeviceRequest(stages),
                      .strategy = StrategyRequest::kPipeline,
                      .pipeline_chunks = chunks,
                      .pipeline_schedule = schedule,
                      .max_epochs = 2,
                      .seed = 1,
                      .enable_checkpointing = false})
            .fit(piped);
        ends.push_back(weights(piped));
      }
      const auto b = weights(one);
      for (size_t i = 0; i < b.size(); ++i) {
        EXPECT_TRUE(torch::allclose(ends[0][i], b[i], 1e-5, 1e-6)) << stages << " stages, " << chunks << ": " << i;
        // The same sums per micro-batch, accumulated in another order.
        EXPECT_TRUE(torch::allclose(ends[0][i], ends[1][i], 1e-6, 1e-7))
            << stages << " stages, " << chunks << ": " << i;
      }
    }
  }
}

TEST_F(PipelineTrainerTest, TrainStepUnder16MixedIsRefusedWithAHint) {
  PipeImpl pipe(torch::nn::Sequential(torch::nn::Linear(2, 2), torch::nn::Linear(2, 1)));
  pipe.enable({.devices = {torch::kCPU, torch::kCPU}, .chunks = 2, .loss_scaling = true});
  const std::string message = volt::testing::error_message([&] {
    (void)pipe.train_step(torch::ones({4, 2}), [](const torch::Tensor& out, int64_t, int64_t) { return out.sum(); });
  });
  EXPECT_NE(message.find("16-mixed"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT"), std::string::npos) << message;
}

TEST_F(PipelineTrainerTest, AResumedPipelineEndsBitIdenticalAndKeepsItsPartition) {
  const TrainerOptions base{.devices = DeviceRequest(2),
                            .strategy = StrategyRequest::kPipeline,
                            .pipeline_balance = std::vector<int64_t>{1, 4},
                            .pipeline_chunks = 3,
                            .max_epochs = 2,
                            .seed = 1};
  PipedModule straight;
  TrainerOptions options = base;
  options.enable_checkpointing = false;
  make_trainer(options).fit(straight);

  PipedModule first;
  options = base;
  options.max_steps = 5;  // inside epoch 1 (4 steps per epoch)
  options.callbacks = {std::make_shared<ModelCheckpoint>(ModelCheckpointOptions{.dirpath = (root_ / "ckpt").string()})};
  make_trainer(options).fit(first);
  const auto checkpoints = std::vector<fs::path>(fs::directory_iterator(root_ / "ckpt"), fs::directory_iterator());
  ASSERT_EQ(checkpoints.size(), 1U);

  // Resumed with balance auto in a module with other weights: the checkpoint's partition and
  // weights win.
  PipedModule resumed(/*piped=*/true, /*seed=*/99);
  options = base;
  options.pipeline_balance.reset();
  options.enable_checkpointing = false;
  make_trainer(options).fit(resumed, {}, {}, checkpoints.front().string());
  EXPECT_EQ(resumed.pipe_->balance(), (std::vector<int64_t>{1, 4}));
  const auto a = weights(resumed);
  const auto b = weights(straight);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << i;
}

TEST_F(PipelineTrainerTest, AModuleWithoutAPipeAndOptionsWithoutThePipelineAreRefused) {
  PipedModule plain(/*piped=*/false);
  try {
    make_trainer({.devices = DeviceRequest(2), .strategy = StrategyRequest::kPipeline, .max_steps = 1}).fit(plain);
    FAIL() << "a module without a Pipe was pipelined";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds none"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("HINT"), std::string::npos);
  }
  EXPECT_THROW(make_trainer({.pipeline_chunks = 2}), Error);
  EXPECT_THROW(make_trainer({.devices = DeviceRequest(2),
                             .strategy = StrategyRequest::kPipeline,
                             .pipeline_balance = std::vector<int64_t>{5}}),
               Error);
}

}  // namespace
}  // namespace volt
