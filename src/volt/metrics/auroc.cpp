#include "volt/metrics/auroc.h"

#include <torch/torch.h>

#include <tuple>

#include "volt/core/error.h"
#include "volt/metrics/classification_inputs.h"

namespace volt {
namespace {

/// The AUROC of `scores` for the examples where `positive` is true against the others, from the
/// ranks of the scores (ties get the mean of their ranks): (sum of the positives' ranks -
/// P (P + 1) / 2) / (P N). 0 when there are no positives or no negatives.
double binary_auroc(const torch::Tensor& scores, const torch::Tensor& positive) {
  const int64_t p = positive.sum().item<int64_t>();
  const int64_t n = positive.numel() - p;
  if (p == 0 || n == 0) return 0.0;
  const auto [sorted, order] = scores.sort();
  const auto [unique, group, counts] = torch::unique_consecutive(sorted, /*return_inverse=*/true,
                                                                 /*return_counts=*/true);
  const torch::Tensor sizes = counts.to(torch::kDouble);
  // The 1-based rank of a tie group's last element, minus half its extra members: the mean rank.
  const torch::Tensor mean_rank = sizes.cumsum(0) - (sizes - 1) / 2;
  const torch::Tensor ranks = mean_rank.index_select(0, group);
  const double positive_ranks = ranks.masked_select(positive.index_select(0, order)).sum().item<double>();
  const auto pd = static_cast<double>(p);
  return (positive_ranks - pd * (pd + 1) / 2) / (pd * static_cast<double>(n));
}

}  // namespace

BinaryAUROC::BinaryAUROC() : Metric("BinaryAUROC") {
  add_state("preds", torch::empty({0}, torch::kFloat), StateReduce::kCat);
  add_state("target", torch::empty({0}, torch::kLong), StateReduce::kCat);
}

void BinaryAUROC::update_state(const torch::Tensor& preds, const torch::Tensor& target) {
  const bool labels = target.dim() == 1 && !target.is_floating_point() && !target.is_complex();
  VOLT_CHECK(labels && preds.dim() == 1 && preds.is_floating_point() && preds.size(0) == target.size(0),
             "{}.update() was given preds {} and target {}; expected [N] floating-point scores of the positive "
             "class and [N] 0/1 labels (integer or bool). HINT: for [N, C] scores use MulticlassAUROC.",
             name(), internal::describe(preds), internal::describe(target));
  if (target.numel() > 0) {
    const int64_t low = target.min().item<int64_t>();
    const int64_t high = target.max().item<int64_t>();
    VOLT_CHECK(low >= 0 && high <= 1,
               "{}.update() was given target label {}; expected 0 or 1. HINT: for more classes use MulticlassAUROC.",
               name(), low < 0 ? low : high);
  }
  append("preds", preds);
  append("target", target);
}

torch::Tensor BinaryAUROC::compute_from(const States& states) const {
  return torch::tensor(binary_auroc(states.at("preds").to(torch::kDouble), states.at("target") == 1), torch::kDouble);
}

MulticlassAUROC::MulticlassAUROC(int64_t num_classes) : Metric("MulticlassAUROC"), num_classes_(num_classes) {
  VOLT_CHECK(num_classes_ >= 2,
             "MulticlassAUROC num_classes is {}; expected at least 2. HINT: for one score per example use "
             "BinaryAUROC.",
             num_classes_);
  add_state("preds", torch::empty({0, num_classes_}, torch::kFloat), StateReduce::kCat);
  add_state("target", torch::empty({0}, torch::kLong), StateReduce::kCat);
}

void MulticlassAUROC::update_state(const torch::Tensor& preds, const torch::Tensor& target) {
  internal::check_class_target(target, num_classes_, name());
  VOLT_CHECK(
      preds.dim() == 2 && preds.is_floating_point() && preds.size(1) == num_classes_ && preds.size(0) == target.size(0),
      "{}.update() was given preds {} for target {}; expected [N, {}] floating-point scores for the N "
      "targets. HINT: pass every class's score (logits or probabilities), not the argmax.",
      name(), internal::describe(preds), internal::describe(target), num_classes_);
  // Logits are made probabilities first, as torchmetrics does with a batch not within [0, 1]:
  // class c's AUROC ranks the examples by column c, and a row of logits may be shifted by any
  // constant (the same prediction), which would reorder the raw column but not the softmax.
  const bool probabilities = preds.numel() == 0 || ((preds >= 0) & (preds <= 1)).all().item<bool>();
  append("preds", probabilities ? preds : preds.softmax(1));
  append("target", target);
}

torch::Tensor MulticlassAUROC::compute_from(const States& states) const {
  const torch::Tensor scores = states.at("preds").to(torch::kDouble);
  const torch::Tensor& target = states.at("target");
  double sum = 0;
  for (int64_t c = 0; c < num_classes_; ++c) sum += binary_auroc(scores.select(1, c), target == c);
  return torch::tensor(sum / static_cast<double>(num_classes_), torch::kDouble);
}

}  // namespace volt
