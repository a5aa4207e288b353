#include "gpt/hf_weights.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "volt/checkpoint/checkpoint_io.h"
#include "volt/core/error.h"

namespace gpt {

namespace {

namespace fs = std::filesystem;

constexpr const char* kPrefix = "transformer.";
constexpr const char* kLmHead = "lm_head.weight";
constexpr int64_t kEndOfText = 50256;

bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string shape_text(const std::vector<int64_t>& shape) { return c10::str(c10::IntArrayRef(shape)); }

// The file name of a location, for messages: the folder is named once by the caller.
std::string file_name(const volt::SafetensorsLocation& location) { return fs::path(location.file).filename().string(); }

// The attention-mask buffers older GPT2Model files carry: constants, not weights.
bool is_mask_buffer(const std::string& name) {
  static const std::regex pattern(R"(h\.\d+\.attn\.(bias|masked_bias))");
  return std::regex_match(name, pattern);
}

// A tensor of the folder under its Gpt name (the "transformer." prefix removed).
struct FolderTensor {
  std::string name;  // as the file names it
  volt::SafetensorsLocation location;
};

// The folder's tensors by Gpt name; lm_head.weight keeps its name. A name given both with and
// without the prefix is ambiguous: which one would load?
std::map<std::string, FolderTensor> tensors_by_model_name(const std::string& directory) {
  std::map<std::string, FolderTensor> out;
  for (auto& [name, location] : volt::read_safetensors_folder(directory)) {
    const std::string key = starts_with(name, kPrefix) ? name.substr(std::string(kPrefix).size()) : name;
    const auto [it, inserted] = out.emplace(key, FolderTensor{name, location});
    VOLT_CHECK(inserted,
               "{}: the weights hold both '{}' ({}) and '{}' ({}): the same parameter with and without the '{}' "
               "prefix. HINT: keep one of them; a GPT2LMHeadModel folder names every tensor 'transformer.<name>'.",
               directory, it->second.name, file_name(it->second.location), name, file_name(location), kPrefix);
  }
  return out;
}

// The tensor as it is stored, converted to fp32; refuses a dtype that is not floating point.
void check_dtype(const std::string& directory, const FolderTensor& tensor) {
  const c10::ScalarType dtype = tensor.location.info.dtype;
  const bool floating = dtype == c10::ScalarType::Float || dtype == c10::ScalarType::Half ||
                        dtype == c10::ScalarType::BFloat16 || dtype == c10::ScalarType::Double;
  VOLT_CHECK(floating,
             "{}: tensor '{}' in {} is {}, but GPT-2's weights load as floating point (F32, F16, BF16 or F64). HINT: "
             "save the model in float32 (model.float().save_pretrained(...)); quantized or FP8 checkpoints do not "
             "load here.",
             directory, tensor.name, file_name(tensor.location), tensor.location.info.dtype_name);
}

// The layer indices of the folder's block tensors, to name a config.json that has too few.
int64_t blocks_in(const std::map<std::string, FolderTensor>& tensors) {
  static const std::regex block(R"(h\.(\d+)\..*)");
  int64_t count = 0;
  for (const auto& [name, tensor] : tensors) {
    std::smatch match;
    if (std::regex_match(name, match, block)) count = std::max<int64_t>(count, std::stoll(match[1].str()) + 1);
  }
  return count;
}

std::string config_text(const GptConfig& c) {
  return fmt::format("n_layer={}, n_head={}, n_embd={}, n_positions={}, vocab_size={}", c.n_layer, c.n_head, c.n_embd,
                     c.n_positions, c.vocab_size);
}

// Reads a tensor of the folder as fp32, opening each file once.
class FolderReader {
 public:
  torch::Tensor read(const FolderTensor& tensor) {
    auto it = files_.find(tensor.location.file);
    if (it == files_.end()) {
      it = files_.emplace(tensor.location.file, volt::SafetensorsFile::open(tensor.location.file)).first;
    }
    return it->second.tensor(tensor.name).to(torch::kFloat);
  }

 private:
  std::map<std::string, volt::SafetensorsFile> files_;
};

}  // namespace

bool is_conv1d_weight(const std::string& name) {
  for (const char* suffix : {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"}) {
    if (ends_with(name, suffix)) return true;
  }
  return false;
}

GptConfig load_hf_folder_config(const std::string& directory) {
  const fs::path config = fs::path(directory) / "config.json";
  VOLT_CHECK(fs::is_regular_file(config),
             "{} has no config.json. HINT: pass a Hugging Face GPT-2 model folder, as save_pretrained writes it "
             "(config.json plus model.safetensors, or shards and model.safetensors.index.json).",
             directory);
  return load_hf_config(config.string());
}

void load_hf_weights(Gpt& model, const std::string& directory) {
  std::map<std::string, FolderTensor> tensors = tensors_by_model_name(directory);
  const GptConfig& config = model->config();
  const int64_t blocks = blocks_in(tensors);
  VOLT_CHECK(blocks <= config.n_layer,
             "{}: the weights hold {} blocks (h.0 .. h.{}), but config.json says n_layer={}. HINT: the config.json "
             "and the weights come from different models; save them together (save_pretrained).",
             directory, blocks, blocks - 1, config.n_layer);

  // Check everything before a parameter changes: a refused folder leaves the model as it was.
  std::vector<std::pair<torch::Tensor, const FolderTensor*>> plan;
  std::vector<std::string> missing;
  std::set<std::string> used;
  for (auto& item : model->named_parameters()) {
    const auto it = tensors.find(item.key());
    if (it == tensors.end()) {
      missing.push_back(std::string(kPrefix) + item.key());
      continue;
    }
    const FolderTensor& tensor = it->second;
    check_dtype(directory, tensor);
    std::vector<int64_t> expected = item.value().sizes().vec();
    if (is_conv1d_weight(item.key())) std::reverse(expected.begin(), expected.end());
    VOLT_CHECK(tensor.location.info.shape == expected,
               "{}: tensor '{}' in {} is {}, but the model that config.json describes ({}) needs {}{}. HINT: the "
               "config.json and the weights come from different models; save them together (save_pretrained).",
               directory, tensor.name, file_name(tensor.location), shape_text(tensor.location.info.shape),
               config_text(config), shape_text(expected),
               is_conv1d_weight(item.key()) ? " (a Conv1D weight, [in, out])" : "");
    plan.emplace_back(item.value(), &tensor);
    used.insert(item.key());
  }
  VOLT_CHECK(missing.empty(),
             "{}: the weights lack {} of the model's {} parameters, first '{}'. HINT: pass a complete GPT2LMHeadModel "
             "or GPT2Model folder; a sharded one needs every file its model.safetensors.index.json names.",
             directory, missing.size(), model->named_parameters().size(), missing.empty() ? "" : missing.front());

  std::vector<std::string> extra;
  for (const auto& [name, tensor] : tensors) {
    if (used.count(name) == 0 && name != kLmHead && !is_mask_buffer(name)) extra.push_back(tensor.name);
  }
  VOLT_CHECK(extra.empty(),
             "{}: the weights hold {} tensor{} that GPT-2 has no place for, first '{}'. HINT: is this a GPT-2 "
             "(GPT2LMHeadModel) folder? Another architecture's weights do not load here.",
             directory, extra.size(), extra.size() == 1 ? "" : "s", extra.empty() ? "" : extra.front());

  FolderReader reader;
  const auto lm_head = tensors.find(kLmHead);
  if (lm_head != tensors.end()) {
    const FolderTensor& wte = tensors.at("wte.weight");
    check_dtype(directory, lm_head->second);
    const bool same = lm_head->second.location.info.shape == wte.location.info.shape &&
                      torch::equal(reader.read(lm_head->second), reader.read(wte));
    VOLT_CHECK(same,
               "{}: '{}' ({}) differs from '{}' ({}), but this GPT-2's output layer is its token embedding (tied). "
               "HINT: the checkpoint was trained with an untied head (tie_word_embeddings false) and computes "
               "something else here; fine-tune it tied, or drop lm_head.weight if it is a stale copy.",
               directory, lm_head->second.name, file_name(lm_head->second.location), wte.name, file_name(wte.location));
  }

  torch::NoGradGuard no_grad;
  for (const auto& [param, tensor] : plan) {
    const torch::Tensor value = reader.read(*tensor);
    param.copy_(is_conv1d_weight(tensor->name) ? value.t() : value);
  }
}

volt::NamedTensors hf_state_dict(Gpt& model) {
  volt::NamedTensors out;
  for (const auto& item : model->named_parameters()) {
    torch::Tensor value = item.value().detach().to(torch::kCPU, torch::kFloat);
    if (is_conv1d_weight(item.key())) value = value.t();
    out.emplace_back(std::string(kPrefix) + item.key(), value.contiguous());
  }
  return out;
}

nlohmann::json hf_config_json(const GptConfig& config) {
  // GPT2Config's fields; what GPT2LMHeadModel computes with them is what Gpt computes.
  return {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"n_layer", config.n_layer},
      {"n_head", config.n_head},
      {"n_embd", config.n_embd},
      {"n_positions", config.n_positions},
      {"n_ctx", config.n_positions},
      {"n_inner", nullptr},
      {"vocab_size", config.vocab_size},
      {"activation_function", "gelu_new"},
      {"layer_norm_epsilon", config.layer_norm_epsilon},
      {"embd_pdrop", config.embd_pdrop},
      {"attn_pdrop", config.attn_pdrop},
      {"resid_pdrop", config.resid_pdrop},
      {"initializer_range", 0.02},
      {"scale_attn_weights", true},
      {"scale_attn_by_inverse_layer_idx", false},
      {"reorder_and_upcast_attn", false},
      {"add_cross_attention", false},
      {"tie_word_embeddings", true},
      {"use_cache", true},
      {"dtype", "float32"},
      // GPT-2's tokenizer begins and ends texts with <|endoftext|>, id 50256 (GPT2Config's default);
      // a smaller vocabulary (bytes) has no such token.
      {"bos_token_id", config.vocab_size > kEndOfText ? nlohmann::json(kEndOfText) : nlohmann::json(nullptr)},
      {"eos_token_id", config.vocab_size > kEndOfText ? nlohmann::json(kEndOfText) : nlohmann::json(nullptr)},
  };
}

void save_hf_pretrained(Gpt& model, const std::string& directory) {
  std::error_code error;
  fs::create_directories(directory, error);
  VOLT_CHECK(!error, "cannot create the folder {}: {}. HINT: check the path and its permissions.", directory,
             error.message());
  volt::save_safetensors_folder(directory, hf_state_dict(model), std::numeric_limits<int64_t>::max(),
                                {{"format", "pt"}});
  const std::string config = hf_config_json(model->config()).dump(2) + "\n";
  volt::write_file_atomically((fs::path(directory) / "config.json").string(),
                              [&](const volt::ByteSink& sink) { sink(config.data(), config.size()); });
}

}  // namespace gpt
