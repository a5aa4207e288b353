#include "volt/data/dataset.h"

#include "volt/core/error.h"

namespace volt {

Example Dataset::get(int64_t index) const {
  throw Error(
      fmt::format("this dataset implements neither get(index) nor get_batch(indices) (asked for example {}). HINT: "
                  "override get() to return one volt::Example, or get_batch() to return a whole volt::Batch.",
                  index));
}

std::vector<Example> examples_at(const Dataset& dataset, const torch::Tensor& indices) {
  const torch::Tensor order = indices.to(torch::kLong).contiguous();
  const int64_t* index = order.data_ptr<int64_t>();
  std::vector<Example> examples;
  examples.reserve(static_cast<size_t>(order.numel()));
  for (int64_t i = 0; i < order.numel(); ++i) examples.push_back(dataset.get(index[i]));
  return examples;
}

Batch Dataset::get_batch(const torch::Tensor& indices) const { return default_collate(examples_at(*this, indices)); }

Subset::Subset(std::shared_ptr<const Dataset> dataset, torch::Tensor indices)
    : dataset_(std::move(dataset)), indices_(indices.to(torch::kLong).contiguous()) {
  VOLT_CHECK(dataset_ != nullptr,
             "Subset got a null dataset. HINT: pass the dataset to take from, e.g. "
             "std::make_shared<TensorDataset>(data, target).");
  VOLT_CHECK(indices_.dim() == 1,
             "Subset takes a 1-d tensor of indices; got shape {}. HINT: flatten them first, e.g. indices.flatten().",
             c10::str(indices_.sizes()));
  if (indices_.numel() > 0) {
    const int64_t low = indices_.min().item<int64_t>();
    const int64_t high = indices_.max().item<int64_t>();
    VOLT_CHECK(low >= 0 && high < dataset_->size(),
               "Subset indices run from {} to {}, but the dataset has {} examples. HINT: take indices in [0, {}).", low,
               high, dataset_->size(), dataset_->size());
  }
}

int64_t Subset::size() const { return indices_.size(0); }

Example Subset::get(int64_t index) const {
  VOLT_CHECK(index >= 0 && index < size(),
             "Subset has {} examples; index {} is out of range. HINT: take indices in [0, {}).", size(), index, size());
  return dataset_->get(indices_.data_ptr<int64_t>()[index]);  // no tensor made per example
}

Batch Subset::get_batch(const torch::Tensor& indices) const {
  return dataset_->get_batch(indices_.index_select(0, indices.to(torch::kLong)));
}

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
