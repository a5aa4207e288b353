// Multiclass accuracy, top-k included (torchmetrics' MulticlassAccuracy).
#pragma once

#include "volt/metrics/stat_scores.h"

namespace volt {

/// The fraction of examples whose target is among their top_k predicted classes (kMicro), or
/// the mean over classes of that fraction among each class's examples (kMacro). Compute returns
/// a 0-dim double tensor; 0 before any update.
class MulticlassAccuracy : public MulticlassStatScores {
 public:
  /// E.g. `volt::MulticlassAccuracy top5({.num_classes = 100, .top_k = 5})`.
  explicit MulticlassAccuracy(const ClassificationOptions& options);

 protected:
  torch::Tensor compute_from(const States& states) const override;
};

}  // namespace volt
