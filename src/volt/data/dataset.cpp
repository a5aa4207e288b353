#include "volt/data/dataset.h"

#include "volt/core/error.h"

namespace volt {

TensorDataset::TensorDataset(torch::Tensor data, torch::Tensor target)
    : data_(std::move(data)), target_(std::move(target)) {
  VOLT_CHECK(data_.defined() && data_.dim() >= 1,
             "TensorDataset needs a data tensor with at least one dimension (the examples). "
             "HINT: pass a tensor shaped [N, ...].");
  VOLT_CHECK(!target_.defined() || target_.size(0) == data_.size(0),
             "TensorDataset got {} inputs but {} targets; expected the same first dimension. "
             "HINT: check that the inputs and targets come from the same split.",
             data_.size(0), target_.size(0));
}

int64_t TensorDataset::size() const { return data_.size(0); }

Batch TensorDataset::get_batch(const torch::Tensor& indices) const {
  return Batch{data_.index_select(0, indices), target_.defined() ? target_.index_select(0, indices) : torch::Tensor()};
}

}  // namespace volt
