// volt::scaled_dot_product_attention against the formula written out here (so that on LibTorch 2.x
// the fused kernel is checked against it too): equal values and gradients, causality, dtypes and
// the refused shapes.
#include "volt/nn/attention.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>

#include "volt/core/testing.h"
#include "volt/nn/attention_compat.h"

namespace volt {
namespace {

// softmax(q kᵀ / sqrt(d)) v in float64, the causal mask by masked_fill.
torch::Tensor reference(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool causal) {
  const torch::Tensor qd = q.to(torch::kDouble), kd = k.to(torch::kDouble), vd = v.to(torch::kDouble);
  torch::Tensor scores = torch::matmul(qd, kd.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  if (causal) {
    const torch::Tensor later = torch::ones({q.size(-2), k.size(-2)}, torch::kBool).triu(1);
    scores = scores.masked_fill(later, -std::numeric_limits<double>::infinity());
  }
  return torch::matmul(torch::softmax(scores, -1), vd);
}

struct Inputs {
  torch::Tensor q, k, v;
};

// [batch 2, heads 3, seq 7, head_dim 8], from a seed of its own.
Inputs random_inputs(bool requires_grad = false) {
  torch::manual_seed(0);
  Inputs in{torch::randn({2, 3, 7, 8}), torch::randn({2, 3, 7, 8}), torch::randn({2, 3, 7, 8})};
  for (torch::Tensor* t : {&in.q, &in.k, &in.v}) t->requires_grad_(requires_grad);
  return in;
}

TEST(ScaledDotProductAttention, EqualsTheFormulaWithAndWithoutTheCausalMask) {
  SCOPED_TRACE(compat::kFusedAttention ? "LibTorch's fused kernel" : "the plain formula");
  const Inputs in = random_inputs();
  for (bool causal : {false, true}) {
    const torch::Tensor out = scaled_dot_product_attention(in.q, in.k, in.v, causal);
    ASSERT_EQ(out.sizes(), in.q.sizes());
    EXPECT_EQ(out.scalar_type(), torch::kFloat);
    const torch::Tensor expected = reference(in.q, in.k, in.v, causal);
    EXPECT_TRUE(torch::allclose(out.to(torch::kDouble), expected, 0, 1e-6))
        << "causal=" << causal << ": " << (out.to(torch::kDouble) - expected).abs().max().item<double>();
  }
}

TEST(ScaledDotProductAttention, ALaterPositionDoesNotChangeEarlierOutputs) {
  const Inputs in = random_inputs();
  const torch::Tensor before = scaled_dot_product_attention(in.q, in.k, in.v, /*causal=*/true);
  // Positions 4.. get other keys, values and queries: outputs 0..3 must stay exactly as they were.
  Inputs changed{in.q.clone(), in.k.clone(), in.v.clone()};
  for (torch::Tensor* t : {&changed.q, &changed.k, &changed.v}) t->narrow(2, 4, 3).normal_();
  const torch::Tensor after = scaled_dot_product_attention(changed.q, changed.k, changed.v, /*causal=*/true);
  EXPECT_TRUE(torch::equal(before.narrow(2, 0, 4), after.narrow(2, 0, 4)));
  EXPECT_FALSE(torch::allclose(before.narrow(2, 4, 3), after.narrow(2, 4, 3)));
  // Without the mask every output sees every position.
  const torch::Tensor open_before = scaled_dot_product_attention(in.q, in.k, in.v, /*causal=*/false);
  const torch::Tensor open_after = scaled_dot_product_attention(changed.q, changed.k, changed.v, /*causal=*/false);
  EXPECT_FALSE(torch::allclose(open_before.narrow(2, 0, 4), open_after.narrow(2, 0, 4)));
}

TEST(ScaledDotProductAttention, GradientsEqualTheFormulasAndStopAtTheMask) {
  const Inputs in = random_inputs(/*requires_grad=*/true);
  const torch::Tensor weights = torch::randn({2, 3, 7, 8}, torch::kDouble);
  (scaled_dot_product_attention(in.q, in.k, in.v, /*causal=*/true).to(torch::kDouble) * weights).sum().backward();
  Inputs ref = random_inputs(/*requires_grad=*/true);
  (reference(ref.q, ref.k, ref.v, /*causal=*/true) * weights).sum().backward();
  for (auto [got, want] : {std::pair{in.q, ref.q}, {in.k, ref.k}, {in.v, ref.v}}) {
    ASSERT_TRUE(got.grad().defined());
    EXPECT_GT(got.grad().abs().sum().item<double>(), 0);
    EXPECT_TRUE(torch::allclose(got.grad().to(torch::kDouble), want.grad().to(torch::kDouble), 0, 1e-5))
        << (got.grad().to(torch::kDouble) - want.grad().to(torch::kDouble)).abs().max().item<double>();
  }
  // The first position's output depends on the first key and value only.
  Inputs first = random_inputs(/*requires_grad=*/true);
  scaled_dot_product_attention(first.q, first.k, first.v, /*causal=*/true).narrow(2, 0, 1).sum().backward();
  EXPECT_EQ(first.k.grad().narrow(2, 1, 6).abs().sum().item<double>(), 0);
  EXPECT_EQ(first.v.grad().narrow(2, 1, 6).abs().sum().item<double>(), 0);
}

TEST(ScaledDotProductAttention, KeepsTheInputsDtype) {
  const Inputs in = random_inputs();
  const torch::Tensor out = scaled_dot_product_attention(in.q.to(torch::kBFloat16), in.k.to(torch::kBFloat16),
                                                         in.v.to(torch::kBFloat16), /*causal=*/true);
  EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::allclose(out.to(torch::kDouble), reference(in.q, in.k, in.v, true), 0, 0.05));
}

TEST(ScaledDotProductAttention, DropoutDrawsFromTheDefaultGenerator) {
  const Inputs in = random_inputs();
  torch::manual_seed(5);
  const torch::Tensor a = scaled_dot_product_attention(in.q, in.k, in.v, true, 0.5);
  torch::manual_seed(5);
  const torch::Tensor b = scaled_dot_product_attention(in.q, in.k, in.v, true, 0.5);
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_FALSE(torch::allclose(a, scaled_dot_product_attention(in.q, in.k, in.v, true)));
}

TEST(ScaledDotProductAttention, RefusesShapesThatDoNotFit) {
  const torch::Tensor x = torch::randn({2, 3, 7, 8});
  const auto expect_refused = [](const std::function<void()>& call, const std::string& says) {
    const std::string message = testing::error_message(call);
    EXPECT_NE(message.find(says), std::string::npos) << message;
    EXPECT_NE(message.find("HINT"), std::string::npos) << message;
  };
  expect_refused(
      [&] {
        scaled_dot_product_attention(x, torch::randn({2, 3, 7, 4}), x, true);
      },
      "head_dim 8 differs from key's 4");
  expect_refused(
      [&] {
        scaled_dot_product_attention(x, x, torch::randn({2, 3, 5, 8}), true);
      },
      "key has 7 positions but value has 5");
  expect_refused(
      [&] {
        scaled_dot_product_attention(x, torch::randn({2, 4, 7, 8}), x, true);
      },
      "leading (batch, head) dimensions differ");
  expect_refused([&] { scaled_dot_product_attention(x.flatten(), x, x, true); }, "at least 2");
  expect_refused([&] { scaled_dot_product_attention(x, x, x, true, 1.0); }, "dropout_p=1 must be in [0, 1)");
}

}  // namespace
}  // namespace volt
