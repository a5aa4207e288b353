// generate(): seeded and repeatable, greedy at temperature 0, top-k respected, the context cropped,
// and the global random stream and the module's mode left alone.
#include "gpt/generate.h"

#include <gtest/gtest.h>

#include "volt/core/testing.h"

namespace gpt {
namespace {

// A random model over 50 tokens with a context of 8 (so cropping happens within a short test).
Gpt tiny_model() {
  torch::manual_seed(0);
  return Gpt(GptConfig{.n_layer = 2, .n_head = 2, .n_embd = 16, .n_positions = 8, .vocab_size = 50});
}

const torch::Tensor& prompt() {
  static const torch::Tensor tokens = torch::tensor({3, 14, 15, 9}, torch::kLong);
  return tokens;
}

// Greedy decoding written out: the argmax of the last position's logits, from the last 8 tokens.
torch::Tensor greedy_by_hand(Gpt& model, torch::Tensor tokens, int64_t steps) {
  torch::NoGradGuard no_grad;
  model->eval();
  for (int64_t i = 0; i < steps; ++i) {
    const int64_t length = tokens.size(0);
    const torch::Tensor window = tokens.narrow(0, std::max<int64_t>(0, length - 8), std::min<int64_t>(length, 8));
    const torch::Tensor next = model->forward(window.unsqueeze(0))[0][-1].argmax().reshape({1});
    tokens = torch::cat({tokens, next});
  }
  return tokens;
}

TEST(Generate, TheSameSeedGivesTheSameTokens) {
  Gpt model = tiny_model();
  const torch::Tensor a = generate(model, prompt(), {.max_new_tokens = 20, .seed = 1});
  const torch::Tensor b = generate(model, prompt(), {.max_new_tokens = 20, .seed = 1});
  const torch::Tensor c = generate(model, prompt(), {.max_new_tokens = 20, .seed = 2});
  ASSERT_EQ(a.sizes(), (std::vector<int64_t>{24}));
  EXPECT_TRUE(torch::equal(a.narrow(0, 0, 4), prompt()));
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_FALSE(torch::equal(a, c));
}

TEST(Generate, TemperatureZeroIsGreedyAndCropsTheContext) {
  Gpt model = tiny_model();
  // 4 + 12 tokens: the later ones are predicted from the last 8 only.
  const torch::Tensor greedy = generate(model, prompt(), {.max_new_tokens = 12, .temperature = 0});
  EXPECT_TRUE(torch::equal(greedy, greedy_by_hand(model, prompt(), 12)));
}

TEST(Generate, TopKOfOneIsGreedy) {
  Gpt model = tiny_model();
  const torch::Tensor greedy = generate(model, prompt(), {.max_new_tokens = 10, .temperature = 0});
  for (uint64_t seed : {0, 7}) {
    EXPECT_TRUE(torch::equal(generate(model, prompt(), {.max_new_tokens = 10, .top_k = 1, .seed = seed}), greedy));
  }
}

TEST(Generate, SamplesOnlyAmongTheTopK) {
  Gpt model = tiny_model();
  model->eval();
  const torch::Tensor allowed = std::get<1>(model->forward(prompt().unsqueeze(0))[0][-1].topk(3));
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const torch::Tensor next =
        generate(model, prompt(), {.max_new_tokens = 1, .temperature = 2, .top_k = 3, .seed = seed})[4];
    EXPECT_TRUE(allowed.eq(next).any().item<bool>()) << "seed " << seed << " drew " << next.item<int64_t>();
  }
}

TEST(Generate, LeavesTheGlobalGeneratorAndTheModulesModeAlone) {
  Gpt model = tiny_model();
  model->train();
  torch::manual_seed(3);
  const torch::Tensor expected = torch::rand({4});
  torch::manual_seed(3);
  generate(model, prompt(), {.max_new_tokens = 5, .seed = 9});
  EXPECT_TRUE(torch::equal(torch::rand({4}), expected));
  EXPECT_TRUE(model->is_training());
}

TEST(Generate, ContinuesEachRowOfABatch) {
  Gpt model = tiny_model();
  const torch::Tensor prompts = torch::stack({prompt(), prompt().flip(0)});
  const torch::Tensor out = generate(model, prompts, {.max_new_tokens = 6, .temperature = 0});
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{2, 10}));
  EXPECT_TRUE(torch::equal(out[0], greedy_by_hand(model, prompt(), 6)));
  EXPECT_TRUE(torch::equal(out[1], greedy_by_hand(model, prompt().flip(0), 6)));
}

TEST(Generate, RefusesBadPromptsAndOptions) {
  Gpt model = tiny_model();
  const auto message = [&](const torch::Tensor& p, const GenerateOptions& o) {
    return volt::testing::error_message([&] { generate(model, p, o); });
  };
  EXPECT_NE(message(torch::zeros({0}, torch::kLong), {}).find("T >= 1"), std::string::npos);
  EXPECT_NE(message(torch::zeros({3}), {}).find("int64"), std::string::npos);
  EXPECT_NE(message(prompt(), {.temperature = -1}).find("temperature=-1 must be >= 0"), std::string::npos);
  EXPECT_NE(message(prompt(), {.top_k = -2}).find("top_k=-2"), std::string::npos);
  EXPECT_NE(message(torch::tensor({60}, torch::kLong), {}).find("token id 60"), std::string::npos);
}

}  // namespace
}  // namespace gpt
