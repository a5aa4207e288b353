// The GPT's architecture: GPT-2's parameter count and names, the tied head, causality, the loss
// against a hand computation, activation checkpointing, and the refused inputs and configs.
#include "gpt/gpt_model.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "volt/core/testing.h"

namespace gpt {
namespace {

// 2 layers, 2 heads, 32 wide, 64 positions, vocabulary 100.
GptConfig small_config() {
  return GptConfig{.n_layer = 2, .n_head = 2, .n_embd = 32, .n_positions = 64, .vocab_size = 100};
}

Gpt small_model(GptConfig config = small_config()) {
  torch::manual_seed(0);
  return Gpt(config);
}

void expect_error(const std::function<void()>& call, const std::vector<std::string>& parts) {
  const std::string message = volt::testing::error_message(call);
  for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
}

TEST(Gpt, HasGpt2sParameterCount) {
  Gpt model = small_model();
  int64_t count = 0;
  for (const torch::Tensor& p : model->parameters()) count += p.numel();
  // V E + P E + L (12 E^2 + 13 E) + 2 E = 3200 + 2048 + 2 (12288 + 416) + 64.
  EXPECT_EQ(count, 30720);
  EXPECT_EQ(small_config().parameter_count(), 30720);
  // GPT-2 small, as Hugging Face counts it.
  EXPECT_EQ(GptConfig{}.parameter_count(), 124439808);
}

TEST(Gpt, NamesItsParametersAsHuggingFacesGpt2) {
  Gpt model = small_model();
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& item : model->named_parameters()) shapes[item.key()] = item.value().sizes().vec();
  const std::map<std::string, std::vector<int64_t>> block = {{"ln_1.weight", {32}},
                                                             {"ln_1.bias", {32}},
                                                             {"attn.c_attn.weight", {96, 32}},
                                                             {"attn.c_attn.bias", {96}},
                                                             {"attn.c_proj.weight", {32, 32}},
                                                             {"attn.c_proj.bias", {32}},
                                                             {"ln_2.weight", {32}},
                                                             {"ln_2.bias", {32}},
                                                             {"mlp.c_fc.weight", {128, 32}},
                                                             {"mlp.c_fc.bias", {128}},
                                                             {"mlp.c_proj.weight", {32, 128}},
                                                             {"mlp.c_proj.bias", {32}}};
  std::map<std::string, std::vector<int64_t>> expected = {
      {"wte.weight", {100, 32}}, {"wpe.weight", {64, 32}}, {"ln_f.weight", {32}}, {"ln_f.bias", {32}}};
  for (int layer = 0; layer < 2; ++layer) {
    for (const auto& [name, shape] : block) expected["h." + std::to_string(layer) + "." + name] = shape;
  }
  EXPECT_EQ(shapes, expected);
}

TEST(Gpt, IsInitialisedAsGpt2) {
  Gpt model = small_model(GptConfig{.n_layer = 8, .n_head = 2, .n_embd = 64, .n_positions = 64, .vocab_size = 100});
  for (const auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    const torch::Tensor& p = item.value();
    if (name.ends_with(".bias")) {
      EXPECT_EQ(p.abs().max().item<double>(), 0) << name;
    } else if (p.dim() == 1) {
      EXPECT_TRUE(torch::equal(p, torch::ones_like(p))) << name;
    } else {
      // 0.02 / sqrt(2 * 8 layers) = 0.005 for the residual projections.
      const double expected = name.ends_with("c_proj.weight") ? 0.005 : 0.02;
      EXPECT_NEAR(p.std().item<double>(), expected, 0.1 * expected) << name;
    }
  }
}

TEST(Gpt, ItsHeadIsTheTokenEmbedding) {
  Gpt model = small_model();
  for (const auto& item : model->named_parameters()) EXPECT_EQ(item.key().find("lm_head"), std::string::npos);
  const torch::Tensor idx = torch::randint(100, {2, 10}, torch::kLong);
  {
    torch::NoGradGuard no_grad;
    model->wte->weight[7].zero_();
  }
  // A zero row of wte gives its token a zero logit everywhere: the head reads wte's storage.
  const torch::Tensor logits = model->forward(idx);
  ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{2, 10, 100}));
  EXPECT_EQ(logits.select(2, 7).abs().max().item<double>(), 0);
  EXPECT_GT(logits.select(2, 8).abs().max().item<double>(), 0);
}

TEST(Gpt, ALaterTokenDoesNotChangeEarlierLogits) {
  Gpt model = small_model();
  model->eval();
  const torch::Tensor idx = torch::randint(100, {2, 16}, torch::kLong);
  const torch::Tensor changed = idx.clone();
  changed.select(1, 9).remainder_(99).add_(1);  // a different token at position 9 (t + 1 for t = 8)
  const torch::Tensor before = model->forward(idx), after = model->forward(changed);
  EXPECT_TRUE(torch::allclose(before.narrow(1, 0, 9), after.narrow(1, 0, 9), 0, 1e-6));
  EXPECT_FALSE(torch::allclose(before.narrow(1, 9, 7), after.narrow(1, 9, 7), 0, 1e-3));
}

TEST(Gpt, LmLossIsTheMeanCrossEntropyOfTheNextTokens) {
  Gpt model = small_model();
  const torch::Tensor idx = torch::randint(100, {3, 12}, torch::kLong);
  const torch::Tensor logits = model->forward(idx);
  double sum = 0;
  for (int64_t b = 0; b < 3; ++b) {
    for (int64_t t = 0; t + 1 < 12; ++t) {
      const torch::Tensor log_probs = torch::log_softmax(logits[b][t].to(torch::kDouble), 0);
      sum -= log_probs[idx[b][t + 1].item<int64_t>()].item<double>();
    }
  }
  EXPECT_NEAR(lm_loss(logits, idx).item<double>(), sum / (3 * 11), 1e-5);
  // The training form: inputs idx[:, :-1], targets idx[:, 1:].
  const torch::Tensor shifted = next_token_loss(model->forward(idx.narrow(1, 0, 11)), idx.narrow(1, 1, 11));
  EXPECT_NEAR(shifted.item<double>(), sum / (3 * 11), 1e-5);
  // An untrained model is close to uniform: ln(100).
  EXPECT_NEAR(shifted.item<double>(), std::log(100.0), 0.2);
}

TEST(Gpt, ActivationCheckpointingGivesTheSameGradientsWithDropout) {
  GptConfig config = small_config();
  config.embd_pdrop = config.attn_pdrop = config.resid_pdrop = 0.1;
  const torch::Tensor idx = torch::randint(100, {2, 16}, torch::kLong);
  std::vector<std::vector<torch::Tensor>> grads;
  for (bool checkpointing : {false, true}) {
    config.activation_checkpointing = checkpointing;
    Gpt model = small_model(config);
    torch::manual_seed(1);  // the same dropout masks
    lm_loss(model->forward(idx), idx).backward();
    grads.emplace_back();
    for (const torch::Tensor& p : model->parameters()) grads.back().push_back(p.grad().clone());
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_TRUE(torch::allclose(grads[0][i], grads[1][i], 1e-5, 1e-6)) << i;
}

TEST(Gpt, BlocksInFsdpUnitsKeepTheNamesTheWeightsAndTheOutput) {
  // full_shard's per-block wrapping must not change what a checkpoint or a Hugging Face file holds.
  GptConfig config = small_config();
  Gpt plain = small_model(config);
  config.fsdp_units = true;
  Gpt wrapped = small_model(config);
  EXPECT_NE(wrapped->h->ptr(0)->name().find("FsdpUnit"), std::string::npos) << wrapped->h->ptr(0)->name();
  const auto expected = plain->named_parameters();
  const auto actual = wrapped->named_parameters();
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(actual[i].key(), expected[i].key());
    EXPECT_TRUE(torch::equal(actual[i].value(), expected[i].value())) << expected[i].key();
  }
  const torch::Tensor idx = torch::randint(100, {2, 16}, torch::kLong);
  EXPECT_TRUE(torch::equal(wrapped->forward(idx), plain->forward(idx)));
}

TEST(Gpt, RefusesTokensOutsideTheVocabularyAndContext) {
  Gpt model = small_model();
  torch::Tensor idx = torch::zeros({2, 5}, torch::kLong);
  idx[1][3] = 100;
  expect_error([&] { model->forward(idx); }, {"token id 100 at [1, 3]", "vocab_size=100", "HINT"});
  idx[1][3] = -1;
  expect_error([&] { model->forward(idx); }, {"token id -1 at [1, 3]", "HINT"});
  expect_error(
      [&] {
        model->forward(torch::zeros({1, 65}, torch::kLong));
      },
      {"65 tokens exceed the model's context of n_positions=64", "HINT"});
  expect_error([&] { model->forward(torch::zeros({1, 5})); }, {"int64", "HINT"});
}

TEST(GptConfig, RefusesSizesThatDoNotFit) {
  expect_error([] { GptConfig{.n_head = 5, .n_embd = 32}.validate(); },
               {"n_embd=32 is not divisible by n_head=5", "n_head=4 for n_embd=32", "HINT"});
  expect_error([] { GptConfig{.n_layer = 0}.validate(); }, {"n_layer=0 must be at least 1", "HINT"});
  expect_error([] { GptConfig{.attn_pdrop = 1.0}.validate(); }, {"attn_pdrop=1 must be in [0, 1)"});
}

// What Hugging Face's gpt2/config.json holds (the fields that matter here).
const char* kGpt2Config = R"({
  "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
  "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
  "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "vocab_size": 50257
})";

TEST(GptConfig, ReadsAHuggingFaceConfig) {
  const GptConfig config = load_hf_config(volt::testing::write_scratch_file("config.json", kGpt2Config));
  EXPECT_EQ(config.n_layer, 12);
  EXPECT_EQ(config.n_head, 12);
  EXPECT_EQ(config.n_embd, 768);
  EXPECT_EQ(config.n_positions, 1024);
  EXPECT_EQ(config.vocab_size, 50257);
  EXPECT_EQ(config.attn_pdrop, 0.1);
  EXPECT_EQ(config.layer_norm_epsilon, 1e-5);
  EXPECT_FALSE(config.activation_checkpointing);
}

TEST(GptConfig, RefusesAHuggingFaceConfigThatDisagrees) {
  const auto with = [](const std::string& key, const nlohmann::json& value) {
    nlohmann::json json = nlohmann::json::parse(kGpt2Config);
    json[key] = value;
    return json;
  };
  expect_error([&] { parse_hf_config(with("n_head", 7), "gpt2/config.json"); },
               {"gpt2/config.json: n_embd=768 is not divisible by n_head=7", "HINT"});
  expect_error([&] { parse_hf_config(with("n_layer", "12")); }, {"\"n_layer\" is \"12\", expected an integer", "HINT"});
  expect_error([&] { parse_hf_config(with("activation_function", "relu")); },
               {"\"activation_function\" is \"relu\"", "gelu_new", "HINT"});
  expect_error([&] { parse_hf_config(with("tie_word_embeddings", false)); },
               {"\"tie_word_embeddings\" is false, but this GPT-2 implements only true", "HINT"});
  expect_error([&] { parse_hf_config(with("n_inner", 1000)); }, {"\"n_inner\" is 1000", "3072", "HINT"});
  expect_error([&] { parse_hf_config(with("model_type", "llama")); }, {"\"model_type\" is \"llama\"", "HINT"});
  expect_error([] { load_hf_config("/nonexistent/config.json"); }, {"cannot read /nonexistent/config.json", "HINT"});
  expect_error([] { load_hf_config(volt::testing::write_scratch_file("bad.json", "{ nope")); },
               {"is not valid JSON", "HINT"});
}

}  // namespace
}  // namespace gpt
