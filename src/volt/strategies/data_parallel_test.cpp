#include "volt/strategies/data_parallel.h"

#include <gtest/gtest.h>

#include <stdexcept>

#include "volt/core/error.h"
#include "volt/core/testing.h"
#include "volt/module/lightning_module.h"

namespace volt {
namespace {

/// A two-layer regression that logs its loss; optionally with BatchNorm, optionally failing.
struct Net : LightningModule {
  /// `seed` picks the initial weights (copies made by make_replica start from others).
  explicit Net(bool batch_norm = false, uint64_t seed = 0) : batch_norm_(batch_norm) {
    torch::manual_seed(seed);
    hidden = register_module("hidden", torch::nn::Linear(6, 5));
    out = register_module("out", torch::nn::Linear(5, 1));
    if (batch_norm) norm = register_module("norm", torch::nn::BatchNorm1d(5));
  }
  torch::Tensor training_step(const Batch& batch, int64_t) override {
    if (fail_on_examples > 0 && batch.data.size(0) == fail_on_examples) throw std::runtime_error("replica failed");
    torch::Tensor h = hidden(batch.data);
    if (!norm.is_empty()) h = norm(h);
    const torch::Tensor loss = torch::mse_loss(out(torch::tanh(h)), batch.target);
    log("train/loss", loss);
    log("train/examples", static_cast<double>(batch.data.size(0)), {.reduce_fx = Reduce::kSum});
    return loss;
  }
  OptimizerConfig configure_optimizers() override { return {}; }
  std::shared_ptr<LightningModule> make_replica() const override {
    if (!replicable) return nullptr;
    auto copy = std::make_shared<Net>(batch_norm_, /*seed=*/7);
    copy->fail_on_examples = fail_on_examples;
    return copy;
  }

  bool batch_norm_;
  bool replicable = true;
  torch::nn::Linear hidden{nullptr};
  torch::nn::Linear out{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
  int64_t fail_on_examples = 0;
};

/// Records what reaches the module's sink.
struct RecordingSink : MetricSink {
  void log(const std::string& name, const torch::Tensor& value, const LogOptions&) override {
    values.emplace_back(name, value.item<double>());
  }
  std::vector<std::pair<std::string, double>> values;
};

Batch make_batch(int64_t n) {
  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({n, 6});
  return {x, x.sum(1, true) * 0.3};
}

std::vector<torch::Tensor> gradients(Net& net) {
  std::vector<torch::Tensor> out;
  for (const auto& p : net.parameters()) {
    out.push_back(p.grad().clone());
    p.mutable_grad().zero_();
  }
  return out;
}

TEST(SplitBatch, PiecesAreConsecutiveChunksLikeTorchChunk) {
  const Batch batch{torch::arange(10).unsqueeze(1), torch::arange(10)};
  const auto pieces = split_batch(batch, 4);
  ASSERT_EQ(pieces.size(), 4u);
  EXPECT_EQ(pieces[0].data.size(0), 3);
  EXPECT_EQ(pieces[3].data.size(0), 1);
  EXPECT_EQ(pieces[3].target[0].item<int64_t>(), 9);
  EXPECT_EQ(split_batch(batch, 20).size(), 10u);  // never an empty piece
  EXPECT_EQ(split_batch(batch, 1).size(), 1u);
}

TEST(SplitBatch, EveryNamedTensorAndListIsSplitWithItsExamples) {
  Batch batch;
  batch.tensors["ids"] = torch::arange(10).unsqueeze(1);
  batch.tensors["mask"] = torch::arange(10) % 2;
  for (int64_t i = 0; i < 10; ++i) batch.lists["boxes"].push_back(torch::full({i, 4}, i));
  const auto pieces = split_batch(batch, 3);  // 4 + 4 + 2
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[2].at("ids")[0].item<int64_t>(), 8);
  EXPECT_EQ(pieces[2].at("mask").size(0), 2);
  ASSERT_EQ(pieces[1].list("boxes").size(), 4u);
  EXPECT_EQ(pieces[1].list("boxes")[0].size(0), 4) << "example 4's boxes go with example 4";

  batch.tensors["mask"] = torch::ones({3});
  try {
    split_batch(batch, 2);
    FAIL() << "a tensor without the batch dimension must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'mask' has shape [3] while the batch has 10 examples"), std::string::npos)
        << e.what();
  }
}

TEST(DataParallel, GradientsEqualThoseOfTheWholeBatch) {
  Net net;
  RecordingSink sink;
  const MetricSinkScope net_sink(net, &sink);
  const Batch batch = make_batch(10);  // 3 + 3 + 3 + 1: unequal pieces are weighted by size
  const torch::Tensor whole = net.training_step(batch, 0);
  whole.backward();
  const auto expected = gradients(net);
  const torch::Tensor loss = DataParallel({.replicas = 4}).training_step(net, batch, 0);
  EXPECT_NEAR(loss.item<double>(), whole.item<double>(), 1e-6);
  loss.backward();
  const auto actual = gradients(net);
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_TRUE(torch::allclose(actual[i], expected[i], 1e-5, 1e-7)) << i;
}

DataParallelOptions copies_on_cpu(int64_t replicas) {
  return {.replicas = replicas, .devices = std::vector<c10::Device>(static_cast<size_t>(replicas), torch::kCPU)};
}

/// Checks that a step of 8 examples over `options`' replicas logs each value once, combined.
void expect_replicas_log_once(const DataParallelOptions& options) {
  Net net;
  RecordingSink sink;
  const MetricSinkScope net_sink(net, &sink);
  const Batch batch = make_batch(8);
  const double whole = net.training_step(batch, 0).item<double>();
  sink.values.clear();
  DataParallel(options).training_step(net, batch, 0);
  ASSERT_EQ(sink.values.size(), 2u);
  EXPECT_EQ(sink.values[0].first, "train/loss");
  EXPECT_NEAR(sink.values[0].second, whole, 1e-6);  // mean weighted by piece size (3, 3, 2)
  EXPECT_EQ(sink.values[1].first, "train/examples");
  EXPECT_EQ(sink.values[1].second, 8.0);  // reduce_fx sum adds the pieces
}

TEST(DataParallel, ReplicasLogOnceThroughTheModulesSink) { expect_replicas_log_once({.replicas = 3}); }

TEST(DataParallel, BuffersKeepTheRootReplicasUpdate) {
  Net net(/*batch_norm=*/true);
  RecordingSink sink;
  const MetricSinkScope net_sink(net, &sink);
  const Batch batch = make_batch(8);
  Net root(/*batch_norm=*/true);
  const MetricSinkScope root_sink(root, &sink);
  root.training_step(split_batch(batch, 2)[0], 0);
  DataParallel({.replicas = 2}).training_step(net, batch, 0);
  EXPECT_TRUE(torch::equal(net.norm->running_mean, root.norm->running_mean));
  EXPECT_EQ(net.norm->num_batches_tracked.item<int64_t>(), 1);
}

TEST(DataParallel, ModulesWithBuffersBackPropagateThroughEveryReplica) {
  // BatchNorm saves its running statistics for backward and updates them in place: a second
  // replica's forward pass must not fail the first replica's graph's in-place check.
  Net net(/*batch_norm=*/true);
  RecordingSink sink;
  const MetricSinkScope net_sink(net, &sink);
  const torch::Tensor loss = DataParallel({.replicas = 3}).training_step(net, make_batch(12), 0);
  EXPECT_NO_THROW(loss.backward());
  EXPECT_TRUE(net.hidden->weight.grad().defined());
}

TEST(DataParallel, AFailingReplicaThrowsOnTheCallingThread) {
  Net net;
  RecordingSink sink;
  const MetricSinkScope net_sink(net, &sink);
  net.fail_on_examples = 2;  // the last of 3 + 3 + 2
  EXPECT_THROW(DataParallel({.replicas = 3}).training_step(net, make_batch(8), 0), std::runtime_error);
}

TEST(DataParallel, ReplicasRunUnderTheCallersGradMode) {
  Net net;
  RecordingSink sink;
  const MetricSinkScope net_sink(net, &sink);
  torch::NoGradGuard no_grad;
  EXPECT_FALSE(DataParallel({.replicas = 2}).training_step(net, make_batch(8), 0).requires_grad());
}

TEST(DataParallelOptions, DefaultsAreTwoConcurrentReplicas) {
  const DataParallelOptions options;
  EXPECT_EQ(options.replicas, 2);
  EXPECT_FALSE(options.deterministic);
  EXPECT_TRUE(options.devices.empty());  // CPU threads over the module's own parameters
}

// ---- copies per device: the CUDA path, run here with every "device" on the CPU --------------

TEST(DataParallelCopies, GradientsFlowBackToTheModuleAndEqualTheWholeBatchsStepAfterStep) {
  Net net;
  Net reference;
  RecordingSink sink;
  const MetricSinkScope net_sink(net, &sink);
  const MetricSinkScope reference_sink(reference, &sink);
  DataParallel dp(copies_on_cpu(4));
  for (int step = 0; step < 3; ++step) {
    const Batch batch = make_batch(10 + step);
    const torch::Tensor whole = reference.training_step(batch, step);
    whole.backward();
    const auto expected = gradients(reference);
    const torch::Tensor loss = dp.training_step(net, batch, step);
    EXPECT_NEAR(loss.item<double>(), whole.item<double>(), 1e-6) << step;
    loss.backward();
    const auto actual = gradients(net);
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_TRUE(torch::allclose(actual[i], expected[i], 1e-5, 1e-7)) << "step " << step << ", tensor " << i;
    }
    // An optimizer step on the module only: the next step's copies must start from it.
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < expected.size(); ++i) {
      net.parameters()[i].sub_(0.1 * expected[i]);
      reference.parameters()[i].sub_(0.1 * expected[i]);
    }
  }
}

TEST(DataParallelCopies, DeterministicCopiesRunInOrderAndLogOnce) {
  DataParallelOptions options = copies_on_cpu(3);
  options.deterministic = true;
  expect_replicas_log_once(options);
}

TEST(DataParallelCopies, BuffersKeepTheRootReplicasUpdate) {
  Net net(/*batch_norm=*/true);
  Net root(/*batch_norm=*/true);
  RecordingSink sink;
  const MetricSinkScope net_sink(net, &sink);
  const MetricSinkScope root_sink(root, &sink);
  const Batch batch = make_batch(8);
  root.training_step(split_batch(batch, 2)[0], 0);
  const torch::Tensor loss = DataParallel(copies_on_cpu(2)).training_step(net, batch, 0);
  EXPECT_NO_THROW(loss.backward());
  EXPECT_TRUE(torch::equal(net.norm->running_mean, root.norm->running_mean));
  EXPECT_EQ(net.norm->num_batches_tracked.item<int64_t>(), 1);
}

/// The error of a step of `net` over two copies.
std::string copies_error(Net& net) {
  RecordingSink sink;
  const MetricSinkScope net_sink(net, &sink);
  return testing::error_message([&] { DataParallel(copies_on_cpu(2)).training_step(net, make_batch(8), 0); });
}

TEST(DataParallelCopies, AModuleWithoutMakeReplicaIsToldHowToProvideOne) {
  Net net;
  net.replicable = false;
  const std::string message = copies_error(net);
  EXPECT_NE(message.find("make_replica() returned nullptr"), std::string::npos) << message;
  EXPECT_NE(message.find("strategy='ddp'"), std::string::npos) << message;
}

TEST(DataParallelCopies, ACopyOfAnotherArchitectureIsRefusedNamingTheTensor) {
  struct Mismatched : Net {
    std::shared_ptr<LightningModule> make_replica() const override {
      return std::make_shared<Net>(/*batch_norm=*/true);
    }
  } net;
  const std::string message = copies_error(net);
  EXPECT_NE(message.find("parameters differ from the module's at position 4"), std::string::npos) << message;
  EXPECT_NE(message.find("'norm.weight' [5]"), std::string::npos) << message;
}

TEST(DataParallelCopies, AFailingCopyThrowsOnTheCallingThread) {
  Net net;
  RecordingSink sink;
  const MetricSinkScope net_sink(net, &sink);
  net.fail_on_examples = 2;  // the last of 3 + 3 + 2, run by a copy
  EXPECT_THROW(DataParallel(copies_on_cpu(3)).training_step(net, make_batch(8), 0), std::runtime_error);
}

}  // namespace
}  // namespace volt
