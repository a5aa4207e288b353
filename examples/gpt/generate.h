// Text generation with a GPT: autoregressive sampling with temperature and top-k.
#pragma once

#include <torch/types.h>

#include <cstdint>

#include "gpt/gpt_model.h"

namespace gpt {

/// How generate() continues a prompt.
///
/// Example: `gpt::generate(model, prompt, {.max_new_tokens = 200, .temperature = 0.8, .top_k = 40, .seed = 1})`.
struct GenerateOptions {
  /// Tokens appended to the prompt.
  int64_t max_new_tokens = 100;
  /// Divides the logits before sampling: below 1 sharpens, above 1 flattens; 0 takes the most
  /// likely token every time (greedy decoding).
  double temperature = 1.0;
  /// Sample only among the k most likely tokens; 0: among all of them.
  int64_t top_k = 0;
  /// Seeds generate()'s own generator: the same seed gives the same tokens.
  uint64_t seed = 0;
};

/// `prompt` ([T] or [B, T] int64 token ids, T >= 1) followed by `options.max_new_tokens` tokens
/// drawn one at a time from the model's next-token distribution, each from the last n_positions
/// tokens (the context is cropped to the model's). Runs in eval mode without gradients (the
/// module's mode is restored). Draws on the CPU from a generator of its own seeded with
/// `options.seed`, so the global random stream is untouched and the result is the same on every
/// device and process for a seed. Returns [T + max_new_tokens] or [B, T + max_new_tokens] on the
/// prompt's device; throws volt::Error for a bad prompt or option.
torch::Tensor generate(Gpt& model, const torch::Tensor& prompt, const GenerateOptions& options = {});

}  // namespace gpt
