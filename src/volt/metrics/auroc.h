// The area under the ROC curve, binary and multiclass one-vs-rest (torchmetrics' BinaryAUROC and
// MulticlassAUROC with average "macro"), computed exactly from every example's score.
#pragma once

#include <cstdint>

#include "volt/metrics/metric.h"

namespace volt {

/// Options of AUROC, e.g. `volt::AUROC auroc({.num_classes = 10})`.
struct AurocOptions {
  /// 0 (the default): binary, preds [N] scores of class 1 (probabilities or logits) and target
  /// [N] 0/1 (integer or bool). 2 or more: multiclass, preds [N, C] scores and target [N] class
  /// indices; the value is the mean of the C one-vs-rest AUROCs.
  int64_t num_classes = 0;
};

/// The probability that a random positive example scores above a random negative one, ties
/// counting one half (the Mann-Whitney U statistic over P x N pairs), exact: every score is kept
/// (as float32, states "preds" and "target", concatenated across processes) and ranked at
/// compute. A class without positive or without negative examples has AUROC 0, as in
/// torchmetrics. Compute returns a 0-dim double tensor.
class AUROC : public Metric {
 public:
  /// Binary by default; see AurocOptions.
  explicit AUROC(const AurocOptions& options = {});
  /// The options this metric was made with (validated).
  const AurocOptions& options() const { return options_; }

 protected:
  void update_state(const torch::Tensor& preds, const torch::Tensor& target) override;
  torch::Tensor compute_from(const States& states) const override;

 private:
  AurocOptions options_;
};

}  // namespace volt
