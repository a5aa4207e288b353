#include "gpt/gpt_module.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <utility>
#include <vector>

#include "volt/core/error.h"
#include "volt/datasets/token_windows.h"

namespace gpt {

namespace {

// Bytes held out for validation: the last val_fraction of the text. They validate only when they
// make at least one window (block_size + 1 bytes).
int64_t held_out_bytes(int64_t text_bytes, const GptModuleOptions& options) {
  return static_cast<int64_t>(static_cast<double>(text_bytes) * options.val_fraction);
}

}  // namespace

int64_t window_size(const GptModuleOptions& options) { return options.block_size.value_or(options.model.n_positions); }

bool has_validation_data(const GptModuleOptions& options) {
  if (!options.data.empty()) {
    // The val files' tokens from their headers; a broken file is an error when the loader opens it.
    std::error_code error;
    int64_t tokens = 0;
    for (const auto& entry : std::filesystem::directory_iterator(options.data, error)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("val-", 0) != 0 || entry.path().extension() != ".npy") continue;
      try {
        tokens = std::max(tokens, volt::datasets::read_npy_header(entry.path().string()).shape[0]);
      } catch (const volt::Error&) {
        return true;
      }
    }
    return tokens >= window_size(options) + 1;
  }
  std::error_code error;
  const auto bytes = static_cast<int64_t>(std::filesystem::file_size(options.text, error));
  return !error && held_out_bytes(bytes, options) >= window_size(options) + 1;
}

namespace {

/// Checks what a user can get wrong on the command line, naming the flag.
const GptModuleOptions& checked(const GptModuleOptions& o) {
  VOLT_CHECK(o.val_fraction >= 0 && o.val_fraction < 1,
             "--val-fraction={} must be in [0, 1). HINT: 0.1 validates on the last tenth of the text; 0 turns "
             "validation off.",
             o.val_fraction);
  VOLT_CHECK(!o.block_size || (*o.block_size >= 2 && *o.block_size <= o.model.n_positions),
             "--block-size={} cannot be the training window of this model: expected 2..n_positions={}. HINT: the "
             "windows must fit the model's context; leave --block-size out to train on windows of n_positions.",
             o.block_size.value_or(0), o.model.n_positions);
  VOLT_CHECK(o.batch_size >= 1, "--batch-size={} must be at least 1. HINT: the default is 16.", o.batch_size);
  VOLT_CHECK(std::isfinite(o.lr) && o.lr > 0, "--lr={} must be a positive number. HINT: 1e-3 suits a small model.",
             o.lr);
  VOLT_CHECK(o.min_lr_ratio >= 0 && o.min_lr_ratio <= 1,
             "--min-lr-ratio={} must be in [0, 1]. HINT: 0.1 ends the decay at a tenth of --lr.", o.min_lr_ratio);
  VOLT_CHECK(o.weight_decay >= 0, "--weight-decay={} must be >= 0. HINT: GPT-2's recipe uses 0.1.", o.weight_decay);
  VOLT_CHECK(o.warmup_steps >= 0, "--warmup-steps={} must be >= 0. HINT: 0 warms up for a tenth of the decay.",
             o.warmup_steps);
  VOLT_CHECK(o.lr_decay_steps >= 0, "--lr-decay-steps={} must be >= 0. HINT: 0 decays over the whole run.",
             o.lr_decay_steps);
  VOLT_CHECK(o.text.empty() || o.data.empty(),
             "--text={} and --data={} were both given. HINT: train on a text file's bytes (--text) or on a "
             "tokenized corpus (--data), not both.",
             o.text, o.data);
  VOLT_CHECK(o.windows_per_shard >= 1, "windows_per_shard={} must be at least 1. HINT: the default is 64.",
             o.windows_per_shard);
  VOLT_CHECK(o.num_workers >= 0, "--num-workers={} must be >= 0. HINT: 0 makes batches on the training thread.",
             o.num_workers);
  VOLT_CHECK(!o.prompt.empty(), "--prompt is empty. HINT: generation continues a prompt of at least one byte.");
  return o;
}

// Inputs [B, T] and targets [B, T] from a batch of token_windows, or of [B, T + 1] windows.
std::pair<torch::Tensor, torch::Tensor> inputs_and_targets(const volt::Batch& batch) {
  if (batch.target.defined()) return {batch.data, batch.target};
  const int64_t length = batch.data.size(1) - 1;
  return {batch.data.narrow(1, 0, length), batch.data.narrow(1, 1, length)};
}

}  // namespace

GptModule::GptModule(GptModuleOptions options) : volt::LightningModule("GptModule"), options_(std::move(options)) {
  transformer_ = register_module("transformer", Gpt(checked(options_).model));
  const GptConfig& c = options_.model;
  save_hyperparameters({{"n_layer", c.n_layer},
                        {"n_head", c.n_head},
                        {"n_embd", c.n_embd},
                        {"n_positions", c.n_positions},
                        {"vocab_size", c.vocab_size},
                        {"block_size", window_size(options_)},
                        {"dropout", c.resid_pdrop},
                        {"activation_checkpointing", c.activation_checkpointing},
                        {"lr", options_.lr},
                        {"weight_decay", options_.weight_decay},
                        {"warmup_steps", options_.warmup_steps},
                        {"lr_decay_steps", options_.lr_decay_steps},
                        {"batch_size", options_.batch_size},
                        {"text", options_.text},
                        {"data", options_.data}});
  if (!options_.data.empty()) {
    const CorpusMeta meta = read_corpus_meta(options_.data);
    VOLT_CHECK(meta.vocab_size <= c.vocab_size,
               "the corpus {} has {} tokens, more than the model's vocabulary of {}. HINT: pass --vocab-size {} or "
               "more (or leave it out: it then comes from meta.json).",
               options_.data, meta.vocab_size, c.vocab_size, meta.vocab_size);
    val_tokens_per_byte_ = meta.val_bytes > 0 ? static_cast<double>(meta.val_tokens) / meta.val_bytes : 0.0;
    tokenizer_ = std::make_shared<const Tokenizer>(options_.data);
  }
}

torch::Tensor GptModule::training_step(const volt::Batch& batch, int64_t) {
  const auto [inputs, targets] = inputs_and_targets(batch);
  // Under strategy="pipeline" the loss comes per micro-batch from the model's Pipe, so the 1F1B
  // schedule can run each micro-batch's backward as soon as its forward is through.
  const torch::Tensor loss = transformer_->training_loss(inputs, targets);
  log("train/loss", loss, {.prog_bar = true, .on_step = true, .on_epoch = true});
  return loss;
}

void GptModule::validation_step(const volt::Batch& batch, int64_t) {
  const auto [inputs, targets] = inputs_and_targets(batch);
  // sync_dist: under ddp each process validates a shard; the epoch mean covers every window once.
  const torch::Tensor loss = next_token_loss(transformer_->forward(inputs), targets);
  log("val/loss", loss, {.prog_bar = true, .sync_dist = true});
  // The epoch mean of a multiple of the loss is the multiple of its mean: val/bpb is val/loss's.
  if (val_tokens_per_byte_ > 0) log("val/bpb", loss * (val_tokens_per_byte_ / std::log(2.0)), {.sync_dist = true});
}

torch::Tensor GptModule::predict_step(const volt::Batch& batch, int64_t) {
  return generate(transformer_, batch.data, options_.sample);
}

volt::OptimizerConfig GptModule::configure_optimizers() {
  // Weight decay pulls matrices and embeddings towards 0; on biases and LayerNorm gains it only
  // hurts (GPT-2, nanoGPT): two parameter groups.
  std::vector<torch::Tensor> decayed, not_decayed;
  for (const torch::Tensor& param : parameters()) {
    if (param.requires_grad()) (param.dim() >= 2 ? decayed : not_decayed).push_back(param);
  }
  const auto adamw_options = [&](double weight_decay) {
    return torch::optim::AdamWOptions(options_.lr).betas({options_.beta1, options_.beta2}).weight_decay(weight_decay);
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decayed, std::make_unique<torch::optim::AdamWOptions>(adamw_options(options_.weight_decay)));
  groups.emplace_back(not_decayed, std::make_unique<torch::optim::AdamWOptions>(adamw_options(0.0)));
  auto adamw = std::make_shared<torch::optim::AdamW>(std::move(groups), adamw_options(options_.weight_decay));
  // The decay spans the whole run as the Trainer counts its optimizer steps (they change with the
  // number of processes, the accumulation and the batch limits), unless --lr-decay-steps says.
  const std::optional<int64_t> run_steps = estimated_stepping_batches();
  // A run of no steps (--max-steps 0: load, validate or sample only) never reads the schedule.
  const int64_t decay_steps =
      options_.lr_decay_steps > 0 ? options_.lr_decay_steps : (run_steps == 0 ? 1 : run_steps.value_or(0));
  VOLT_CHECK(decay_steps > 0,
             "the learning-rate decay has no length: --lr-decay-steps is 0 and the run's optimizer steps are unknown "
             "(no fit, or neither --max-steps nor --max-epochs bounds it). HINT: pass --max-steps N or "
             "--lr-decay-steps N.");
  const int64_t warmup_steps = options_.warmup_steps > 0 ? options_.warmup_steps : decay_steps / 10;
  VOLT_CHECK(warmup_steps < decay_steps,
             "--warmup-steps={} leaves no decay: the schedule has {} optimizer steps in all. HINT: pass fewer warmup "
             "steps, or 0 for a tenth of the run.",
             warmup_steps, decay_steps);
  auto schedule = std::make_shared<volt::LinearWarmupCosineLR>(*adamw, warmup_steps, decay_steps,
                                                               /*eta_min=*/options_.lr * options_.min_lr_ratio);
  return volt::OptimizerConfig(adamw, {.scheduler = schedule, .interval = volt::Interval::kStep});
}

void GptModule::load_text() {
  if (train_ || train_stream_) return;
  if (!options_.data.empty()) {
    const volt::datasets::TokenWindowsOptions windows{.block_size = window_size(options_),
                                                      .windows_per_shard = options_.windows_per_shard,
                                                      .vocab_size = options_.model.vocab_size};
    train_stream_ = std::make_shared<volt::datasets::TokenWindows>(
        volt::datasets::TokenWindows::in_folder(options_.data, "train", windows));
    if (has_validation_data(options_)) {
      val_stream_ = std::make_shared<volt::datasets::TokenWindows>(
          volt::datasets::TokenWindows::in_folder(options_.data, "val", windows));
    } else {
      print(
          fmt::format("warning: no validation: {} has no val-*.npy of at least one window ({} + 1 tokens), so no "
                      "val/loss is logged. HINT: prepare the corpus with a validation share, or pass a smaller "
                      "--block-size.",
                      options_.data, window_size(options_)));
    }
    return;
  }
  VOLT_CHECK(!options_.text.empty(),
             "no text to train on. HINT: pass --text FILE (any plain text file) or --data FOLDER (a corpus from "
             "scripts/prepare-text-corpus.py).");
  const torch::Tensor tokens = read_byte_tokens(options_.text);
  const int64_t block = window_size(options_);
  const int64_t held_out = held_out_bytes(tokens.numel(), options_);
  const int64_t kept = tokens.numel() - held_out;
  VOLT_CHECK(kept >= block + 1,
             "{}: {} bytes leave {} for training, less than one window of --block-size + 1 = {} bytes. HINT: use a "
             "longer text or a smaller --block-size (with a config.json: a training window shorter than its "
             "n_positions).",
             options_.text, tokens.numel(), kept, block + 1);
  train_ = token_windows(tokens.narrow(0, 0, kept), block);
  // The held-out end validates only when it holds a whole window.
  if (held_out >= block + 1) {
    val_ = token_windows(tokens.narrow(0, kept, held_out), block);
  } else if (held_out > 0) {
    print(
        fmt::format("warning: no validation: the last {} bytes of {} (--val-fraction {}) are shorter than one window "
                    "of {} + 1 bytes, so no val/loss is logged. HINT: pass a larger --val-fraction or a smaller "
                    "--block-size, or use a longer text.",
                    held_out, options_.text, options_.val_fraction, block));
  }
}

volt::DataLoader GptModule::train_dataloader() {
  load_text();
  if (train_stream_) {
    return volt::DataLoader(train_stream_,
                            {.batch_size = options_.batch_size, .shuffle = true, .num_workers = options_.num_workers});
  }
  return volt::DataLoader(train_,
                          {.batch_size = options_.batch_size, .shuffle = true, .num_workers = options_.num_workers});
}

volt::DataLoader GptModule::val_dataloader() {
  load_text();
  if (train_stream_) {
    if (!val_stream_) return {};
    return volt::DataLoader(val_stream_, {.batch_size = options_.batch_size, .num_workers = options_.num_workers});
  }
  if (!val_) return {};
  return volt::DataLoader(val_, {.batch_size = options_.batch_size, .num_workers = options_.num_workers});
}

volt::DataLoader GptModule::predict_dataloader() {
  return volt::DataLoader(std::make_shared<volt::TensorDataset>(encode(options_.prompt).unsqueeze(0), torch::Tensor()),
                          {.batch_size = 1});
}

torch::Tensor GptModule::encode(const std::string& text) const {
  return tokenizer_ ? tokenizer_->encode(text) : encode_bytes(text);
}

std::string GptModule::decode(const torch::Tensor& tokens) const {
  return tokenizer_ ? tokenizer_->decode(tokens) : decode_bytes(tokens);
}

}  // namespace gpt
