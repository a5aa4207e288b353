// Datasets the trainer draws batches from.
//
// Volt's loaders gather whole batches by index (one index_select per tensor) instead of
// collating single examples, so an in-memory dataset costs one gather per step, and any batch
// of an epoch can be produced directly: resuming mid-epoch needs no replay of earlier batches.
#pragma once

#include <torch/data/example.h>
#include <torch/types.h>

namespace volt {

/// One batch: inputs and targets, as LibTorch's `torch::data::Example<>` (`.data`, `.target`).
using Batch = torch::data::Example<>;

/// A finite, indexable set of examples that yields whole batches.
class Dataset {
 public:
  virtual ~Dataset() = default;
  /// The number of examples.
  virtual int64_t size() const = 0;
  /// The examples at `indices` (an int64 tensor) stacked into one batch.
  virtual Batch get_batch(const torch::Tensor& indices) const = 0;
};

/// A dataset over tensors whose first dimension indexes the examples (like torch's TensorDataset).
class TensorDataset : public Dataset {
 public:
  /// `data` and `target` must have the same first dimension; `target` may be undefined.
  TensorDataset(torch::Tensor data, torch::Tensor target);
  int64_t size() const override;
  Batch get_batch(const torch::Tensor& indices) const override;

 private:
  torch::Tensor data_;
  torch::Tensor target_;
};

}  // namespace volt
