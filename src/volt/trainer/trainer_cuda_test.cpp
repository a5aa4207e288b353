// The Trainer on GPUs: one GPU, 16-bit mixed precision, dp over two GPUs, checkpoints of GPU runs,
// the snapshots' copy of a GPU's state into pinned host memory without blocking, and a crashed GPU
// run's bit-identical resume from its snapshot.
//
// Every test is named *_CUDA and skips itself, printing why, where fewer CUDA devices are visible
// than it needs: always in a CPU build of LibTorch, and in a CUDA build on a machine without GPUs
// (scripts/build-cuda.sh compiles and links them there). On a GPU machine:
//   build-cuda/src/volt/trainer/trainer_test --gtest_filter='*_CUDA'
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <filesystem>
#include <string>
#include <vector>

#include "volt/checkpoint/async_writer.h"
#include "volt/checkpoint/checkpoint_io.h"
#include "volt/precision/precision_plugin.h"
#include "volt/trainer/trainer.h"

namespace volt {
namespace {

namespace fs = std::filesystem;

/// Skips the calling test, saying why, unless this process sees `count` CUDA devices.
#define VOLT_REQUIRE_GPUS(count)                                                                    \
  if (const int64_t visible = static_cast<int64_t>(torch::cuda::device_count()); visible < (count)) \
  GTEST_SKIP() << "needs " << (count) << " CUDA device(s); this process sees " << visible           \
               << (MachineInfo::current().cuda_build ? " (CUDA build)" : " (CPU build of LibTorch: no CUDA)")

/// An MLP regression whose steps record the device they ran on.
struct Regression : LightningModule {
  explicit Regression(uint64_t seed = 0) : LightningModule("Regression") {
    torch::manual_seed(seed);
    net = register_module("net",
                          torch::nn::Sequential(torch::nn::Linear(8, 32), torch::nn::ReLU(), torch::nn::Linear(32, 1)));
  }
  torch::Tensor training_step(const Batch& batch, int64_t) override {
    step_device = batch.data.device();
    // The float32 cast keeps the loss in float32 under 16-bit autocast, as Lightning users write.
    const torch::Tensor loss = torch::mse_loss(net->forward(batch.data).to(torch::kFloat32), batch.target);
    log("train/loss", loss);
    return loss;
  }
  void validation_step(const Batch& batch, int64_t) override {
    log("val/loss", torch::mse_loss(net->forward(batch.data).to(torch::kFloat32), batch.target));
  }
  OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.05));
  }
  // dp on several GPUs runs a copy on each device but the first.
  std::shared_ptr<LightningModule> make_replica() const override { return std::make_shared<Regression>(); }

  torch::nn::Sequential net{nullptr};
  c10::Device step_device{c10::DeviceType::CPU};
};

/// A regression with dropout on its hidden layer (the GPU's generator in every step), trained with
/// Adam (state beside the parameters), whose training_step throws, a crash, at `crash_at_step`.
struct DropoutRegression : LightningModule {
  explicit DropoutRegression(int64_t crash_at_step = -1)
      : LightningModule("DropoutRegression"), crash_at_step(crash_at_step) {
    torch::manual_seed(0);
    hidden = register_module("hidden", torch::nn::Linear(8, 32));
    out = register_module("out", torch::nn::Linear(32, 1));
  }
  torch::Tensor training_step(const Batch& batch, int64_t) override {
    if (global_step() == crash_at_step) throw std::runtime_error("crash injected by the test");
    const torch::Tensor h = torch::dropout(torch::relu(hidden->forward(batch.data)), 0.2, /*train=*/true);
    return torch::mse_loss(out->forward(h), batch.target);
  }
  OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(0.01));
  }
  int64_t crash_at_step;
  torch::nn::Linear hidden{nullptr};
  torch::nn::Linear out{nullptr};
};

/// 256 examples of y = 0.5 * sum(x), from a private generator, in batches of 32.
DataLoader regression_data(uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  const torch::Tensor x = torch::randn({256, 8}, generator);
  return DataLoader(std::make_shared<TensorDataset>(x, x.sum(1, true) * 0.5), {.batch_size = 32});
}

/// A quiet, seeded two-epoch run on `accelerator` with `devices`, writing under a fresh folder.
TrainerOptions options(AcceleratorRequest accelerator, DeviceRequest devices, const std::string& name) {
  TrainerOptions o;
  o.accelerator = accelerator;
  o.devices = std::move(devices);
  o.max_epochs = 2;
  o.seed = 0;
  o.logger = false;
  o.enable_progress_bar = false;
  o.enable_model_summary = false;
  o.enable_checkpointing = false;
  o.default_root_dir = (fs::temp_directory_path() / ("volt_cuda_test_" + name)).string();
  fs::remove_all(o.default_root_dir);
  return o;
}

std::vector<torch::Tensor> cpu_parameters(const LightningModule& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model.parameters()) out.push_back(p.detach().to(torch::kCPU));
  return out;
}

void expect_close(const std::vector<torch::Tensor>& actual, const std::vector<torch::Tensor>& expected, double tol) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_TRUE(torch::allclose(actual[i], expected[i], tol, tol))
        << "parameter " << i << " differs by " << (actual[i] - expected[i]).abs().max().item<double>();
  }
}

TEST(TrainerCuda, OneGpuTrainsLikeTheCpu_CUDA) {
  VOLT_REQUIRE_GPUS(1);
  Regression on_cpu;
  Regression on_gpu;
  Trainer(options(AcceleratorRequest::kCpu, 1, "cpu")).fit(on_cpu, regression_data(1), regression_data(2));
  const FitResult result =
      Trainer(options(AcceleratorRequest::kGpu, 1, "gpu")).fit(on_gpu, regression_data(1), regression_data(2));
  EXPECT_TRUE(on_gpu.step_device.is_cuda());
  EXPECT_TRUE(on_gpu.parameters()[0].is_cuda());
  EXPECT_LT(result.metrics.at("val/loss"), 0.5);
  // TF32 matmuls and cuBLAS's summation order differ from the CPU's: close, not identical.
  expect_close(cpu_parameters(on_gpu), cpu_parameters(on_cpu), 1e-3);
}

TEST(TrainerCuda, CheckpointsOfAGpuRunHoldCpuTensorsAndResumeOnTheGpu_CUDA) {
  VOLT_REQUIRE_GPUS(1);
  Regression model;
  TrainerOptions o = options(AcceleratorRequest::kGpu, 1, "ckpt");
  o.enable_checkpointing = true;
  const FitResult result = Trainer(o).fit(model, regression_data(1), regression_data(2));
  ASSERT_FALSE(result.last_model_path.empty());
  const c10::IValue checkpoint = TorchCheckpointIO().load(result.last_model_path);
  for (const auto& entry : checkpoint.toGenericDict().at("state_dict").toGenericDict()) {
    EXPECT_TRUE(entry.value().toTensor().device().is_cpu()) << entry.key().toStringRef();
  }
  Regression resumed;
  o.max_epochs = 3;
  const FitResult more = Trainer(o).fit(resumed, regression_data(1), regression_data(2), result.last_model_path);
  EXPECT_EQ(more.epochs_completed, 3);
  EXPECT_TRUE(resumed.parameters()[0].is_cuda());
}

TEST(TrainerCuda, ARunThatCrashesOnTheGpuResumesFromItsSnapshotBitIdentical_CUDA) {
  // Issue #32 on a GPU: snapshots copy the GPU's state through pinned buffers in the background,
  // and a run that crashes resumes from the newest one (its file, or the memory tier's copy) and
  // ends with the parameters of a run that never failed: the model's and Adam's state, the GPU's
  // generator (dropout) and the position in the data all restored.
  VOLT_REQUIRE_GPUS(1);
  DropoutRegression straight;
  Trainer(options(AcceleratorRequest::kGpu, 1, "snapshot_straight")).fit(straight, regression_data(1));

  TrainerOptions o = options(AcceleratorRequest::kGpu, 1, "snapshot");  // one folder for both fits
  o.snapshot_every_n_steps = 3;
  DropoutRegression crashing(/*crash_at_step=*/13);  // 8 steps an epoch: in the second, after step 12's snapshot
  EXPECT_ANY_THROW(Trainer(o).fit(crashing, regression_data(1)));
  DropoutRegression resumed;
  const FitResult result = Trainer(o).fit(resumed, regression_data(1));
  EXPECT_FALSE(result.resumed_from.empty()) << "the second fit started afresh";
  EXPECT_EQ(result.global_step, 16);
  const std::vector<torch::Tensor> expected = cpu_parameters(straight);
  const std::vector<torch::Tensor> actual = cpu_parameters(resumed);
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_TRUE(torch::equal(actual[i], expected[i]))
        << "parameter " << i << " differs by " << (actual[i] - expected[i]).abs().max().item<double>();
  }
}

TEST(TrainerCuda, SixteenMixedScalesTheLossAndSavesTheScaler_CUDA) {
  VOLT_REQUIRE_GPUS(1);
  Regression model;
  TrainerOptions o = options(AcceleratorRequest::kGpu, 1, "fp16");
  o.precision = Precision::k16Mixed;
  o.enable_checkpointing = true;
  const FitResult result = Trainer(o).fit(model, regression_data(1), regression_data(2));
  EXPECT_LT(result.metrics.at("val/loss"), 0.5);
  const c10::IValue checkpoint = TorchCheckpointIO().load(result.last_model_path);
  const auto scaler = checkpoint.toGenericDict().at(kScalerCheckpointKey).toGenericDict();
  EXPECT_GT(scaler.at("scale").toDouble(), 0.0);
}

TEST(TrainerCuda, BFloat16MixedTrains_CUDA) {
  VOLT_REQUIRE_GPUS(1);
  Regression model;
  TrainerOptions o = options(AcceleratorRequest::kGpu, 1, "bf16");
  o.precision = Precision::kBf16Mixed;
  EXPECT_LT(Trainer(o).fit(model, regression_data(1), regression_data(2)).metrics.at("val/loss"), 0.5);
}

TEST(TrainerCuda, DpOverTwoGpusEqualsOneGpuOnTheSameBatch_CUDA) {
  VOLT_REQUIRE_GPUS(2);
  Regression one;
  Regression two;
  Trainer(options(AcceleratorRequest::kGpu, 1, "dp1")).fit(one, regression_data(1));
  TrainerOptions o = options(AcceleratorRequest::kGpu, 2, "dp2");
  o.strategy = StrategyRequest::kDp;
  Trainer(o).fit(two, regression_data(1));
  EXPECT_TRUE(two.parameters()[0].device() == c10::Device(c10::DeviceType::CUDA, 0));
  expect_close(cpu_parameters(two), cpu_parameters(one), 1e-4);
}

TEST(TrainerCuda, DpWithSixteenMixedTrains_CUDA) {
  VOLT_REQUIRE_GPUS(2);
  Regression model;
  TrainerOptions o = options(AcceleratorRequest::kGpu, 2, "dp16");
  o.strategy = StrategyRequest::kDp;
  o.precision = Precision::k16Mixed;
  EXPECT_LT(Trainer(o).fit(model, regression_data(1), regression_data(2)).metrics.at("val/loss"), 0.5);
}

TEST(TrainerCuda, SnapshotCopiesOfGpuTensorsArriveInPinnedMemoryWithTheValuesOfTheirStep_CUDA) {
  VOLT_REQUIRE_GPUS(1);
  const torch::Tensor weights = torch::randn({1024, 1024}, torch::kCUDA);
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  state.insert("w", weights);
  const torch::Tensor expected = weights.cpu();
  HostBuffers buffers;
  const c10::IValue copy = buffers.copy(state);
  // Training goes on at once: the next kernel queues behind the copy on the same stream.
  weights.add_(1.0);
  buffers.wait_copied();
  const torch::Tensor copied = copy.toGenericDict().at("w").toTensor();
  EXPECT_TRUE(copied.device().is_cpu());
  EXPECT_TRUE(copied.is_pinned());
  EXPECT_TRUE(torch::equal(copied, expected)) << "the copy holds the step's values, not the next step's";
  // The next snapshot reuses the pinned buffer.
  const c10::IValue next = buffers.copy(state);
  buffers.wait_copied();
  EXPECT_EQ(next.toGenericDict().at("w").toTensor().data_ptr(), copied.data_ptr());
  EXPECT_TRUE(torch::equal(next.toGenericDict().at("w").toTensor(), weights.cpu()));
}

}  // namespace
}  // namespace volt
