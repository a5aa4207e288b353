#include "gpt/gpt_model.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "volt/core/error.h"
#include "volt/nn/activation_checkpoint.h"
#include "volt/nn/attention.h"
#include "volt/strategies/fsdp_unit.h"

namespace gpt {

namespace {

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The largest divisor of `width` that is at most `heads`: a head count that fits.
int64_t fitting_heads(int64_t width, int64_t heads) {
  while (heads > 1 && width % heads != 0) --heads;
  return heads;
}

// json[key] as T when present; a value of another type is an error naming the key and the file.
template <typename T>
std::optional<T> field(const nlohmann::json& json, const char* key, const std::string& source) {
  const auto it = json.find(key);
  if (it == json.end() || it->is_null()) return std::nullopt;
  const bool fits = std::is_same_v<T, bool>       ? it->is_boolean()
                    : std::is_integral_v<T>       ? it->is_number_integer()
                    : std::is_floating_point_v<T> ? it->is_number()
                                                  : it->is_string();
  VOLT_CHECK(fits, "{}: \"{}\" is {}, expected {}. HINT: is this a Hugging Face GPT-2 config.json?", source, key,
             it->dump(),
             std::is_same_v<T, bool>       ? "true or false"
             : std::is_integral_v<T>       ? "an integer"
             : std::is_floating_point_v<T> ? "a number"
                                           : "a string");
  return it->get<T>();
}

// Refuses `key` unless it is absent or `expected` (a setting this model does not implement).
template <typename T>
void require(const nlohmann::json& json, const char* key, const T& expected, const std::string& source,
             const char* hint) {
  const std::optional<T> value = field<T>(json, key, source);
  VOLT_CHECK(!value || *value == expected, "{}: \"{}\" is {}, but this GPT-2 implements only {}. HINT: {}", source, key,
             nlohmann::json(*value).dump(), nlohmann::json(expected).dump(), hint);
}

// A block's output: h holds Blocks, or FsdpUnits over them (GptConfig::fsdp_units).
torch::Tensor run_block(torch::nn::Module& layer, const torch::Tensor& x) {
  if (auto* unit = dynamic_cast<volt::FsdpUnitImpl*>(&layer)) return unit->forward(x);
  return dynamic_cast<BlockImpl&>(layer).forward(x);
}

// Block `layer`'s output, recomputed in backward (volt::checkpoint) when `checkpointing` and a
// backward will follow.
torch::Tensor run_block(const std::shared_ptr<torch::nn::Module>& layer, const torch::Tensor& x, bool checkpointing) {
  if (!(checkpointing && layer->is_training() && torch::GradMode::is_enabled())) return run_block(*layer, x);
  // The block is captured by value: backward runs the function again, after the caller is gone.
  return volt::checkpoint([layer](const torch::Tensor& in) { return run_block(*layer, in); }, x);
}

// The Pipe's layers (GptConfig::pipelined) refer to the model's modules without registering them:
// the parameters stay the model's, under Hugging Face's names, and are counted once. Moving a
// layer (the pipeline puts each stage on its device) moves what it refers to.
class PipeLayer : public torch::nn::Module {
 public:
  explicit PipeLayer(std::vector<std::shared_ptr<torch::nn::Module>> parts) : parts_(std::move(parts)) {}
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking) override {
    for (const auto& part : parts_) part->to(device, dtype, non_blocking);
  }
  void to(torch::Dtype dtype, bool non_blocking) override {
    for (const auto& part : parts_) part->to(dtype, non_blocking);
  }
  void to(torch::Device device, bool non_blocking) override {
    for (const auto& part : parts_) part->to(device, non_blocking);
  }

 private:
  std::vector<std::shared_ptr<torch::nn::Module>> parts_;
};

// Token ids [B, T] -> the blocks' input [B, T, n_embd].
class EmbeddingsLayerImpl : public PipeLayer {
 public:
  EmbeddingsLayerImpl(torch::nn::Embedding wte, torch::nn::Embedding wpe, torch::nn::Dropout drop)
      : PipeLayer({wte.ptr(), wpe.ptr(), drop.ptr()}), wte_(wte), wpe_(wpe), drop_(drop) {}
  torch::Tensor forward(const torch::Tensor& idx) {
    return drop_(wte_(idx) + wpe_(torch::arange(idx.size(1), idx.options())));
  }

 private:
  torch::nn::Embedding wte_, wpe_;
  torch::nn::Dropout drop_;
};
TORCH_MODULE(EmbeddingsLayer);

// One block of h.
class BlockLayerImpl : public PipeLayer {
 public:
  BlockLayerImpl(std::shared_ptr<torch::nn::Module> block, bool checkpointing)
      : PipeLayer({block}), block_(std::move(block)), checkpointing_(checkpointing) {}
  torch::Tensor forward(const torch::Tensor& x) { return run_block(block_, x, checkpointing_ && is_training()); }

 private:
  std::shared_ptr<torch::nn::Module> block_;
  bool checkpointing_;
};
TORCH_MODULE(BlockLayer);

// ln_f, then the tied LM head. As a pipeline's last stage it runs on another thread than the
// embeddings (the first stage): both adding into the embedding's gradient, micro-batch by
// micro-batch, would sum in whatever order the threads meet, and no two runs would end
// bit-identical. So while separate (GptImpl::training_loss under the pipeline) the head computes
// with a leaf of its own over the embedding's storage, whose gradient is added once, afterwards.
// On another device than the embeddings the weight is copied there; the copy's backward brings
// the gradient home.
class HeadLayerImpl : public PipeLayer {
 public:
  HeadLayerImpl(torch::nn::LayerNorm ln_f, torch::nn::Embedding wte)
      : PipeLayer({ln_f.ptr()}), ln_f_(ln_f), wte_(wte) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::nn::functional::linear(ln_f_(x), weight().to(x.device()));
  }
  /// From now on, accumulate the head's share of the embedding's gradient apart (or not).
  void set_separate(bool separate) { separate_ = separate; }
  /// The gradient accumulated apart since the last call (undefined if none), cleared.
  torch::Tensor take_gradient() {
    if (!own_.defined() || !own_.grad().defined()) return {};
    torch::Tensor grad = own_.grad();
    own_.mutable_grad() = torch::Tensor();
    return grad;
  }

 private:
  const torch::Tensor& weight() {
    const torch::Tensor& shared = wte_->weight;
    if (!separate_) return shared;
    // The same storage: the optimizer's updates of the embedding are the head's too. Made again
    // when the embedding moved (the pipeline put the stages on their devices).
    if (!own_.defined() || !own_.is_alias_of(shared)) own_ = shared.detach().requires_grad_(true);
    return own_;
  }

  torch::nn::LayerNorm ln_f_;
  torch::nn::Embedding wte_;
  bool separate_ = false;
  torch::Tensor own_;
};
TORCH_MODULE(HeadLayer);

}  // namespace

void GptConfig::validate() const {
  const auto at_least_one = [](int64_t value, const char* name, const char* hint) {
    VOLT_CHECK(value >= 1, "{}={} must be at least 1. HINT: {}", name, value, hint);
  };
  at_least_one(n_layer, "n_layer", "GPT-2 small has 12 layers; a model that trains in minutes on a CPU has 2-4.");
  at_least_one(n_head, "n_head", "GPT-2 small has 12 heads of 64 dimensions.");
  at_least_one(n_embd, "n_embd", "GPT-2 small is 768 wide.");
  at_least_one(n_positions, "n_positions", "the context length, e.g. 1024 for GPT-2 or 128 for a small model.");
  at_least_one(vocab_size, "vocab_size", "256 for bytes, 50257 for GPT-2's BPE.");
  VOLT_CHECK(n_embd % n_head == 0,
             "n_embd={} is not divisible by n_head={}: each head gets n_embd / n_head dimensions. HINT: n_embd must be "
             "a multiple of n_head, e.g. n_head={} for n_embd={}, or n_embd={} for n_head={}.",
             n_embd, n_head, fitting_heads(n_embd, n_head), n_embd, (n_embd / n_head + 1) * n_head, n_head);
  for (const auto& [value, name] :
       {std::pair{embd_pdrop, "embd_pdrop"}, {attn_pdrop, "attn_pdrop"}, {resid_pdrop, "resid_pdrop"}}) {
    VOLT_CHECK(value >= 0 && value < 1, "{}={} must be in [0, 1). HINT: 0 turns that dropout off.", name, value);
  }
  VOLT_CHECK(layer_norm_epsilon > 0, "layer_norm_epsilon={} must be positive. HINT: GPT-2 uses 1e-5.",
             layer_norm_epsilon);
}

int64_t GptConfig::parameter_count() const {
  const int64_t per_block = 12 * n_embd * n_embd + 13 * n_embd;
  return vocab_size * n_embd + n_positions * n_embd + n_layer * per_block + 2 * n_embd;
}

GptConfig parse_hf_config(const nlohmann::json& json, const std::string& source) {
  VOLT_CHECK(json.is_object(),
             "{}: expected a JSON object (a Hugging Face config.json), got {}. HINT: pass the "
             "config.json of a GPT-2 model folder.",
             source, json.type_name());
  require<std::string>(json, "model_type", "gpt2", source, "only GPT-2 checkpoints (model_type \"gpt2\") load here.");
  // "gelu_new" is GPT-2's GELU with the tanh approximation; "gelu_pytorch_tanh" is the same function.
  const std::optional<std::string> activation = field<std::string>(json, "activation_function", source);
  VOLT_CHECK(!activation || *activation == "gelu_new" || *activation == "gelu_pytorch_tanh",
             "{}: \"activation_function\" is \"{}\", but this GPT-2 implements only GELU with the tanh approximation "
             "(\"gelu_new\" or \"gelu_pytorch_tanh\"). HINT: the weights were trained with another activation; they "
             "would not compute the same function here.",
             source, activation.value_or(""));
  require<bool>(json, "tie_word_embeddings", true, source, "this model's LM head is the token embedding (wte).");
  require<bool>(json, "scale_attn_weights", true, source, "attention scores are divided by sqrt(head_dim).");
  require<bool>(json, "scale_attn_by_inverse_layer_idx", false, source,
                "this GPT-2 does not scale attention scores by layer.");
  require<bool>(json, "add_cross_attention", false, source, "this is a decoder-only model.");

  GptConfig config;
  // GPT2Config's defaults for what the file leaves out (its dropouts are 0.1, not GptConfig's 0).
  config.n_layer = field<int64_t>(json, "n_layer", source).value_or(12);
  config.n_head = field<int64_t>(json, "n_head", source).value_or(12);
  config.n_embd = field<int64_t>(json, "n_embd", source).value_or(768);
  config.n_positions =
      field<int64_t>(json, "n_positions", source).value_or(field<int64_t>(json, "n_ctx", source).value_or(1024));
  config.vocab_size = field<int64_t>(json, "vocab_size", source).value_or(50257);
  config.embd_pdrop = field<double>(json, "embd_pdrop", source).value_or(0.1);
  config.attn_pdrop = field<double>(json, "attn_pdrop", source).value_or(0.1);
  config.resid_pdrop = field<double>(json, "resid_pdrop", source).value_or(0.1);
  config.layer_norm_epsilon = field<double>(json, "layer_norm_epsilon", source).value_or(1e-5);
  const std::optional<int64_t> n_inner = field<int64_t>(json, "n_inner", source);
  VOLT_CHECK(!n_inner || *n_inner == 4 * config.n_embd,
             "{}: \"n_inner\" is {}, but this GPT-2's MLP is 4 * n_embd = {} wide. HINT: set n_inner to null or {}.",
             source, n_inner.value_or(0), 4 * config.n_embd, 4 * config.n_embd);
  try {
    config.validate();
  } catch (const volt::Error& e) {
    throw volt::Error(source + ": " + e.what());
  }
  return config;
}

GptConfig load_hf_config(const std::string& path) {
  VOLT_CHECK(!std::filesystem::is_directory(path),
             "{} is a folder; expected a config.json file. HINT: pass {}/config.json, or --init-from {} to load the "
             "folder's weights too.",
             path, path, path);
  std::ifstream in(path);
  VOLT_CHECK(in.good(), "cannot read {}. HINT: pass the config.json of a Hugging Face GPT-2 folder.", path);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw volt::Error(fmt::format("{} is not valid JSON: {}. HINT: pass a Hugging Face config.json.", path, e.what()));
  }
  return parse_hf_config(json, path);
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GptConfig& config)
    : n_head_(config.n_head), attn_pdrop_(config.attn_pdrop) {
  c_attn = register_module("c_attn", torch::nn::Linear(config.n_embd, 3 * config.n_embd));
  c_proj = register_module("c_proj", torch::nn::Linear(config.n_embd, config.n_embd));
  resid_dropout_ = register_module("resid_dropout", torch::nn::Dropout(config.resid_pdrop));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t batch = x.size(0), time = x.size(1), width = x.size(2);
  // [B, T, 3C] -> three [B, n_head, T, head_dim].
  const std::vector<torch::Tensor> qkv = c_attn(x).split(width, 2);
  const auto heads = [&](const torch::Tensor& t) {
    return t.view({batch, time, n_head_, width / n_head_}).transpose(1, 2);
  };
  const torch::Tensor y = volt::scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]),
                                                             /*causal=*/true, is_training() ? attn_pdrop_ : 0.0);
  return resid_dropout_(c_proj(y.transpose(1, 2).contiguous().view({batch, time, width})));
}

MlpImpl::MlpImpl(const GptConfig& config) {
  c_fc = register_module("c_fc", torch::nn::Linear(config.n_embd, 4 * config.n_embd));
  c_proj = register_module("c_proj", torch::nn::Linear(4 * config.n_embd, config.n_embd));
  dropout_ = register_module("dropout", torch::nn::Dropout(config.resid_pdrop));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) { return dropout_(c_proj(torch::gelu(c_fc(x), "tanh"))); }

BlockImpl::BlockImpl(const GptConfig& config) {
  const auto layer_norm = [&] {
    return torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.n_embd}).eps(config.layer_norm_epsilon));
  };
  ln_1 = register_module("ln_1", layer_norm());
  attn = register_module("attn", CausalSelfAttention(config));
  ln_2 = register_module("ln_2", layer_norm());
  mlp = register_module("mlp", Mlp(config));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  const torch::Tensor h = x + attn(ln_1(x));
  return h + mlp(ln_2(h));
}

GptImpl::GptImpl(GptConfig config) : config_(std::move(config)) {
  config_.validate();
  wte = register_module("wte", torch::nn::Embedding(config_.vocab_size, config_.n_embd));
  wpe = register_module("wpe", torch::nn::Embedding(config_.n_positions, config_.n_embd));
  drop_ = register_module("drop", torch::nn::Dropout(config_.embd_pdrop));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < config_.n_layer; ++i) {
    if (config_.fsdp_units) {
      h->push_back(volt::FsdpUnit(Block(config_)));
    } else {
      h->push_back(Block(config_));
    }
  }
  ln_f = register_module(
      "ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config_.n_embd}).eps(config_.layer_norm_epsilon)));
  init_weights();
  if (config_.pipelined) {
    torch::nn::Sequential layers(EmbeddingsLayer(wte, wpe, drop_));
    for (size_t i = 0; i < h->size(); ++i) layers->push_back(BlockLayer(h->ptr(i), config_.activation_checkpointing));
    layers->push_back(HeadLayer(ln_f, wte));
    pipe = register_module("pipe", volt::Pipe(layers));
  }
}

void GptImpl::init_weights() {
  torch::NoGradGuard no_grad;
  // GPT-2's initialisation (Hugging Face's GPT2PreTrainedModel._init_weights): every weight
  // matrix and embedding N(0, 0.02), biases 0, LayerNorm weights 1; the projections that write
  // into the residual stream (c_proj) with std 0.02 / sqrt(2 n_layer), so that the stream's
  // variance does not grow with depth.
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config_.n_layer));
  for (auto& item : named_parameters()) {
    const std::string& name = item.key();
    torch::Tensor& param = item.value();
    if (ends_with(name, ".bias")) {
      param.zero_();
    } else if (param.dim() == 1) {
      param.fill_(1.0);  // a LayerNorm's weight
    } else {
      param.normal_(0.0, ends_with(name, "c_proj.weight") ? residual_std : 0.02);
    }
  }
}

void GptImpl::check_tokens(const torch::Tensor& idx) const {
  VOLT_CHECK(
      idx.dim() == 2 && idx.scalar_type() == torch::kLong,
      "GPT forward: expected token ids [batch, time] of int64, got shape {} of {}. HINT: tokens.to(torch::kLong), "
      "and unsqueeze(0) a single sequence.",
      c10::str(idx.sizes()), c10::toString(idx.scalar_type()));
  VOLT_CHECK(idx.size(1) <= config_.n_positions,
             "GPT forward: {} tokens exceed the model's context of n_positions={}. HINT: cut the input to its last {} "
             "tokens (generate() does), or build the model with a larger n_positions (--block-size).",
             idx.size(1), config_.n_positions, config_.n_positions);
  if (idx.numel() == 0) return;
  // One copy to the host for both bounds: on CUDA an embedding lookup out of range is a device-side
  // assert that kills the process without saying which token it was.
  const auto [low, high] = torch::aminmax(idx);
  const torch::Tensor bounds = torch::stack({low, high}).cpu();
  if (bounds[0].item<int64_t>() >= 0 && bounds[1].item<int64_t>() < config_.vocab_size) return;
  const torch::Tensor bad = torch::logical_or(idx < 0, idx >= config_.vocab_size).nonzero()[0].cpu();
  const int64_t row = bad[0].item<int64_t>(), column = bad[1].item<int64_t>();
  throw volt::Error(fmt::format(
      "GPT forward: token id {} at [{}, {}] is outside the vocabulary of vocab_size={} (ids 0..{}). HINT: the "
      "tokenizer must match the model: byte-level text needs vocab_size 256 (--vocab-size), a Hugging Face "
      "tokenizer its config.json's vocab_size.",
      idx[row][column].item<int64_t>(), row, column, config_.vocab_size, config_.vocab_size - 1));
}

torch::Tensor GptImpl::forward(const torch::Tensor& idx) {
  check_tokens(idx);
  if (pipe) return pipe->forward(idx);
  const torch::Tensor positions = torch::arange(idx.size(1), idx.options());
  torch::Tensor x = drop_(wte(idx) + wpe(positions));
  // Checkpointing pays off only when a backward will follow.
  for (size_t i = 0; i < h->size(); ++i) x = run_block(h->ptr(i), x, config_.activation_checkpointing && is_training());
  // The LM head is the token embedding (tied weights): logits = ln_f(x) wteᵀ.
  return torch::nn::functional::linear(ln_f(x), wte->weight);
}

torch::Tensor GptImpl::training_loss(const torch::Tensor& inputs, const torch::Tensor& targets) {
  if (!pipe) return next_token_loss(forward(inputs), targets);
  check_tokens(inputs);
  const auto rows = static_cast<double>(inputs.size(0));
  const auto loss = [&](const torch::Tensor& logits, int64_t begin, int64_t end) {
    return next_token_loss(logits, targets.slice(0, begin, end).to(logits.device())) *
           (static_cast<double>(end - begin) / rows);
  };
  if (!pipe->enabled() || !torch::GradMode::is_enabled()) return pipe->train_step(inputs, loss);
  // The stages run forward and backward here; the head's share of the tied embedding's gradient
  // is added after both stages are through, in one fixed order (see HeadLayer).
  const std::shared_ptr<HeadLayerImpl> head = pipe->layers->ptr<HeadLayerImpl>(pipe->layers->size() - 1);
  head->set_separate(true);
  const torch::Tensor total = pipe->train_step(inputs, loss);
  head->set_separate(false);
  const torch::Tensor grad = head->take_gradient();
  if (grad.defined()) {
    torch::NoGradGuard no_grad;
    torch::Tensor& embedding_grad = wte->weight.mutable_grad();
    if (embedding_grad.defined()) {
      embedding_grad.add_(grad.to(embedding_grad.device()));
    } else {
      embedding_grad = grad.to(wte->weight.device());
    }
  }
  return total;
}

torch::Tensor next_token_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  VOLT_CHECK(
      logits.dim() == 3 && targets.dim() == 2 && logits.size(0) == targets.size(0) && logits.size(1) == targets.size(1),
      "next_token_loss: expected logits [B, T, V] and targets [B, T], got {} and {}. HINT: targets[:, t] is the "
      "token after input t.",
      c10::str(logits.sizes()), c10::str(targets.sizes()));
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& input_ids) {
  VOLT_CHECK(input_ids.dim() == 2 && input_ids.size(1) >= 2,
             "lm_loss: expected input_ids [B, T] with T >= 2 (one token to predict), got {}. HINT: a single token has "
             "nothing to predict.",
             c10::str(input_ids.sizes()));
  const int64_t time = input_ids.size(1);
  return next_token_loss(logits.narrow(1, 0, time - 1), input_ids.narrow(1, 1, time - 1));
}

}  // namespace gpt
