#include "gpt/eval_tokens.h"

#include <fstream>
#include <string>
#include <vector>

#include "volt/core/error.h"
#include "volt/datasets/npy_shards.h"

namespace gpt {

torch::Tensor read_token_ids(const std::string& path) {
  const volt::datasets::NpyHeader header = volt::datasets::read_npy_header(path);
  VOLT_CHECK(header.shape.size() == 1,
             "{} holds an array of shape {}; expected a 1-D array of token ids. HINT: flatten it: "
             "numpy.save(path, ids.reshape(-1)).",
             path, c10::str(c10::IntArrayRef(header.shape)));
  const bool integer = header.uint16 || header.dtype == torch::kInt || header.dtype == torch::kLong;
  VOLT_CHECK(integer,
             "{} holds {} elements; expected token ids as int32, int64 or uint16. HINT: numpy.save(path, "
             "ids.astype('int32')).",
             path, header.uint16 ? "uint16" : c10::toString(header.dtype));
  const int64_t count = header.shape[0];
  torch::Tensor raw = torch::empty({count}, torch::TensorOptions(header.dtype));
  std::ifstream in(path, std::ios::binary);
  in.seekg(header.data_offset);
  in.read(static_cast<char*>(raw.data_ptr()), static_cast<std::streamsize>(raw.nbytes()));
  VOLT_CHECK(in.gcount() == static_cast<std::streamsize>(raw.nbytes()),
             "{}: cannot read its {} token ids. HINT: write the file again.", path, count);
  // uint16 is stored as int16 over the same bytes (LibTorch 1.13 has no uint16): widen, then undo the sign.
  if (header.uint16) return raw.to(torch::kLong).bitwise_and(0xFFFF);
  return raw.to(torch::kLong);
}

TokenEvalResult evaluate_tokens(Gpt& model, const torch::Tensor& tokens, int64_t block_size, int64_t batch_size) {
  const GptConfig& config = model->config();
  VOLT_CHECK(block_size >= 2 && block_size <= config.n_positions,
             "--block-size={} cannot cut evaluation windows for this model: expected 2..n_positions={}. HINT: a "
             "window predicts its tokens 2..L from their prefixes and must fit the model's context.",
             block_size, config.n_positions);
  VOLT_CHECK(batch_size >= 1, "evaluate_tokens: batch_size={} must be at least 1. HINT: 16 windows.", batch_size);
  VOLT_CHECK(tokens.dim() == 1 && tokens.scalar_type() == torch::kLong,
             "evaluate_tokens: expected token ids [N] of int64, got {} of {}. HINT: read_token_ids reads a .npy file.",
             c10::str(tokens.sizes()), c10::toString(tokens.scalar_type()));
  const int64_t windows = tokens.numel() / block_size;
  VOLT_CHECK(windows >= 1,
             "{} token ids make no window of --block-size={}. HINT: pass more tokens or a smaller --block-size.",
             tokens.numel(), block_size);
  // Check the ids here, where the position in the file is known (forward would name only the batch's).
  const torch::Tensor used = tokens.narrow(0, 0, windows * block_size);
  const torch::Tensor bad = torch::logical_or(used < 0, used >= config.vocab_size).nonzero();
  if (bad.numel() > 0) {
    const int64_t at = bad[0][0].item<int64_t>();
    throw volt::Error(fmt::format(
        "token id {} at position {} of the file is outside the model's vocabulary of vocab_size={} (ids 0..{}). "
        "HINT: the tokens must come from the model's own tokenizer (its config.json's vocab_size).",
        used[at].item<int64_t>(), at, config.vocab_size, config.vocab_size - 1));
  }

  const bool was_training = model->is_training();
  model->eval();
  torch::NoGradGuard no_grad;
  const torch::Device device = model->parameters().front().device();
  const torch::Tensor batches = used.view({windows, block_size});
  double total = 0;  // summed in double: many windows of float sums lose digits
  for (int64_t begin = 0; begin < windows; begin += batch_size) {
    const torch::Tensor ids = batches.narrow(0, begin, std::min(batch_size, windows - begin)).to(device);
    const torch::Tensor logits = model->forward(ids).narrow(1, 0, block_size - 1);
    const torch::Tensor targets = ids.narrow(1, 1, block_size - 1);
    total += torch::nn::functional::cross_entropy(
                 logits.reshape({-1, logits.size(-1)}).to(torch::kFloat), targets.reshape({-1}),
                 torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                 .item<double>();
  }
  model->train(was_training);
  const int64_t predicted = windows * (block_size - 1);
  return {.loss = total / static_cast<double>(predicted), .windows = windows, .predicted_tokens = predicted};
}

}  // namespace gpt
