#include "volt/metrics/accuracy.h"

namespace volt {

MulticlassAccuracy::MulticlassAccuracy(const ClassificationOptions& options)
    : MulticlassStatScores("MulticlassAccuracy", options) {}

torch::Tensor MulticlassAccuracy::compute_from(const States& states) const {
  // tp + fn of a class is the number of its examples.
  return reduce(states.at("tp"), states.at("tp") + states.at("fn"), states);
}

}  // namespace volt
