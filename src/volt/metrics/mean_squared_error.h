// The mean squared error (torchmetrics' MeanSquaredError).
#pragma once

#include "volt/metrics/metric.h"

namespace volt {

/// The mean of (preds - target)^2 over every element of every update: states
/// "sum_squared_error" (double) and "total" (int64 element count), summed across processes.
/// preds and target have the same shape (any). Compute returns a 0-dim double tensor; NaN
/// before any update (0 / 0).
class MeanSquaredError : public Metric {
 public:
  /// The metric, with nothing to configure.
  MeanSquaredError();

 protected:
  void update_state(const torch::Tensor& preds, const torch::Tensor& target) override;
  torch::Tensor compute_from(const States& states) const override;
};

}  // namespace volt
