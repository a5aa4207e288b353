// The example's LightningModule: a GPT trained on the bytes of a text file, with GPT-2's recipe
// (AdamW, weight decay on matrices only, linear warmup then cosine decay per optimizer step).
// Copy it as the start of your own language model.
#pragma once

#include <optional>
#include <string>

#include "gpt/byte_text.h"
#include "gpt/generate.h"
#include "gpt/gpt_model.h"
#include "gpt/token_corpus.h"
#include "volt/volt.h"

namespace gpt {

/// The module's hyperparameters (also the example's command-line flags).
struct GptModuleOptions {
  /// The model's size; n_positions is also the training window unless block_size says otherwise.
  GptConfig model{.n_layer = 4, .n_head = 4, .n_embd = 128, .n_positions = 128, .vocab_size = kByteVocabSize};
  /// The training and validation window in tokens, 2..model.n_positions; unset: n_positions. Set
  /// when a config.json fixes the model's positions (GPT-2's 1024) and the text or the memory
  /// wants shorter windows: the model, and so an export, keeps its n_positions.
  std::optional<int64_t> block_size;
  /// The text file to train on, read as bytes.
  std::string text;
  /// Or: a folder of SentencePiece token shards (scripts/prepare-text-corpus.py), streamed:
  /// train-*.npy trains, val-*.npy validates, tokenizer.model encodes the prompt and decodes.
  std::string data;
  /// With `data`: the windows of a loader shard (files are cut into shards for processes x
  /// workers to share).
  int64_t windows_per_shard = 64;
  /// The share of the text, taken from its end, held out for validation.
  double val_fraction = 0.1;
  /// Windows per batch (per process under ddp).
  int64_t batch_size = 16;
  /// AdamW's peak learning rate, reached after warmup_steps.
  double lr = 1e-3;
  /// The learning rate at the end of the cosine decay, as a share of lr.
  double min_lr_ratio = 0.1;
  /// AdamW's weight decay, on matrices and embeddings only.
  double weight_decay = 0.1;
  /// AdamW's beta1 and beta2 (GPT-3's 0.9 and 0.95).
  double beta1 = 0.9;
  double beta2 = 0.95;  ///< see beta1
  /// Optimizer steps of linear warmup from 0 to lr; 0: a tenth of the decay's steps.
  int64_t warmup_steps = 0;
  /// Optimizer steps from the start to the end of the cosine decay (lr * min_lr_ratio after it);
  /// 0: the whole run, as the Trainer counts it (estimated_stepping_batches).
  int64_t lr_decay_steps = 0;
  /// Threads that make batches ahead of the step.
  int64_t num_workers = 0;
  /// predict_step's prompt, as text (byte tokens, or the tokenizer's with `data`).
  std::string prompt = "\n";
  /// How predict_step continues the prompt.
  GenerateOptions sample{.max_new_tokens = 200, .temperature = 0.8, .top_k = 40, .seed = 0};
};

/// The window the module trains and validates on: block_size, or the model's n_positions.
int64_t window_size(const GptModuleOptions& options);

/// Whether the text file of `options` leaves a validation window (read from its size), or its
/// data folder holds one (val-*.npy), before the module exists: the checkpoint callback monitors
/// val/loss only then.
bool has_validation_data(const GptModuleOptions& options);

/// Trains a Gpt on byte windows of a text, or on token windows streamed from a corpus folder;
/// logs train/loss and val/loss (and val/bpb for a corpus); predict_step continues the prompt.
class GptModule : public volt::LightningModule {
 public:
  /// Builds the model (registered as "transformer", so its parameters carry Hugging Face's names
  /// transformer.wte.weight, ...); throws volt::Error for bad options.
  explicit GptModule(GptModuleOptions options);

  /// A window's loss: batches hold data [B, T] and target [B, T] (token_windows), or data
  /// [B, T + 1] alone, split into inputs [:, :-1] and targets [:, 1:].
  torch::Tensor training_step(const volt::Batch& batch, int64_t batch_idx) override;
  /// Logs val/loss, the mean over every validation window, and with `data` val/bpb: bits per
  /// byte of text (val/loss * tokens / (bytes * ln 2), the val split's counts from meta.json).
  void validation_step(const volt::Batch& batch, int64_t batch_idx) override;
  /// Continues each prompt of the batch (data [B, T] token ids) with options.sample; returns
  /// [B, T + max_new_tokens].
  torch::Tensor predict_step(const volt::Batch& batch, int64_t batch_idx) override;
  /// AdamW with two parameter groups (weight decay on tensors of 2 or more dimensions, none on
  /// biases and LayerNorm weights) and a LinearWarmupCosineLR stepped per optimizer step (Hugging
  /// Face's get_cosine_schedule_with_warmup, ending at lr * min_lr_ratio). Throws volt::Error when
  /// neither lr_decay_steps nor the run gives the decay a length.
  volt::OptimizerConfig configure_optimizers() override;
  volt::DataLoader train_dataloader() override;
  volt::DataLoader val_dataloader() override;
  /// One batch: the prompt.
  volt::DataLoader predict_dataloader() override;
  /// dp and ddp2 on several GPUs run a copy of the model on each device but the first.
  std::shared_ptr<volt::LightningModule> make_replica() const override { return std::make_shared<GptModule>(options_); }

  /// The weights a fit starts from (e.g. HfWeights of --init-from), read by the Trainer once the
  /// strategy has placed the parameters; none (the default) keeps the initialised ones.
  void set_initial_weights(std::shared_ptr<volt::WeightSource> weights) { initial_weights_ = std::move(weights); }
  /// What set_initial_weights gave.
  std::shared_ptr<volt::WeightSource> initial_weights() override { return initial_weights_; }

  /// The model.
  Gpt& transformer() { return transformer_; }
  /// The token ids [N] of `text`: its bytes, or the tokenizer's pieces with `data`.
  torch::Tensor encode(const std::string& text) const;
  /// The text of token ids [N]: bytes, or the tokenizer's pieces with `data`.
  std::string decode(const torch::Tensor& tokens) const;

 private:
  void load_text();

  GptModuleOptions options_;
  Gpt transformer_{nullptr};
  std::shared_ptr<volt::Dataset> train_;
  std::shared_ptr<volt::Dataset> val_;  // null when the held-out part is shorter than a window
  // With options_.data: the streamed windows (val null without val-*.npy), the tokenizer, and
  // the val split's tokens per byte.
  std::shared_ptr<volt::IterableDataset> train_stream_;
  std::shared_ptr<volt::IterableDataset> val_stream_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  double val_tokens_per_byte_ = 0;
  std::shared_ptr<volt::WeightSource> initial_weights_;
};

}  // namespace gpt
