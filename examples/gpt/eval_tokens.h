// The loss of a GPT on a file of token ids, as Hugging Face computes it: `gpt --eval-tokens FILE.npy`,
// how a model loaded with --init-from (or just trained) is compared with GPT2LMHeadModel.
#pragma once

#include <torch/torch.h>

#include <string>

#include "gpt/gpt_model.h"

namespace gpt {

/// The token ids of the 1-D .npy file `path` (int32, int64 or uint16, as tokenizers store them) as
/// an int64 tensor. Throws volt::Error naming the file with a HINT for another shape or dtype, or
/// what volt::datasets::read_npy_header refuses (not a .npy file, cut short, ...).
torch::Tensor read_token_ids(const std::string& path);

/// What evaluate_tokens measured.
struct TokenEvalResult {
  /// The mean cross entropy (nats) over every predicted token.
  double loss = 0;
  /// The windows evaluated: the tokens cut into non-overlapping windows of block_size, the last
  /// partial one dropped.
  int64_t windows = 0;
  /// The tokens predicted: block_size - 1 per window.
  int64_t predicted_tokens = 0;
};

/// The loss of `model` on `tokens` [N] (int64), cut into non-overlapping windows of `block_size`;
/// each window's loss is that of GPT2LMHeadModel(input_ids=window, labels=window) (tokens 2..L
/// predicted from their prefixes, gpt::lm_loss), and the result their mean over every predicted
/// token. Runs in eval mode without gradients, `batch_size` windows at a time, on the device of the
/// model's parameters; restores the model's training mode. Throws volt::Error, with a HINT, for
/// block_size < 2 or > n_positions, fewer tokens than one window, or a token id outside the
/// vocabulary (naming it and its position in the file).
TokenEvalResult evaluate_tokens(Gpt& model, const torch::Tensor& tokens, int64_t block_size, int64_t batch_size = 16);

}  // namespace gpt
