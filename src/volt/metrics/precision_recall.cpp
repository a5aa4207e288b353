#include "volt/metrics/precision_recall.h"

namespace volt {

Precision::Precision(const ClassificationOptions& options) : MulticlassStatScores("MulticlassPrecision", options) {}

torch::Tensor Precision::compute_from(const States& states) const {
  return reduce(states.at("tp"), states.at("tp") + states.at("fp"), states);
}

Recall::Recall(const ClassificationOptions& options) : MulticlassStatScores("MulticlassRecall", options) {}

torch::Tensor Recall::compute_from(const States& states) const {
  return reduce(states.at("tp"), states.at("tp") + states.at("fn"), states);
}

F1Score::F1Score(const ClassificationOptions& options) : MulticlassStatScores("MulticlassF1Score", options) {}

torch::Tensor F1Score::compute_from(const States& states) const {
  const torch::Tensor& tp = states.at("tp");
  return reduce(2 * tp, 2 * tp + states.at("fp") + states.at("fn"), states);
}

}  // namespace volt
