// GPT-2 as a LibTorch module: the architecture and parameter names of Hugging Face's
// GPT2LMHeadModel, so its weights can be loaded by name.
//
// Parameters (what named_parameters() lists, under the name the module is registered with;
// register it as "transformer" to get Hugging Face's keys):
//
//   wte.weight                 [vocab_size, n_embd]     token embedding, also the LM head (tied)
//   wpe.weight                 [n_positions, n_embd]    learned positions
//   h.<i>.ln_1.weight / .bias  [n_embd]
//   h.<i>.attn.c_attn.weight   [3 n_embd, n_embd]       query, key and value in one projection
//   h.<i>.attn.c_proj.weight   [n_embd, n_embd]
//   h.<i>.ln_2.weight / .bias  [n_embd]
//   h.<i>.mlp.c_fc.weight      [4 n_embd, n_embd]
//   h.<i>.mlp.c_proj.weight    [n_embd, 4 n_embd]
//   ln_f.weight / .bias        [n_embd]
//
// each projection with its .bias. Hugging Face stores the projections as Conv1D, whose weight is
// the transpose of a Linear's ([in, out]): a loader transposes c_attn, c_proj and c_fc weights
// (and drops the attn.bias mask buffers older files carry, and lm_head.weight, which is wte's).
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <string>

namespace gpt {

/// The model's size and regularisation: GPT2Config's fields that change the computation.
///
/// Example (a model small enough to train on a laptop's CPU):
/// `gpt::GptConfig{.n_layer = 4, .n_head = 4, .n_embd = 128, .n_positions = 128, .vocab_size = 256}`.
struct GptConfig {
  /// Transformer blocks.
  int64_t n_layer = 12;
  /// Attention heads per block; must divide n_embd.
  int64_t n_head = 12;
  /// Width of the residual stream (the embeddings).
  int64_t n_embd = 768;
  /// The longest context: rows of the position embedding.
  int64_t n_positions = 1024;
  /// Tokens the model reads and predicts: rows of the token embedding.
  int64_t vocab_size = 50257;
  /// Dropout after the embeddings are summed.
  double embd_pdrop = 0.0;
  /// Dropout on the attention weights.
  double attn_pdrop = 0.0;
  /// Dropout on each block's attention and MLP outputs before they join the residual stream.
  double resid_pdrop = 0.0;
  /// The LayerNorms' epsilon (GPT-2's 1e-5).
  double layer_norm_epsilon = 1e-5;
  /// Recompute each block in backward instead of keeping its activations (volt::checkpoint):
  /// less memory for one more forward pass per block.
  bool activation_checkpointing = false;
  /// Wrap each block in a volt::FsdpUnit: under fsdp's full_shard a block's parameters are
  /// gathered only around its own forward and backward (PyTorch FSDP's per-block wrapping), so a
  /// process holds one whole block at a time. Names and checkpoints are the same either way.
  bool fsdp_units = false;

  /// Throws volt::Error naming the first field out of range (sizes below 1, n_embd not divisible
  /// by n_head, a dropout outside [0, 1)), with what was expected and a HINT.
  void validate() const;
  /// The number of parameters: V E + P E + L (12 E² + 13 E) + 2 E (the head is tied to wte).
  int64_t parameter_count() const;
};

/// The GptConfig a Hugging Face GPT-2 `config.json` describes (already parsed); `source` names it
/// in errors. Missing fields take GPT2Config's defaults (dropouts 0.1). Throws volt::Error,
/// saying what was given, what was expected and a HINT, for a field of the wrong type, a value out
/// of range, or a setting this model does not implement (another model_type or activation, untied
/// embeddings, n_inner other than 4 n_embd, attention scaled by layer).
GptConfig parse_hf_config(const nlohmann::json& json, const std::string& source = "config.json");
/// parse_hf_config of the file at `path`; throws volt::Error when it cannot be read or is not JSON.
GptConfig load_hf_config(const std::string& path);

/// Causal self-attention: one projection to queries, keys and values, n_head heads through
/// volt::scaled_dot_product_attention, and the output projection.
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  /// Registers c_attn and c_proj (see the file comment for their shapes).
  explicit CausalSelfAttentionImpl(const GptConfig& config);
  /// [B, T, n_embd] -> [B, T, n_embd]; position t attends to positions <= t only.
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear c_attn{nullptr};  ///< n_embd -> 3 n_embd: queries, keys, values
  torch::nn::Linear c_proj{nullptr};  ///< n_embd -> n_embd

 private:
  int64_t n_head_;
  double attn_pdrop_;
  torch::nn::Dropout resid_dropout_{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

/// The feed-forward half of a block: n_embd -> 4 n_embd, GELU (tanh approximation, GPT-2's
/// "gelu_new"), -> n_embd.
class MlpImpl : public torch::nn::Module {
 public:
  /// Registers c_fc and c_proj.
  explicit MlpImpl(const GptConfig& config);
  /// [B, T, n_embd] -> [B, T, n_embd].
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear c_fc{nullptr};    ///< n_embd -> 4 n_embd
  torch::nn::Linear c_proj{nullptr};  ///< 4 n_embd -> n_embd

 private:
  torch::nn::Dropout dropout_{nullptr};
};
TORCH_MODULE(Mlp);

/// One pre-LayerNorm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(x)).
class BlockImpl : public torch::nn::Module {
 public:
  /// Registers ln_1, attn, ln_2 and mlp.
  explicit BlockImpl(const GptConfig& config);
  /// [B, T, n_embd] -> [B, T, n_embd].
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::LayerNorm ln_1{nullptr};  ///< before attention
  CausalSelfAttention attn{nullptr};   ///< the attention
  torch::nn::LayerNorm ln_2{nullptr};  ///< before the MLP
  Mlp mlp{nullptr};                    ///< the MLP
};
TORCH_MODULE(Block);

/// GPT-2: token and position embeddings, n_layer blocks, a final LayerNorm and an LM head that
/// reuses the token embedding. Initialised as GPT-2 (normal with std 0.02, the residual
/// projections' c_proj weights with 0.02 / sqrt(2 n_layer), zero biases); draws from the default
/// generator, so seed it first for reproducible weights.
class GptImpl : public torch::nn::Module {
 public:
  /// Builds and initialises the model; throws volt::Error for an invalid `config`.
  explicit GptImpl(GptConfig config);
  /// Logits [B, T, vocab_size] for token ids `idx` [B, T] (int64): position t's logits predict
  /// token t + 1 from tokens 0..t. Throws volt::Error for T > n_positions or an id outside
  /// [0, vocab_size), naming it.
  torch::Tensor forward(const torch::Tensor& idx);
  /// The configuration it was built with.
  const GptConfig& config() const { return config_; }

  torch::nn::Embedding wte{nullptr};   ///< token embedding, also the LM head
  torch::nn::Embedding wpe{nullptr};   ///< position embedding
  torch::nn::ModuleList h{nullptr};    ///< the blocks, h.0 .. h.<n_layer - 1> (Block or FsdpUnit(Block))
  torch::nn::LayerNorm ln_f{nullptr};  ///< the final LayerNorm

 private:
  void check_tokens(const torch::Tensor& idx) const;
  void init_weights();

  GptConfig config_;
  torch::nn::Dropout drop_{nullptr};
};
TORCH_MODULE(Gpt);

/// Mean cross entropy of `logits` [B, T, V] against `targets` [B, T], where targets[:, t] is the
/// token that follows input t: the training loss on a window whose targets are its inputs
/// shifted by one.
torch::Tensor next_token_loss(const torch::Tensor& logits, const torch::Tensor& targets);

/// The loss GPT2LMHeadModel(input_ids, labels=input_ids) computes: the mean cross entropy of
/// predicting tokens 2..T of `input_ids` [B, T] from their prefixes, `logits` [B, T, V] being the
/// model's output on `input_ids`.
torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& input_ids);

}  // namespace gpt
