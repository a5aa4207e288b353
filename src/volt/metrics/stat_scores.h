// The per-class counts (true positives, false positives, false negatives) that MulticlassAccuracy,
// MulticlassPrecision, MulticlassRecall and MulticlassF1Score are computed from, and the options they share.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "volt/metrics/metric.h"

namespace volt {

/// How per-class counts become one value.
enum class Average {
  kMicro,  ///< the counts summed over classes first: every example weighs the same
  kMacro,  ///< the mean of the per-class values: every class weighs the same
};
/// The name of `average` ("micro", "macro").
const char* to_string(Average average);
/// Parses an Average name; throws volt::Error listing the accepted names.
Average parse_average(std::string_view text);

/// Options of the multiclass classification metrics, e.g.
/// `volt::MulticlassAccuracy accuracy({.num_classes = 10, .top_k = 5})`.
struct ClassificationOptions {
  /// The number of classes C, at least 2. preds are [N, C] scores or [N] class indices; target
  /// is [N] class indices in [0, C).
  int64_t num_classes = 0;
  /// An example counts as predicted for the k classes with the highest scores (k > 1 needs
  /// [N, C] scores). MulticlassAccuracy with top_k 5 is "top-5 accuracy".
  int64_t top_k = 1;
  /// kMicro (the default, as torchmetrics' MulticlassAccuracy(task="multiclass")) or kMacro. A class that
  /// occurs in no target and no prediction (with top_k > 1: in no target, except for
  /// MulticlassF1Score) is left out of the macro mean, as in torchmetrics.
  Average average = Average::kMicro;
};
/// Checks `options`; throws volt::Error naming the bad field, what it was and what is allowed.
void validate(const ClassificationOptions& options);

/// Per-class counts over every update: states "tp", "fp", "fn" ([C] int64, summed across
/// processes). An example is a positive of the classes among its top_k predictions.
class MulticlassStatScores : public Metric {
 public:
  /// The options this metric was made with (validated).
  const ClassificationOptions& options() const { return options_; }

 protected:
  /// A metric named `name` with validated `options`.
  MulticlassStatScores(std::string name, const ClassificationOptions& options);
  /// Counts one batch.
  void update_state(const torch::Tensor& preds, const torch::Tensor& target) override;
  /// `numerator / denominator` per class (0 where the denominator is 0, as in torchmetrics),
  /// averaged as options().average says: for kMicro both are summed over classes first. kMacro
  /// leaves out the classes that nothing was about: with no tp, fp or fn, or, where
  /// `top_k_needs_examples` and top_k > 1, with no tp or fn (no examples). torchmetrics applies
  /// the second rule to accuracy, precision and recall, and the first to F1 at every top_k.
  torch::Tensor reduce(const torch::Tensor& numerator, const torch::Tensor& denominator, const States& states,
                       bool top_k_needs_examples = true) const;

 private:
  ClassificationOptions options_;
};

}  // namespace volt
