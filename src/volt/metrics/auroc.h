// The area under the ROC curve, binary and multiclass one-vs-rest (torchmetrics' BinaryAUROC and
// MulticlassAUROC with average "macro"), computed exactly from every example's score.
//
// Both keep every score (as float32) and label in kCat states "preds" and "target",
// concatenated across processes, and rank them at compute: with tied scores given the mean of
// their ranks, AUROC = (sum of the positives' ranks - P (P + 1) / 2) / (P N), the Mann-Whitney
// statistic, i.e. the probability that a random positive scores above a random negative, ties
// counting one half. A class without positive or without negative examples scores 0, as in
// torchmetrics. Compute returns a 0-dim double tensor.
#pragma once

#include <cstdint>

#include "volt/metrics/metric.h"

namespace volt {

/// AUROC of one score per example: preds [N] scores of the positive class (probabilities or
/// logits; only their order matters), target [N] 0/1 labels (integer or bool).
class BinaryAUROC : public Metric {
 public:
  /// The metric, with nothing to configure.
  BinaryAUROC();

 protected:
  void update_state(const torch::Tensor& preds, const torch::Tensor& target) override;
  torch::Tensor compute_from(const States& states) const override;
};

/// The mean of the one-vs-rest AUROCs of every class: preds [N, C] scores, target [N] class
/// indices; class c's AUROC ranks column c with the examples of class c as the positives. A
/// batch of scores not all within [0, 1] is taken for logits and softmaxed first (per row), as
/// torchmetrics does; probabilities are ranked as given.
class MulticlassAUROC : public Metric {
 public:
  /// Over `num_classes` (at least 2) classes, e.g. `volt::MulticlassAUROC auroc(10)`.
  explicit MulticlassAUROC(int64_t num_classes);
  /// The number of classes.
  int64_t num_classes() const { return num_classes_; }

 protected:
  void update_state(const torch::Tensor& preds, const torch::Tensor& target) override;
  torch::Tensor compute_from(const States& states) const override;

 private:
  int64_t num_classes_;
};

}  // namespace volt
