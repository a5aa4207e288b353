#include "gpt/generate.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "volt/core/error.h"
#include "volt/module/lightning_module.h"

namespace gpt {
namespace {

// The next token of each row, from the last position's logits [B, V].
torch::Tensor pick(torch::Tensor logits, const GenerateOptions& options, at::Generator& generator) {
  logits = logits.to(torch::kCPU, torch::kFloat);
  if (options.temperature == 0) return logits.argmax(-1, /*keepdim=*/true);
  logits = logits / options.temperature;
  if (options.top_k > 0 && options.top_k < logits.size(-1)) {
    // Everything below the k-th largest logit gets probability 0.
    const torch::Tensor kth = std::get<0>(logits.topk(options.top_k, -1)).narrow(-1, options.top_k - 1, 1);
    logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
  }
  return torch::multinomial(torch::softmax(logits, -1), 1, /*replacement=*/false, generator);
}

}  // namespace

torch::Tensor generate(Gpt& model, const torch::Tensor& prompt, const GenerateOptions& options) {
  VOLT_CHECK((prompt.dim() == 1 || prompt.dim() == 2) && prompt.size(-1) >= 1 && prompt.scalar_type() == torch::kLong,
             "generate: the prompt must be int64 token ids [T] or [B, T] with T >= 1, got shape {} of {}. HINT: "
             "tokenize a non-empty prompt.",
             c10::str(prompt.sizes()), c10::toString(prompt.scalar_type()));
  VOLT_CHECK(options.max_new_tokens >= 0, "generate: max_new_tokens={} must be >= 0. HINT: e.g. 200.",
             options.max_new_tokens);
  VOLT_CHECK(std::isfinite(options.temperature) && options.temperature >= 0,
             "generate: temperature={} must be >= 0. HINT: 1 samples from the model's distribution, 0 is greedy.",
             options.temperature);
  VOLT_CHECK(options.top_k >= 0, "generate: top_k={} must be >= 0. HINT: 0 samples among all tokens.", options.top_k);
  torch::NoGradGuard no_grad;
  volt::TrainingModeScope eval(*model, /*training=*/false);
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  const int64_t context = model->config().n_positions;
  torch::Tensor tokens = prompt.dim() == 1 ? prompt.unsqueeze(0) : prompt;
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    const int64_t length = tokens.size(1);
    const torch::Tensor window = tokens.narrow(1, std::max<int64_t>(0, length - context), std::min(length, context));
    const torch::Tensor logits = model->forward(window).select(1, window.size(1) - 1);
    tokens = torch::cat({tokens, pick(logits, options, generator).to(tokens.device())}, 1);
  }
  return prompt.dim() == 1 ? tokens.squeeze(0) : tokens;
}

}  // namespace gpt
