// Checks and conversions of the inputs the classification metrics share, so that every metric
// refuses a bad batch with the same words.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>

namespace volt::internal {

/// Checks that `target` is [N] integer class indices in [0, num_classes); `metric` names the
/// metric in the error.
void check_class_target(const torch::Tensor& target, int64_t num_classes, const std::string& metric);

/// The `top_k` predicted classes of each example, [N, top_k] int64: from [N, num_classes]
/// floating-point scores (logits or probabilities; the highest first), or from [N] integer class
/// indices (top_k must be 1). Checks that there are as many examples as `target` has.
torch::Tensor predicted_classes(const torch::Tensor& preds, const torch::Tensor& target, int64_t num_classes,
                                int64_t top_k, const std::string& metric);

/// `t`'s shape and dtype as "[4, 3] Float", for messages.
std::string describe(const torch::Tensor& t);

}  // namespace volt::internal
