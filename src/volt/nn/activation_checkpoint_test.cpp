// volt::checkpoint against the same blocks run plainly: equal outputs and gradients (with
// dropout, whose masks must be replayed, and under autocast), no activations kept in the graph,
// the random stream left as it was, and the misuses refused.
#include "volt/nn/activation_checkpoint.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "volt/core/error.h"
#include "volt/core/testing.h"
#include "volt/precision/autocast_guard.h"

namespace volt {
namespace {

// A transformer-like block: two layers around GELU, with dropout.
struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    up = register_module("up", torch::nn::Linear(8, 32));
    down = register_module("down", torch::nn::Linear(32, 8));
    drop = register_module("drop", torch::nn::Dropout(0.3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x + drop(down(torch::gelu(up(x)))); }
  torch::nn::Linear up{nullptr}, down{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Block);

struct Result {
  torch::Tensor output;
  torch::Tensor input_grad;
  std::vector<torch::Tensor> param_grads;
  torch::Tensor next_random;  // the generator's next draw after backward
};

// Three blocks (the middle ones checkpointed when `checkpointed`), from seed 0.
Result run(bool checkpointed, std::optional<c10::ScalarType> autocast = std::nullopt) {
  torch::manual_seed(0);
  torch::nn::Sequential blocks{Block(), Block(), Block()};
  torch::Tensor x = torch::randn({4, 8}).requires_grad_(true);
  torch::Tensor h = x;
  {
    AutocastGuard guard = autocast ? AutocastGuard(c10::DeviceType::CPU, *autocast) : AutocastGuard();
    for (size_t i = 0; i < blocks->size(); ++i) {
      auto block = blocks->ptr<BlockImpl>(i);
      if (checkpointed && i >= 1) {
        h = checkpoint([block](const torch::Tensor& in) mutable { return block->forward(in); }, h);
      } else {
        h = block->forward(h);
      }
    }
  }
  Result r;
  r.output = h.detach().clone();
  h.to(torch::kFloat).pow(2).sum().backward();
  r.input_grad = x.grad().clone();
  for (const auto& p : blocks->parameters()) r.param_grads.push_back(p.grad().clone());
  r.next_random = torch::rand({3});
  return r;
}

void expect_equal(const Result& a, const Result& b, double tolerance) {
  EXPECT_TRUE(torch::allclose(a.output, b.output, 0, tolerance));
  EXPECT_TRUE(torch::allclose(a.input_grad, b.input_grad, 0, tolerance))
      << (a.input_grad - b.input_grad).abs().max().item<double>();
  ASSERT_EQ(a.param_grads.size(), b.param_grads.size());
  for (size_t i = 0; i < a.param_grads.size(); ++i) {
    EXPECT_TRUE(torch::allclose(a.param_grads[i], b.param_grads[i], 1e-6, tolerance))
        << "parameter " << i << ": " << (a.param_grads[i] - b.param_grads[i]).abs().max().item<double>();
  }
  EXPECT_TRUE(torch::equal(a.next_random, b.next_random)) << "the recomputation moved the random stream";
}

TEST(ActivationCheckpoint, GradientsEqualThePlainBlocksWithDropoutReplayed) {
  expect_equal(run(false), run(true), 1e-6);
}

TEST(ActivationCheckpoint, TheRecomputationRunsUnderTheFirstRunsAutocast) {
  // bf16 rounding differs from fp32 by far more than 1e-6: a recomputation in fp32 would show.
  const Result plain = run(false, at::kBFloat16);
  const Result checkpointed = run(true, at::kBFloat16);
  expect_equal(plain, checkpointed, 1e-6);
  EXPECT_FALSE(torch::allclose(plain.param_grads[0], run(false).param_grads[0], 0, 1e-4)) << "autocast changed nothing";
}

TEST(ActivationCheckpoint, TheGraphKeepsOnlyTheInputsNotTheActivations) {
  Block block;
  torch::Tensor x = torch::randn({2, 8}).requires_grad_(true);
  torch::Tensor before = x * 2;  // a node in front, so the edge is visible
  torch::Tensor y = checkpoint([block](const torch::Tensor& in) mutable { return block->forward(in); }, before);
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_EQ(y.grad_fn()->name(), "volt::CheckpointBackward");
  // The block's own operations (addmm, gelu, dropout) are not in the graph: the next node is the
  // multiplication in front of the block.
  ASSERT_EQ(y.grad_fn()->num_outputs(), 1u);
  EXPECT_EQ(y.grad_fn()->next_edges()[0].function, before.grad_fn());
}

TEST(ActivationCheckpoint, WithoutGradientsItIsThePlainCall) {
  Block block;
  const torch::NoGradGuard no_grad;
  int calls = 0;
  torch::Tensor y = checkpoint(
      [&calls, block](const torch::Tensor& in) mutable {
        ++calls;
        return block->forward(in);
      },
      torch::randn({2, 8}));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(y.grad_fn(), nullptr);
}

TEST(ActivationCheckpoint, AnInputChangedInPlaceBeforeBackwardIsRefused) {
  Block block;
  torch::Tensor x = torch::randn({2, 8}).requires_grad_(true);
  torch::Tensor h = x * 1;
  torch::Tensor y = checkpoint([block](const torch::Tensor& in) mutable { return block->forward(in); }, h);
  {
    const torch::NoGradGuard no_grad;
    h.add_(1);
  }
  const std::string message = testing::error_message<std::exception>([&] { y.sum().backward(); });
  EXPECT_NE(message.find("modified in place"), std::string::npos) << message;
}

TEST(ActivationCheckpoint, AnOutputThatIsItsInputGetsItsOwnHistory) {
  torch::Tensor x = torch::randn({3}).requires_grad_(true);
  torch::Tensor h = x * 3;
  std::vector<torch::Tensor> out = checkpoint(
      [](const std::vector<torch::Tensor>& in) {
        return std::vector<torch::Tensor>{in[0], in[0] * 2};
      },
      {h});
  (out[0] + out[1]).sum().backward();
  EXPECT_TRUE(torch::allclose(x.grad(), torch::full({3}, 9.0)));  // d/dx (3x + 6x)
}

}  // namespace
}  // namespace volt
