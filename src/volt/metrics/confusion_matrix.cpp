#include "volt/metrics/confusion_matrix.h"

#include <torch/torch.h>

#include "volt/core/error.h"
#include "volt/metrics/classification_inputs.h"

namespace volt {

MulticlassConfusionMatrix::MulticlassConfusionMatrix(int64_t num_classes)
    : Metric("MulticlassConfusionMatrix"), num_classes_(num_classes) {
  VOLT_CHECK(
      num_classes_ >= 2,
      "MulticlassConfusionMatrix num_classes is {}; expected at least 2. HINT: pass the number of the model's outputs.",
      num_classes_);
  add_state("confmat", torch::zeros({num_classes_, num_classes_}, torch::kLong), StateReduce::kSum);
}

void MulticlassConfusionMatrix::update_state(const torch::Tensor& preds, const torch::Tensor& target) {
  internal::check_class_target(target, num_classes_, name());
  const torch::Tensor predicted = internal::predicted_classes(preds, target, num_classes_, 1, name()).squeeze(1);
  // Cell (target, prediction) of the row-major matrix, counted in one pass.
  const torch::Tensor cells = target.to(predicted.device(), torch::kLong) * num_classes_ + predicted;
  torch::Tensor& confmat = state("confmat");
  confmat += cells.bincount({}, num_classes_ * num_classes_).view({num_classes_, num_classes_}).to(confmat.device());
}

torch::Tensor MulticlassConfusionMatrix::compute_from(const States& states) const {
  return states.at("confmat").clone();
}

}  // namespace volt
