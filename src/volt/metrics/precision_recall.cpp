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
  // torchmetrics' F-beta reduction does not pass top_k on to its macro weights
  // (_adjust_weights_safe_divide in 1.3.2), so a class predicted among the top k but never
  // expected counts in the mean with F1 0, where precision and recall leave it out.
  return reduce(2 * tp, 2 * tp + states.at("fp") + states.at("fn"), states, /*top_k_needs_examples=*/false);
}

}  // namespace volt
