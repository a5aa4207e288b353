// Hugging Face GPT-2 folders in and out of gpt::Gpt, on tiny models written by Volt's own
// save_safetensors (tests/interop/test_gpt_hf_interop.py covers transformers' own files), and the
// token-file evaluation behind --eval-tokens.
#include "gpt/hf_weights.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "gpt/eval_tokens.h"
#include "volt/core/testing.h"

namespace gpt {
namespace {

namespace fs = std::filesystem;
using volt::testing::error_message;
using volt::testing::TempDir;

const GptConfig kTiny{.n_layer = 2, .n_head = 2, .n_embd = 8, .n_positions = 16, .vocab_size = 40};

Gpt tiny_model(uint64_t seed, GptConfig config = kTiny) {
  torch::manual_seed(seed);
  return Gpt(config);
}

// A folder as the hub has them: config.json and `tensors` in model.safetensors.
std::string write_folder(const TempDir& dir, const volt::NamedTensors& tensors, const GptConfig& config = kTiny) {
  const std::string folder = dir.file("hf");
  fs::create_directories(folder);
  std::ofstream(folder + "/config.json") << hf_config_json(config).dump();
  volt::save_safetensors(folder + "/model.safetensors", tensors, {{"format", "pt"}});
  return folder;
}

// `model`'s tensors as a file names them, each changed by `edit` (name, tensor) -> kept or not.
volt::NamedTensors edited(Gpt& model, const std::function<bool(std::string&, torch::Tensor&)>& edit) {
  volt::NamedTensors out;
  for (auto [name, tensor] : hf_state_dict(model)) {
    if (edit(name, tensor)) out.emplace_back(name, tensor);
  }
  return out;
}

void expect_same_parameters(Gpt& a, Gpt& b) {
  const auto left = a->named_parameters(), right = b->named_parameters();
  ASSERT_EQ(left.size(), right.size());
  for (const auto& item : left) EXPECT_TRUE(torch::equal(item.value(), right[item.key()])) << item.key();
}

TEST(HfWeights, ExportLaysOutGpt2LmHeadModelsNamesAndConv1dWeights) {
  TempDir dir;
  Gpt model = tiny_model(1);
  save_hf_pretrained(model, dir.file("out"));
  const volt::SafetensorsFile file = volt::SafetensorsFile::open(dir.file("out/model.safetensors"));
  EXPECT_EQ(file.metadata(), (volt::SafetensorsMetadata{{"format", "pt"}}));
  EXPECT_EQ(file.names().size(), model->named_parameters().size());
  EXPECT_FALSE(file.contains("lm_head.weight"));
  // Conv1D: [in, out], the transpose of the Linear's [out, in].
  EXPECT_EQ(file.info("transformer.h.1.attn.c_attn.weight").shape, (std::vector<int64_t>{8, 24}));
  EXPECT_EQ(file.info("transformer.h.0.mlp.c_proj.weight").shape, (std::vector<int64_t>{32, 8}));
  EXPECT_TRUE(torch::equal(file.tensor("transformer.h.0.mlp.c_fc.weight"),
                           model->named_parameters()["h.0.mlp.c_fc.weight"].t()));
  EXPECT_TRUE(torch::equal(file.tensor("transformer.wte.weight"), model->wte->weight));
  // The config reads back as the model's.
  const GptConfig config = load_hf_folder_config(dir.file("out"));
  EXPECT_EQ(config.n_layer, 2);
  EXPECT_EQ(config.n_embd, 8);
  EXPECT_EQ(config.n_positions, 16);
  EXPECT_EQ(config.vocab_size, 40);
  EXPECT_EQ(config.resid_pdrop, 0.0);
}

TEST(HfWeights, LoadsWhatItExportedIntoAnotherModel) {
  TempDir dir;
  Gpt source = tiny_model(1), target = tiny_model(2);
  save_hf_pretrained(source, dir.file("out"));
  load_hf_weights(target, dir.file("out"));
  expect_same_parameters(source, target);
  const torch::Tensor ids = torch::randint(40, {2, 16}, torch::kLong);
  EXPECT_TRUE(torch::allclose(source->forward(ids), target->forward(ids)));
  // Blocks in FsdpUnits (full_shard's wrapping) keep the names, so the same folder loads.
  GptConfig wrapped_config = kTiny;
  wrapped_config.fsdp_units = true;
  Gpt wrapped = tiny_model(3, wrapped_config);
  load_hf_weights(wrapped, dir.file("out"));
  expect_same_parameters(source, wrapped);
}

TEST(HfWeights, LoadsTheHubsVariantsAndHalfPrecision) {
  TempDir dir;
  Gpt source = tiny_model(1);
  // GPT2Model's names (no prefix), fp16, lm_head.weight and the old mask buffers.
  volt::NamedTensors tensors = edited(source, [](std::string& name, torch::Tensor& t) {
    name = name.substr(std::string("transformer.").size());
    t = t.to(torch::kHalf);
    return true;
  });
  tensors.emplace_back("lm_head.weight", source->wte->weight.detach().to(torch::kHalf));
  tensors.emplace_back("h.0.attn.bias", torch::ones({1, 1, 16, 16}).tril());
  tensors.emplace_back("h.1.attn.masked_bias", torch::tensor(-1e4));
  Gpt target = tiny_model(2);
  load_hf_weights(target, write_folder(dir, tensors));
  for (const auto& item : source->named_parameters()) {
    const torch::Tensor expected = item.value().to(torch::kHalf).to(torch::kFloat);
    EXPECT_TRUE(torch::equal(target->named_parameters()[item.key()], expected)) << item.key();
    EXPECT_EQ(target->named_parameters()[item.key()].scalar_type(), torch::kFloat);
  }
}

TEST(HfWeights, LoadsAShardedFolder) {
  TempDir dir;
  Gpt source = tiny_model(1), target = tiny_model(2);
  const std::string folder = dir.file("sharded");
  const auto files = volt::save_safetensors_folder(folder, hf_state_dict(source), /*max_shard_bytes=*/2000);
  ASSERT_GT(files.size(), 2u);
  std::ofstream(folder + "/config.json") << hf_config_json(kTiny).dump();
  load_hf_weights(target, folder);
  expect_same_parameters(source, target);
}

// Each refusal names the tensor and its file, ends with a HINT and leaves the model as it was.
void expect_refused(const std::string& folder, const std::vector<std::string>& parts, GptConfig config = kTiny) {
  Gpt target = tiny_model(2, config), untouched = tiny_model(2, config);
  const std::string message = error_message([&] { load_hf_weights(target, folder); });
  for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
  EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
  expect_same_parameters(target, untouched);
}

TEST(HfWeights, RefusesMissingExtraMisshapenAndUntiedTensors) {
  TempDir dir;
  Gpt source = tiny_model(1);
  const auto without = [&](const std::string& dropped) {
    return edited(source, [&](std::string& name, torch::Tensor&) { return name != dropped; });
  };
  expect_refused(write_folder(dir, without("transformer.h.1.ln_2.bias")),
                 {"lack 1 of the model's 28 parameters", "'transformer.h.1.ln_2.bias'"});

  volt::NamedTensors extra = without("");
  extra.emplace_back("transformer.h.0.attn.q_proj.weight", torch::zeros({8, 8}));
  expect_refused(write_folder(dir, extra), {"'transformer.h.0.attn.q_proj.weight'", "no place for"});

  // A Linear-shaped (untransposed) Conv1D weight.
  volt::NamedTensors linear = edited(source, [](std::string& name, torch::Tensor& t) {
    if (name == "transformer.h.0.attn.c_attn.weight") t = t.t().contiguous();
    return true;
  });
  expect_refused(write_folder(dir, linear), {"'transformer.h.0.attn.c_attn.weight' in model.safetensors is [24, 8]",
                                             "needs [8, 24] (a Conv1D weight, [in, out])"});

  volt::NamedTensors untied = without("");
  untied.emplace_back("lm_head.weight", torch::zeros({40, 8}));
  expect_refused(write_folder(dir, untied), {"'lm_head.weight' (model.safetensors) differs from", "tied"});

  volt::NamedTensors both = without("");
  both.emplace_back("wpe.weight", source->wpe->weight.detach().clone());
  expect_refused(write_folder(dir, both), {"both 'transformer.wpe.weight'", "and 'wpe.weight'"});

  volt::NamedTensors integers = edited(source, [](std::string& name, torch::Tensor& t) {
    if (name == "transformer.ln_f.weight") t = t.to(torch::kInt);
    return true;
  });
  expect_refused(write_folder(dir, integers), {"'transformer.ln_f.weight' in model.safetensors is I32"});
}

TEST(HfWeights, RefusesAConfigThatDisagreesWithTheTensors) {
  TempDir dir;
  Gpt source = tiny_model(1);
  // The weights of a 2-layer model under a config.json of 1 layer, and of another width.
  GptConfig fewer = kTiny;
  fewer.n_layer = 1;
  expect_refused(write_folder(dir, hf_state_dict(source), fewer), {"hold 2 blocks", "n_layer=1"}, fewer);
  GptConfig wider = kTiny;
  wider.vocab_size = 41;
  expect_refused(write_folder(dir, hf_state_dict(source), wider),
                 {"'transformer.wte.weight' in model.safetensors is [40, 8]", "vocab_size=41", "needs [41, 8]"}, wider);
}

TEST(HfWeights, RefusesATruncatedFileAndAFolderWithoutConfig) {
  TempDir dir;
  Gpt source = tiny_model(1);
  const std::string folder = write_folder(dir, hf_state_dict(source));
  const std::string file = folder + "/model.safetensors";
  fs::resize_file(file, fs::file_size(file) - 100);
  expect_refused(folder, {"model.safetensors", "truncated"});
  fs::create_directories(dir.file("empty"));
  const std::string message = error_message([&] { load_hf_folder_config(dir.file("empty")); });
  EXPECT_NE(message.find("has no config.json. HINT:"), std::string::npos) << message;
}

TEST(HfWeights, NamesASizeKeyMissingFromConfigAPickleOnlyFolderAndAConfigGivenForItsFolder) {
  TempDir dir;
  Gpt source = tiny_model(1);
  const std::string folder = write_folder(dir, hf_state_dict(source));
  // config.json without n_embd: GPT2Config's default, 768, sizes the model, and the shapes disagree.
  nlohmann::json config = nlohmann::json::parse(std::ifstream(folder + "/config.json"));
  config.erase("n_embd");
  std::ofstream(folder + "/config.json") << config.dump();
  const GptConfig defaulted = load_hf_folder_config(folder);
  EXPECT_EQ(defaulted.n_embd, 768);
  Gpt target = tiny_model(2, defaulted);
  std::string message = error_message([&] { load_hf_weights(target, folder); });
  EXPECT_NE(message.find("config.json has no n_embd, so GPT2Config's default sized the model. HINT: write the "
                         "missing sizes into config.json"),
            std::string::npos)
      << message;
  // Only PyTorch's pickle: the hint converts it.
  fs::remove(folder + "/model.safetensors");
  std::ofstream(folder + "/pytorch_model.bin") << "pickle";
  expect_refused(folder, {"it holds pytorch_model.bin", "safe_serialization=True"});
  // The config.json where its folder belongs.
  message = error_message([&] { load_hf_folder_config(folder + "/config.json"); });
  EXPECT_NE(message.find("is a file; expected the folder holding config.json and model.safetensors. HINT: pass its "
                         "folder: --init-from " +
                         folder),
            std::string::npos)
      << message;
}

// A .npy file of `values` as numpy.save writes it, with element type `descr`.
template <typename T>
std::string write_npy(const TempDir& dir, const std::string& name, const std::string& descr,
                      const std::vector<T>& values) {
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + std::to_string(values.size()) + ",), }";
  header.append(64 - (10 + header.size() + 1) % 64, ' ');
  header += '\n';
  const std::string path = dir.file(name);
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  const auto length = static_cast<uint16_t>(header.size());
  out.put(static_cast<char>(length & 0xFF)).put(static_cast<char>(length >> 8));
  out << header;
  out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(T)));
  return path;
}

TEST(EvalTokens, ReadsInt32Int64AndUint16Ids) {
  TempDir dir;
  const torch::Tensor expected = torch::tensor({0, 7, 39, 40000, 65535}, torch::kLong);
  EXPECT_TRUE(
      torch::equal(read_token_ids(write_npy<uint16_t>(dir, "u2.npy", "<u2", {0, 7, 39, 40000, 65535})), expected));
  EXPECT_TRUE(
      torch::equal(read_token_ids(write_npy<int32_t>(dir, "i4.npy", "<i4", {0, 7, 39, 40000, 65535})), expected));
  EXPECT_TRUE(
      torch::equal(read_token_ids(write_npy<int64_t>(dir, "i8.npy", "<i8", {0, 7, 39, 40000, 65535})), expected));
  const std::string message = error_message([&] { read_token_ids(write_npy<float>(dir, "f4.npy", "<f4", {1.0F})); });
  EXPECT_NE(message.find("holds Float elements; expected token ids"), std::string::npos) << message;
}

TEST(EvalTokens, LossIsTheMeanOfLmLossOverWholeWindows) {
  Gpt model = tiny_model(1);
  model->train();
  const torch::Tensor tokens = torch::randint(40, {3 * 8 + 5}, torch::kLong);  // 5 tokens left over
  const TokenEvalResult result = evaluate_tokens(model, tokens, /*block_size=*/8, /*batch_size=*/2);
  EXPECT_EQ(result.windows, 3);
  EXPECT_EQ(result.predicted_tokens, 21);
  EXPECT_TRUE(model->is_training());
  model->eval();
  torch::NoGradGuard no_grad;
  const torch::Tensor windows = tokens.narrow(0, 0, 24).view({3, 8});
  EXPECT_NEAR(result.loss, lm_loss(model->forward(windows), windows).item<double>(), 1e-6);
}

TEST(EvalTokens, RefusesIdsOutsideTheVocabularyAndWindowsBeyondTheContext) {
  Gpt model = tiny_model(1);
  torch::Tensor tokens = torch::zeros({20}, torch::kLong);
  tokens[13] = 40;
  std::string message = error_message([&] { evaluate_tokens(model, tokens, 8); });
  EXPECT_NE(message.find("token id 40 at position 13 of the file is outside the model's vocabulary of vocab_size=40"),
            std::string::npos)
      << message;
  message = error_message([&] { evaluate_tokens(model, tokens, 17); });
  EXPECT_NE(message.find("--block-size=17 cannot cut evaluation windows for this model: expected 2..n_positions=16"),
            std::string::npos)
      << message;
  message = error_message([&] { evaluate_tokens(model, tokens.narrow(0, 0, 5), 8); });
  EXPECT_NE(message.find("5 token ids make no window of --block-size=8. HINT:"), std::string::npos) << message;
}

}  // namespace
}  // namespace gpt
