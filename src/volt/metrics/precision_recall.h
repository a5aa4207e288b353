// Multiclass precision, recall and F1 score (torchmetrics' MulticlassPrecision, MulticlassRecall,
// MulticlassF1Score), from the same per-class counts.
#pragma once

#include "volt/metrics/stat_scores.h"

namespace volt {

/// tp / (tp + fp): of the examples predicted as a class, the fraction that are. kMacro averages
/// the classes' precisions, kMicro sums the counts first (for top_k 1 micro precision equals
/// accuracy). A class with no predictions has precision 0, as in torchmetrics. Compute returns a
/// 0-dim double tensor.
class MulticlassPrecision : public MulticlassStatScores {
 public:
  /// E.g. `volt::MulticlassPrecision precision({.num_classes = 10, .average = volt::Average::kMacro})`.
  explicit MulticlassPrecision(const ClassificationOptions& options);

 protected:
  torch::Tensor compute_from(const States& states) const override;
};

/// tp / (tp + fn): of the examples of a class, the fraction predicted as it (the same value as
/// MulticlassAccuracy with the same options). A class with no examples has recall 0. Compute returns a
/// 0-dim double tensor.
class MulticlassRecall : public MulticlassStatScores {
 public:
  /// E.g. `volt::MulticlassRecall recall({.num_classes = 10, .average = volt::Average::kMacro})`.
  explicit MulticlassRecall(const ClassificationOptions& options);

 protected:
  torch::Tensor compute_from(const States& states) const override;
};

/// 2 tp / (2 tp + fp + fn), the harmonic mean of precision and recall, per class for kMacro or
/// over the summed counts for kMicro; 0 where nothing was predicted or expected. kMacro leaves
/// out only the classes with no tp, fp or fn, also with top_k > 1 (as torchmetrics). Compute
/// returns a 0-dim double tensor.
class MulticlassF1Score : public MulticlassStatScores {
 public:
  /// E.g. `volt::MulticlassF1Score f1({.num_classes = 10, .average = volt::Average::kMacro})`.
  explicit MulticlassF1Score(const ClassificationOptions& options);

 protected:
  torch::Tensor compute_from(const States& states) const override;
};

}  // namespace volt
