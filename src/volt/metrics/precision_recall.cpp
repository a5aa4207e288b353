#include "volt/metrics/precision_recall.h"

namespace volt {

MulticlassPrecision::MulticlassPrecision(const ClassificationOptions& options)
    : MulticlassStatScores("MulticlassPrecision", options) {}

torch::Tensor MulticlassPrecision::compute_from(const States& states) const {
  return reduce(states.at("tp"), states.at("tp") + states.at("fp"), states);
}

MulticlassRecall::MulticlassRecall(const ClassificationOptions& options)
    : MulticlassStatScores("MulticlassRecall", options) {}

torch::Tensor MulticlassRecall::compute_from(const States& states) const {
  return reduce(states.at("tp"), states.at("tp") + states.at("fn"), states);
}

MulticlassF1Score::MulticlassF1Score(const ClassificationOptions& options)
    : MulticlassStatScores("MulticlassF1Score", options) {}

torch::Tensor MulticlassF1Score::compute_from(const States& states) const {
  const torch::Tensor& tp = states.at("tp");
  return reduce(2 * tp, 2 * tp + states.at("fp") + states.at("fn"), states);
}

}  // namespace volt
