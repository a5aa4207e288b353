// The multiclass confusion matrix (torchmetrics' MulticlassConfusionMatrix, not normalized).
#pragma once

#include <cstdint>

#include "volt/metrics/metric.h"

namespace volt {

/// How many examples of each target class were predicted as each class: [C, C] int64, rows the
/// target, columns the prediction (state "confmat", summed across processes). preds are
/// [N, C] scores (their argmax counts) or [N] class indices; target [N] class indices.
class MulticlassConfusionMatrix : public Metric {
 public:
  /// A matrix over `num_classes` (at least 2) classes.
  explicit MulticlassConfusionMatrix(int64_t num_classes);
  /// The number of classes.
  int64_t num_classes() const { return num_classes_; }

 protected:
  void update_state(const torch::Tensor& preds, const torch::Tensor& target) override;
  torch::Tensor compute_from(const States& states) const override;

 private:
  int64_t num_classes_;
};

}  // namespace volt
