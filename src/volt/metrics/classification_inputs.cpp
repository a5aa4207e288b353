#include "volt/metrics/classification_inputs.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <vector>

#include "volt/core/error.h"
#include "volt/core/strings.h"

namespace volt::internal {

std::string describe(const torch::Tensor& t) {
  std::vector<std::string> sizes;
  for (const int64_t size : t.sizes()) sizes.push_back(std::to_string(size));
  return fmt::format("[{}] {}", join(sizes, ", "), c10::toString(t.scalar_type()));
}

namespace {

/// Checks that the class indices `t` (`what`: "target" or "preds") are in [0, num_classes).
void check_range(const torch::Tensor& t, int64_t num_classes, const std::string& metric, const char* what) {
  if (t.numel() == 0) return;
  const int64_t low = t.min().item<int64_t>();
  const int64_t high = t.max().item<int64_t>();
  VOLT_CHECK(low >= 0 && high < num_classes,
             "{}.update() was given {} class {}; expected classes in [0, {}) (num_classes {}). HINT: check "
             "num_classes, and that labels start at 0.",
             metric, what, low < 0 ? low : high, num_classes, num_classes);
}

}  // namespace

void check_class_target(const torch::Tensor& target, int64_t num_classes, const std::string& metric) {
  VOLT_CHECK(
      target.dim() == 1 && !target.is_floating_point() && !target.is_complex() && target.scalar_type() != torch::kBool,
      "{}.update() was given target {}; expected class indices of shape [N] with an integer dtype. HINT: "
      "pass the label of each example (e.g. torch::kLong), not one-hot rows or probabilities.",
      metric, describe(target));
  check_range(target, num_classes, metric, "target");
}

torch::Tensor predicted_classes(const torch::Tensor& preds, const torch::Tensor& target, int64_t num_classes,
                                int64_t top_k, const std::string& metric) {
  const bool scores = preds.dim() == 2 && preds.is_floating_point();
  const bool indices =
      preds.dim() == 1 && !preds.is_floating_point() && !preds.is_complex() && preds.scalar_type() != torch::kBool;
  VOLT_CHECK(scores || indices,
             "{}.update() was given preds {}; expected [N, {}] floating-point scores (logits or probabilities) or "
             "[N] integer class indices. HINT: pass the model's outputs for the batch, or their argmax.",
             metric, describe(preds), num_classes);
  VOLT_CHECK(preds.size(0) == target.size(0),
             "{}.update() was given preds for {} examples but target for {}. HINT: pass the same batch's "
             "predictions and labels.",
             metric, preds.size(0), target.size(0));
  if (indices) {
    VOLT_CHECK(top_k == 1,
               "{}.update() was given class indices {} but top_k is {}; expected [N, {}] scores. HINT: top-k needs "
               "every class's score: pass the logits, not their argmax.",
               metric, describe(preds), top_k, num_classes);
    check_range(preds, num_classes, metric, "preds");
    return preds.to(torch::kLong).unsqueeze(1);
  }
  VOLT_CHECK(preds.size(1) == num_classes,
             "{}.update() was given preds {} with {} classes; expected [N, {}] (num_classes {}). HINT: num_classes "
             "must be the number of the model's outputs.",
             metric, describe(preds), preds.size(1), num_classes, num_classes);
  if (top_k == 1) return preds.argmax(1, /*keepdim=*/true);
  return std::get<1>(preds.topk(top_k, 1));
}

}  // namespace volt::internal
