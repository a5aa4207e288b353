#include "volt/nn/sync_batch_norm.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "volt/base/testing_collectives.h"
#include "volt/core/error.h"

namespace volt {
namespace {

// ---------------------------------------------------------------------------------------------
// A world of ranks on threads of one process: what c10d does across processes, in memory.

// The meeting point of the ranks' threads (c10d's all-gather in memory).
using ThreadWorld = testing::ThreadGroup;

// One rank's Collectives over a ThreadWorld: all_reduce sums every rank's tensor in rank order,
// as Gloo's all-reduce does, and counts the calls.
class ThreadCollectives : public Collectives {
 public:
  ThreadCollectives(ThreadWorld& world, int64_t rank) : world_(world), rank_(rank) {}
  int64_t world_size() const override { return world_.size(); }
  int64_t rank() const override { return rank_; }
  void all_reduce(torch::Tensor& values, Reduce op) override {
    ++all_reduces;
    ASSERT_EQ(op, Reduce::kSum) << "SyncBatchNorm only sums";
    torch::Tensor total = torch::zeros_like(values);
    for (const torch::Tensor& each : world_.exchange(rank_, values)) total += each;
    values.copy_(total);
  }
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor) override {
    return all_gather_uneven(tensor, [&](const torch::Tensor& t) { return world_.exchange(rank_, t); });
  }
  int64_t all_reduces = 0;

 private:
  ThreadWorld& world_;
  int64_t rank_;
};

// A world of two where the peer has gone: each all_reduce from the `fail_from`-th on throws what
// Gloo throws when the other process died.
class BrokenCollectives : public Collectives {
 public:
  explicit BrokenCollectives(int64_t fail_from) : fail_from_(fail_from) {}
  int64_t world_size() const override { return 2; }
  int64_t rank() const override { return 0; }
  void all_reduce(torch::Tensor& values, Reduce) override {
    if (++calls_ >= fail_from_) throw std::runtime_error("Connection closed by peer [127.0.0.1]:29500");
    values.mul_(2);  // as if the peer held the same values
  }
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor) override { return {tensor, tensor}; }

 private:
  int64_t fail_from_;
  int64_t calls_ = 0;
};

// Runs `body(rank, collectives)` on one thread per rank; returns each rank's error ("" if none).
std::vector<std::string> run_ranks(int64_t ranks, const std::function<void(int64_t, ThreadCollectives&)>& body) {
  ThreadWorld world(ranks);
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      ThreadCollectives collectives(world, r);
      try {
        body(r, collectives);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return errors;
}

// ---------------------------------------------------------------------------------------------
// Helpers.

torch::nn::BatchNormOptions options_for(int64_t channels) { return torch::nn::BatchNormOptions(channels); }

// Both defined and bit for bit equal, or both undefined.
::testing::AssertionResult same_bits(const torch::Tensor& actual, const torch::Tensor& expected) {
  if (actual.defined() != expected.defined()) {
    return ::testing::AssertionFailure() << "defined: " << actual.defined() << " vs " << expected.defined();
  }
  if (!actual.defined() || torch::equal(actual, expected)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max difference " << (actual - expected).abs().max().item<double>();
}

// Close within `tolerance`, absolute and relative (torch::allclose), naming the worst difference.
::testing::AssertionResult close(const torch::Tensor& actual, const torch::Tensor& expected, double tolerance) {
  if (!actual.defined() || !expected.defined()) return ::testing::AssertionFailure() << "an undefined tensor";
  if (actual.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure() << "shape " << actual.sizes() << " vs " << expected.sizes();
  }
  if (actual.isnan().any().item<bool>()) return ::testing::AssertionFailure() << "NaN in " << actual;
  if (actual.numel() == 0 || torch::allclose(actual, expected, tolerance, tolerance)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "max difference " << (actual - expected).abs().max().item<double>() << " > "
                                       << tolerance;
}

// The same random weight and bias in `reference` (any torch::nn::BatchNorm*d) and `layer`, so
// that the affine part is exercised with values other than BatchNorm's 1 and 0.
template <typename Reference>
void share_random_affine(Reference& reference, SyncBatchNorm& layer) {
  if (!layer->options.affine()) return;
  torch::NoGradGuard no_grad;
  reference->weight.copy_(torch::rand_like(reference->weight) + 0.5);
  reference->bias.copy_(torch::randn_like(reference->bias));
  layer->weight.copy_(reference->weight);
  layer->bias.copy_(reference->bias);
}

std::vector<int64_t> with_batch(std::vector<int64_t> shape, int64_t batch) {
  shape[0] = batch;
  return shape;
}

// ---------------------------------------------------------------------------------------------
// Unsynchronized: BatchNorm, bit for bit.

// Trains `reference` and a SyncBatchNorm side by side for 3 steps, then evaluates both, and
// expects outputs, input/weight/bias gradients and running statistics to be bit-identical.
template <typename Reference>
void expect_bit_identical_to(Reference reference, const std::vector<int64_t>& shape,
                             const torch::nn::BatchNormOptions& options, Collectives* attached = nullptr) {
  torch::manual_seed(7);
  SyncBatchNorm layer(options);
  if (attached != nullptr) layer->attach_collectives(*attached);
  share_random_affine(reference, layer);
  for (const bool training : {true, true, true, false, false}) {
    reference->train(training);
    layer->train(training);
    const torch::Tensor x = torch::randn(shape) * 3 + 1;
    const torch::Tensor mix = torch::randn(shape);
    const torch::Tensor x_reference = x.clone().requires_grad_();
    const torch::Tensor x_layer = x.clone().requires_grad_();
    const torch::Tensor y_reference = reference(x_reference);
    const torch::Tensor y_layer = layer(x_layer);
    EXPECT_TRUE(same_bits(y_layer, y_reference)) << "output, training " << training;
    (y_reference * mix).sum().backward();
    (y_layer * mix).sum().backward();
    EXPECT_TRUE(same_bits(x_layer.grad(), x_reference.grad())) << "input gradient, training " << training;
    if (options.affine()) {
      EXPECT_TRUE(same_bits(layer->weight.grad(), reference->weight.grad())) << "weight gradient";
      EXPECT_TRUE(same_bits(layer->bias.grad(), reference->bias.grad())) << "bias gradient";
    }
    EXPECT_TRUE(same_bits(layer->running_mean, reference->running_mean)) << "running_mean";
    EXPECT_TRUE(same_bits(layer->running_var, reference->running_var)) << "running_var";
    EXPECT_TRUE(same_bits(layer->num_batches_tracked, reference->num_batches_tracked)) << "num_batches_tracked";
  }
}

// The option sets the unsynchronized tests cover: BatchNorm's defaults and each option changed.
std::vector<torch::nn::BatchNormOptions> option_sets(int64_t channels) {
  return {options_for(channels), options_for(channels).momentum(c10::nullopt), options_for(channels).affine(false),
          options_for(channels).track_running_stats(false), options_for(channels).eps(1e-3).momentum(0.3)};
}

TEST(SyncBatchNorm, UnsynchronizedItIsBitIdenticalToBatchNorm1dOnTwoAndThreeDimensionalInputs) {
  for (const auto& options : option_sets(3)) {
    expect_bit_identical_to(torch::nn::BatchNorm1d(options), {6, 3}, options);
    expect_bit_identical_to(torch::nn::BatchNorm1d(options), {6, 3, 5}, options);
  }
}

TEST(SyncBatchNorm, UnsynchronizedItIsBitIdenticalToBatchNorm2d) {
  for (const auto& options : option_sets(4))
    expect_bit_identical_to(torch::nn::BatchNorm2d(options), {5, 4, 3, 6}, options);
}

TEST(SyncBatchNorm, UnsynchronizedItIsBitIdenticalToBatchNorm3d) {
  for (const auto& options : option_sets(2)) {
    expect_bit_identical_to(torch::nn::BatchNorm3d(options), {3, 2, 3, 4, 2}, options);
  }
}

TEST(SyncBatchNorm, IsBitIdenticalToBatchNormInDoublePrecision) {
  torch::nn::BatchNorm2d reference(options_for(3));
  reference->to(torch::kDouble);
  // SyncBatchNorm converts like any module; the inputs must then be double too.
  const auto options = options_for(3);
  torch::manual_seed(1);
  SyncBatchNorm layer(options);
  layer->to(torch::kDouble);
  const torch::Tensor x = torch::randn({4, 3, 2, 2}, torch::kDouble);
  EXPECT_TRUE(same_bits(layer(x), reference(x)));
  EXPECT_TRUE(same_bits(layer->running_var, reference->running_var));
}

TEST(SyncBatchNorm, WithAOneProcessWorldAttachedItIsStillBitIdentical) {
  const auto options = options_for(4);
  expect_bit_identical_to(torch::nn::BatchNorm2d(options), {5, 4, 3, 3}, options, &local_collectives());
}

TEST(SyncBatchNorm, InEvalModeItCallsNoCollectiveAndUsesTheRunningStatistics) {
  // Any all_reduce would throw: eval mode must not synchronize, even in a world of two.
  BrokenCollectives broken(/*fail_from=*/1);
  const auto options = options_for(3);
  torch::nn::BatchNorm2d reference(options);
  SyncBatchNorm layer(options);
  layer->attach_collectives(broken);
  {
    torch::NoGradGuard no_grad;
    reference->running_mean.copy_(torch::tensor({0.5, -1.0, 2.0}));
    reference->running_var.copy_(torch::tensor({2.0, 0.25, 1.5}));
    layer->running_mean.copy_(reference->running_mean);
    layer->running_var.copy_(reference->running_var);
  }
  reference->eval();
  layer->eval();
  const torch::Tensor x = torch::randn({4, 3, 2, 2});
  EXPECT_TRUE(same_bits(layer(x), reference(x)));
}

// ---------------------------------------------------------------------------------------------
// Parameters, buffers, checkpoints.

std::vector<std::string> keys_of(const torch::nn::Module& module) {
  std::vector<std::string> keys;
  for (const auto& item : module.named_parameters()) keys.push_back("parameter " + item.key());
  for (const auto& item : module.named_buffers()) keys.push_back("buffer " + item.key());
  return keys;
}

TEST(SyncBatchNorm, HasBatchNorm2dsParametersAndBuffersUnderTheSameNames) {
  for (const auto& options : option_sets(4)) {
    EXPECT_EQ(keys_of(*SyncBatchNorm(options)), keys_of(*torch::nn::BatchNorm2d(options)));
  }
  EXPECT_EQ(keys_of(*SyncBatchNorm(options_for(4))),
            (std::vector<std::string>{"parameter weight", "parameter bias", "buffer running_mean", "buffer running_var",
                                      "buffer num_batches_tracked"}));
}

TEST(SyncBatchNorm, LoadsACheckpointOfBatchNorm2dAndEvaluatesAsIt) {
  torch::nn::BatchNorm2d trained(options_for(3));
  trained->weight.data().uniform_(0.5, 2);
  for (int i = 0; i < 3; ++i) trained(torch::randn({6, 3, 2, 2}) * 2 + 1);
  std::stringstream archive;
  torch::save(trained, archive);
  SyncBatchNorm loaded(options_for(3));
  torch::load(loaded, archive);
  EXPECT_EQ(loaded->num_batches_tracked.item<int64_t>(), 3);
  trained->eval();
  loaded->eval();
  const torch::Tensor x = torch::randn({2, 3, 2, 2});
  EXPECT_TRUE(same_bits(loaded(x), trained(x)));
}

TEST(SyncBatchNorm, PrintsItsOptions) {
  std::ostringstream text;
  text << *SyncBatchNorm(options_for(16).momentum(c10::nullopt));
  EXPECT_EQ(text.str(), "volt::SyncBatchNorm(16, eps=1e-05, momentum=None, affine=true, track_running_stats=true)");
}

TEST(SyncBatchNorm, InputsOfTheWrongRankOrChannelCountAreErrorsWithAHint) {
  SyncBatchNorm layer(options_for(3));
  try {
    layer(torch::randn({3}));
    ADD_FAILURE() << "expected a volt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1 dimension(s) (shape [3]); expected at least 2"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("HINT:"), std::string::npos) << e.what();
  }
  try {
    layer(torch::randn({2, 4, 5}));
    ADD_FAILURE() << "expected a volt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("input with 4 channels (shape [2, 4, 5]); expected 3"), std::string::npos)
        << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Synchronized: N ranks with parts of a batch equal one BatchNorm on the whole batch.

// Splits batches of `shape` (dimension 0 = the sum of `split`) over split.size() ranks for
// `steps` training steps, each rank's SyncBatchNorm on its rows, and expects the results of
// `reference` on the whole batch: each rank's output rows and input gradient rows, running
// statistics on every rank, and the weight and bias gradients summed over ranks (the loss is a
// sum, so ddp's average of them times the rank count). The loss weights each output by a random
// `mix`, so every row's gradient differs.
template <typename Reference>
void expect_split_matches_whole(Reference reference, const std::vector<int64_t>& shape,
                                const std::vector<int64_t>& split, torch::Dtype dtype, double tolerance,
                                const torch::nn::BatchNormOptions& options = options_for(3), int64_t steps = 2) {
  torch::manual_seed(3);
  reference->to(dtype);
  const auto ranks = static_cast<int64_t>(split.size());
  std::vector<SyncBatchNorm> layers;
  for (int64_t r = 0; r < ranks; ++r) {
    layers.emplace_back(options);
    layers.back()->to(dtype);
  }
  share_random_affine(reference, layers[0]);
  for (int64_t r = 1; r < ranks; ++r) {
    torch::NoGradGuard no_grad;
    if (options.affine()) {
      layers[r]->weight.copy_(layers[0]->weight);
      layers[r]->bias.copy_(layers[0]->bias);
    }
  }
  int64_t batch = 0;
  for (const int64_t rows : split) batch += rows;
  for (int64_t step = 0; step < steps; ++step) {
    // Far from zero mean, so a naive sum-of-squares variance would show its cancellation.
    const torch::Tensor x = torch::randn(with_batch(shape, batch), dtype) * 2 + 5;
    const torch::Tensor mix = torch::randn(with_batch(shape, batch), dtype);
    const torch::Tensor x_whole = x.clone().requires_grad_();
    reference->zero_grad();
    const torch::Tensor y_whole = reference(x_whole);
    (y_whole * mix).sum().backward();

    std::vector<torch::Tensor> outputs(split.size());
    std::vector<torch::Tensor> input_grads(split.size());
    const auto errors = run_ranks(ranks, [&](int64_t r, ThreadCollectives& collectives) {
      int64_t start = 0;
      for (int64_t before = 0; before < r; ++before) start += split[before];
      SyncBatchNorm& layer = layers[r];
      layer->attach_collectives(collectives);
      layer->zero_grad();
      const torch::Tensor x_rank = x.narrow(0, start, split[r]).clone().requires_grad_();
      const torch::Tensor y_rank = layer(x_rank);
      (y_rank * mix.narrow(0, start, split[r])).sum().backward();
      outputs[r] = y_rank.detach();
      input_grads[r] = x_rank.grad();
      EXPECT_EQ(collectives.all_reduces, 2) << "one all-reduce in forward and one in backward, rank " << r;
    });
    for (int64_t r = 0; r < ranks; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;

    int64_t start = 0;
    torch::Tensor weight_grad;
    torch::Tensor bias_grad;
    for (int64_t r = 0; r < ranks; ++r) {
      SCOPED_TRACE(::testing::Message() << "step " << step << ", rank " << r << " of split " << split.size());
      EXPECT_TRUE(close(outputs[r], y_whole.detach().narrow(0, start, split[r]), tolerance)) << "output";
      EXPECT_TRUE(close(input_grads[r], x_whole.grad().narrow(0, start, split[r]), tolerance)) << "input gradient";
      if (options.track_running_stats()) {
        EXPECT_TRUE(close(layers[r]->running_mean, reference->running_mean, tolerance)) << "running_mean";
        EXPECT_TRUE(close(layers[r]->running_var, reference->running_var, tolerance)) << "running_var";
        EXPECT_TRUE(same_bits(layers[r]->num_batches_tracked, reference->num_batches_tracked));
      }
      if (options.affine()) {
        weight_grad = r == 0 ? layers[r]->weight.grad().clone() : weight_grad + layers[r]->weight.grad();
        bias_grad = r == 0 ? layers[r]->bias.grad().clone() : bias_grad + layers[r]->bias.grad();
      }
      start += split[r];
    }
    if (options.affine()) {
      EXPECT_TRUE(close(weight_grad, reference->weight.grad(), tolerance)) << "weight gradient, summed over ranks";
      EXPECT_TRUE(close(bias_grad, reference->bias.grad(), tolerance)) << "bias gradient, summed over ranks";
    }
  }
}

// Float: the ranks sum in another order than one BatchNorm, so rounding differs (~1e-6).
constexpr double kFloatTolerance = 1e-5;
// Double: only rounding of the same sums in another order remains.
constexpr double kDoubleTolerance = 1e-10;

TEST(SyncBatchNorm, TwoRanksWithHalfABatchEachMatchOneBatchNormOnTheWholeBatch) {
  for (const torch::Dtype dtype : {torch::kFloat, torch::kDouble}) {
    const double tolerance = dtype == torch::kFloat ? kFloatTolerance : kDoubleTolerance;
    expect_split_matches_whole(torch::nn::BatchNorm1d(options_for(3)), {0, 3}, {8, 8}, dtype, tolerance);
    expect_split_matches_whole(torch::nn::BatchNorm1d(options_for(3)), {0, 3, 5}, {4, 4}, dtype, tolerance);
    expect_split_matches_whole(torch::nn::BatchNorm2d(options_for(3)), {0, 3, 4, 4}, {4, 4}, dtype, tolerance);
    expect_split_matches_whole(torch::nn::BatchNorm3d(options_for(3)), {0, 3, 2, 3, 3}, {2, 2}, dtype, tolerance);
  }
}

TEST(SyncBatchNorm, RanksWithDifferentBatchSizesMatchTheWholeBatchExactly) {
  expect_split_matches_whole(torch::nn::BatchNorm2d(options_for(3)), {0, 3, 4, 4}, {3, 5}, torch::kDouble,
                             kDoubleTolerance);
  expect_split_matches_whole(torch::nn::BatchNorm2d(options_for(3)), {0, 3, 4, 4}, {1, 2, 5}, torch::kFloat,
                             kFloatTolerance);
}

TEST(SyncBatchNorm, ARankWithAnEmptyBatchTakesPartWithoutNaNs) {
  // The close() checks reject NaN; the empty rank's own output and input gradient are empty.
  expect_split_matches_whole(torch::nn::BatchNorm2d(options_for(3)), {0, 3, 4, 4}, {6, 0}, torch::kDouble,
                             kDoubleTolerance);
  expect_split_matches_whole(torch::nn::BatchNorm1d(options_for(3)), {0, 3}, {0, 5, 3}, torch::kFloat, kFloatTolerance);
}

TEST(SyncBatchNorm, EveryOptionSetSynchronizesLikeBatchNorm) {
  for (const auto& options : option_sets(3)) {
    expect_split_matches_whole(torch::nn::BatchNorm2d(options), {0, 3, 2, 2}, {3, 5}, torch::kDouble, kDoubleTolerance,
                               options, /*steps=*/3);
  }
}

TEST(SyncBatchNorm, AnInputThatNeedsNoGradientSkipsTheBackwardCollective) {
  const auto errors = run_ranks(2, [](int64_t r, ThreadCollectives& collectives) {
    SyncBatchNorm layer(options_for(3));
    layer->attach_collectives(collectives);
    layer(torch::randn({4, 3}) + static_cast<double>(r)).sum().backward();
    EXPECT_EQ(collectives.all_reduces, 1);
    EXPECT_TRUE(layer->weight.grad().defined());
  });
  EXPECT_EQ(errors, (std::vector<std::string>{"", ""}));
}

TEST(SyncBatchNorm, OneValuePerChannelOverAllRanksIsAnErrorOnEveryRank) {
  // BatchNorm refuses one value per channel when training; synchronized, the count is global:
  // [1, 3] beside [1, 3] is fine, [1, 3] beside [0, 3] is not.
  const auto fine = run_ranks(2, [](int64_t, ThreadCollectives& collectives) {
    SyncBatchNorm layer(options_for(3));
    layer->attach_collectives(collectives);
    layer(torch::randn({1, 3}));
  });
  EXPECT_EQ(fine, (std::vector<std::string>{"", ""}));
  const auto errors = run_ranks(2, [](int64_t r, ThreadCollectives& collectives) {
    SyncBatchNorm layer(options_for(3));
    layer->attach_collectives(collectives);
    layer(torch::randn({1 - r, 3}));
  });
  for (const std::string& error : errors) {
    EXPECT_NE(error.find("1 value(s) per channel in this training batch over all 2 ranks"), std::string::npos) << error;
    EXPECT_NE(error.find("HINT:"), std::string::npos) << error;
  }
}

TEST(SyncBatchNorm, AFailedCollectiveNamesTheRankItWaitedForAndThePhase) {
  BrokenCollectives forward_fails(/*fail_from=*/1);
  SyncBatchNorm layer(options_for(3));
  layer->attach_collectives(forward_fails);
  try {
    layer(torch::randn({4, 3}));
    ADD_FAILURE() << "expected a volt::Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("rank 0 of 2: SyncBatchNorm's all-reduce of the batch statistics (forward) failed while "
                           "waiting for rank 1: Connection closed by peer"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
  }
  // The backward's failure comes out of the autograd engine, still naming its phase.
  BrokenCollectives backward_fails(/*fail_from=*/2);
  layer->attach_collectives(backward_fails);
  const torch::Tensor x = torch::randn({4, 3}, torch::requires_grad());
  const torch::Tensor y = layer(x);
  try {
    y.sum().backward();
    ADD_FAILURE() << "expected an error from backward";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("the gradient sums (backward) failed while waiting for rank 1"),
              std::string::npos)
        << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Finding the layers of a model.

struct Net : torch::nn::Module {
  Net() {
    features = register_module("features", torch::nn::Sequential(torch::nn::Conv2d(3, 4, 3), torch::nn::BatchNorm2d(4),
                                                                 SyncBatchNorm(options_for(4))));
    head_norm = register_module("head_norm", SyncBatchNorm(options_for(4)));
    plain = register_module("plain", torch::nn::BatchNorm1d(4));
  }
  torch::nn::Sequential features{nullptr};
  SyncBatchNorm head_norm{nullptr};
  torch::nn::BatchNorm1d plain{nullptr};
};

TEST(SyncBatchNorm, EnableAttachesEveryNestedLayerAndDisableDetachesThem) {
  // On the stack, as a LightningModule usually is: no shared_ptr owns the root.
  Net net;
  ThreadWorld world(2);
  ThreadCollectives collectives(world, 0);
  enable_sync_batchnorm(net, collectives);
  EXPECT_EQ(net.head_norm->collectives(), &collectives);
  EXPECT_EQ(net.features[2]->as<SyncBatchNormImpl>()->collectives(), &collectives);
  EXPECT_TRUE(net.head_norm->synchronized());
  disable_sync_batchnorm(net);
  EXPECT_EQ(net.head_norm->collectives(), nullptr);
  EXPECT_EQ(net.features[2]->as<SyncBatchNormImpl>()->collectives(), nullptr);
  // dp's replicas are clones: they share the attachment (one process group for all of them).
  net.head_norm->attach_collectives(collectives);
  const auto copy = std::dynamic_pointer_cast<SyncBatchNormImpl>(net.head_norm->clone());
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->collectives(), &collectives);
  EXPECT_EQ(keys_of(*copy), keys_of(*net.head_norm));
  // A one-process world attached is not synchronized.
  net.head_norm->attach_collectives(local_collectives());
  EXPECT_FALSE(net.head_norm->synchronized());
}

TEST(SyncBatchNorm, PlainBatchNormLayersAreFoundByPathAndTheMessageNamesThemWithAHint) {
  const Net net;
  const std::vector<std::string> paths = plain_batchnorm_paths(net);
  EXPECT_EQ(paths, (std::vector<std::string>{"features.1", "plain"}));
  EXPECT_EQ(plain_batchnorm_paths(*SyncBatchNorm(options_for(2))), std::vector<std::string>{});
  EXPECT_EQ(plain_batchnorm_paths(*torch::nn::BatchNorm3d(2)), std::vector<std::string>{""});

  const std::string message = plain_batchnorm_message(paths);
  EXPECT_NE(message.find("2 plain BatchNorm layer(s) that would stay unsynchronized: 'features.1', 'plain'"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("HINT: declare those layers as volt::SyncBatchNorm"), std::string::npos) << message;
  EXPECT_NE(plain_batchnorm_message({""}).find("(the model itself)"), std::string::npos);
}

}  // namespace
}  // namespace volt
