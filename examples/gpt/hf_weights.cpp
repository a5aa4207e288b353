#include "gpt/hf_weights.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
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

// The size keys that `directory`'s config.json leaves out, so GPT2Config's defaults (n_embd 768,
// ...) sized the model: a shape error names them, as the likely cause.
std::vector<std::string> defaulted_sizes(const std::string& directory) {
  std::ifstream in(fs::path(directory) / "config.json");
  const nlohmann::json json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  std::vector<std::string> absent;
  if (!json.is_object()) return absent;
  for (const char* key : {"n_layer", "n_head", "n_embd", "vocab_size"}) {
    if (!json.contains(key)) absent.emplace_back(key);
  }
  if (!json.contains("n_positions") && !json.contains("n_ctx")) absent.emplace_back("n_positions");
  return absent;
}

}  // namespace

bool is_conv1d_weight(const std::string& name) {
  for (const char* suffix : {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"}) {
    if (ends_with(name, suffix)) return true;
  }
  return false;
}

GptConfig load_hf_folder_config(const std::string& directory) {
  const fs::path config = fs::path(directory) / "config.json";
  VOLT_CHECK(!fs::is_regular_file(directory),
             "--init-from={} is a file; expected the folder holding config.json and model.safetensors. HINT: pass "
             "its folder: --init-from {}",
             directory, fs::path(directory).parent_path().empty() ? "." : fs::path(directory).parent_path().string());
  VOLT_CHECK(fs::is_regular_file(config),
             "{} has no config.json. HINT: pass a Hugging Face GPT-2 model folder, as save_pretrained writes it "
             "(config.json plus model.safetensors, or shards and model.safetensors.index.json).",
             directory);
  return load_hf_config(config.string());
}

HfWeights::HfWeights(Gpt& model, std::string directory) : directory_(std::move(directory)) {
  const std::string& dir = directory_;
  std::map<std::string, FolderTensor> tensors = tensors_by_model_name(dir);
  const GptConfig& config = model->config();
  const int64_t blocks = blocks_in(tensors);
  VOLT_CHECK(blocks <= config.n_layer,
             "{}: the weights hold {} blocks (h.0 .. h.{}), but config.json says n_layer={}. HINT: the config.json "
             "and the weights come from different models; save them together (save_pretrained).",
             dir, blocks, blocks - 1, config.n_layer);

  // Check everything before a parameter changes: a refused folder leaves the model as it was.
  std::vector<std::string> missing;
  for (auto& item : model->named_parameters()) {
    const auto it = tensors.find(item.key());
    if (it == tensors.end()) {
      missing.push_back(std::string(kPrefix) + item.key());
      continue;
    }
    const FolderTensor& tensor = it->second;
    check_dtype(dir, tensor);
    std::vector<int64_t> expected = item.value().sizes().vec();
    if (is_conv1d_weight(item.key())) std::reverse(expected.begin(), expected.end());
    if (tensor.location.info.shape != expected) {
      const std::vector<std::string> absent = defaulted_sizes(dir);
      throw volt::Error(fmt::format(
          "{}: tensor '{}' in {} is {}, but the model that config.json describes ({}) needs {}{}{}. HINT: {}", dir,
          tensor.name, file_name(tensor.location), shape_text(tensor.location.info.shape), config_text(config),
          shape_text(expected), is_conv1d_weight(item.key()) ? " (a Conv1D weight, [in, out])" : "",
          absent.empty() ? ""
                         : fmt::format("; config.json has no {}, so GPT2Config's default{} sized the model",
                                       fmt::join(absent, ", "), absent.size() == 1 ? "" : "s"),
          absent.empty() ? "the config.json and the weights come from different models; save them together "
                           "(save_pretrained)."
                         : "write the missing sizes into config.json (save_pretrained writes them all)."));
    }
    parameters_.emplace(item.key(), Entry{tensor.name, tensor.location});
    bytes_total_ += static_cast<int64_t>(tensor.location.info.end - tensor.location.info.begin);
  }
  VOLT_CHECK(missing.empty(),
             "{}: the weights lack {} of the model's {} parameters, first '{}'. HINT: pass a complete GPT2LMHeadModel "
             "or GPT2Model folder; a sharded one needs every file its model.safetensors.index.json names.",
             dir, missing.size(), model->named_parameters().size(), missing.empty() ? "" : missing.front());

  std::vector<std::string> extra;
  for (const auto& [name, tensor] : tensors) {
    if (parameters_.count(name) == 0 && name != kLmHead && !is_mask_buffer(name)) extra.push_back(tensor.name);
  }
  VOLT_CHECK(extra.empty(),
             "{}: the weights hold {} tensor{} that GPT-2 has no place for, first '{}'. HINT: is this a GPT-2 "
             "(GPT2LMHeadModel) folder? Another architecture's weights do not load here.",
             dir, extra.size(), extra.size() == 1 ? "" : "s", extra.empty() ? "" : extra.front());

  const auto lm_head = tensors.find(kLmHead);
  if (lm_head != tensors.end()) {
    const FolderTensor& wte = tensors.at("wte.weight");
    check_dtype(dir, lm_head->second);
    const auto whole = [&](const FolderTensor& t) {
      bytes_read_ += static_cast<int64_t>(t.location.info.end - t.location.info.begin);
      return file(t.location.file).tensor(t.name).to(torch::kFloat);
    };
    const bool same = lm_head->second.location.info.shape == wte.location.info.shape &&
                      torch::equal(whole(lm_head->second), whole(wte));
    VOLT_CHECK(same,
               "{}: '{}' ({}) differs from '{}' ({}), but this GPT-2's output layer is its token embedding (tied). "
               "HINT: the checkpoint was trained with an untied head (tie_word_embeddings false) and computes "
               "something else here; fine-tune it tied, or drop lm_head.weight if it is a stale copy.",
               dir, lm_head->second.name, file_name(lm_head->second.location), wte.name, file_name(wte.location));
  }
}

const volt::SafetensorsFile& HfWeights::file(const std::string& path) {
  auto it = files_.find(path);
  if (it == files_.end()) it = files_.emplace(path, volt::SafetensorsFile::open(path)).first;
  return it->second;
}

at::Tensor HfWeights::read(const std::string& name, const std::vector<int64_t>& shape, int64_t begin, int64_t end) {
  const std::string key = starts_with(name, kPrefix) ? name.substr(std::string(kPrefix).size()) : name;
  const auto it = parameters_.find(key);
  VOLT_CHECK(it != parameters_.end(),
             "{}: asked for parameter '{}', which the GPT-2 these weights were checked against does not have. HINT: "
             "build the model from the same config.json before reading its weights.",
             directory_, name);
  const Entry& entry = it->second;
  const int64_t numel = c10::multiply_integers(shape);
  VOLT_CHECK(numel == c10::multiply_integers(entry.location.info.shape) && 0 <= begin && begin <= end && end <= numel,
             "{}: asked for elements [{}, {}) of '{}' as {}, but the file holds {} ({}). HINT: ask for a range "
             "within the parameter's shape.",
             directory_, begin, end, name, shape_text(shape), entry.name, shape_text(entry.location.info.shape));
  if (begin == end) return torch::empty({0});
  // The rows of the model's layout that hold the range; a Conv1D weight's are the file's columns.
  const int64_t row = shape.size() > 1 ? numel / shape[0] : 1;
  const int64_t first = begin / row;
  const int64_t last = (end + row - 1) / row;
  const volt::SafetensorsFile& source = file(entry.location.file);
  const at::Tensor rows = is_conv1d_weight(key) ? source.tensor(entry.name).narrow(1, first, last - first).t()
                          : shape.empty()       ? source.tensor(entry.name)
                                                : source.slice(entry.name, first, last);
  bytes_read_ += rows.numel() * static_cast<int64_t>(rows.element_size());
  return rows.to(torch::kFloat).contiguous().view({-1}).narrow(0, begin - first * row, end - begin);
}

void load_hf_weights(Gpt& model, const std::string& directory) {
  HfWeights weights(model, directory);
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    const std::vector<int64_t> shape = item.value().sizes().vec();
    item.value().copy_(weights.read(item.key(), shape, 0, item.value().numel()).view(item.value().sizes()));
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
