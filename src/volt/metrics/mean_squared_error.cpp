#include "volt/metrics/mean_squared_error.h"

#include <torch/torch.h>

#include "volt/core/error.h"
#include "volt/metrics/classification_inputs.h"

namespace volt {

MeanSquaredError::MeanSquaredError() : Metric("MeanSquaredError") {
  add_state("sum_squared_error", torch::zeros({}, torch::kDouble), StateReduce::kSum);
  add_state("total", torch::zeros({}, torch::kLong), StateReduce::kSum);
}

void MeanSquaredError::update_state(const torch::Tensor& preds, const torch::Tensor& target) {
  VOLT_CHECK(preds.sizes() == target.sizes() && !preds.is_complex() && !target.is_complex(),
             "{}.update() was given preds {} and target {}; expected two real tensors of the same shape. HINT: "
             "squeeze a trailing dimension of 1 (e.g. preds [N, 1] against target [N]).",
             name(), internal::describe(preds), internal::describe(target));
  const torch::Tensor error = preds.to(torch::kDouble) - target.to(preds.device(), torch::kDouble);
  state("sum_squared_error") += error.square().sum().to(state("sum_squared_error").device());
  state("total") += preds.numel();
}

torch::Tensor MeanSquaredError::compute_from(const States& states) const {
  return states.at("sum_squared_error") / states.at("total").to(torch::kDouble);
}

}  // namespace volt
