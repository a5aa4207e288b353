// Datasets the trainer draws batches from.
//
// A map-style dataset either returns one example per index (get, batched by a collate function,
// as in PyTorch) or gathers whole batches itself (get_batch: one index_select per tensor for an
// in-memory dataset). Either way any batch of an epoch can be produced directly from its indices,
// so resuming mid-epoch needs no replay of earlier batches, and loader workers may produce
// batches in any order while the step sees them in order.
#pragma once

#include <torch/types.h>

#include <memory>
#include <vector>

#include "volt/data/batch.h"

namespace volt {

/// A finite, indexable set of examples. Implement get() (examples, collated by the loader) or
/// get_batch() (whole batches), or both. Loader workers call them from several threads at once,
/// so they must not change the dataset (they are const) or draw from the global generator.
class Dataset {
 public:
  virtual ~Dataset() = default;
  /// The number of examples.
  virtual int64_t size() const = 0;
  /// Example `index`. The default throws: a dataset that only makes whole batches need not
  /// implement it.
  virtual Example get(int64_t index) const;
  /// The examples at `indices` (an int64 tensor) as one batch. The default is default_collate
  /// of get(i) for each index.
  virtual Batch get_batch(const torch::Tensor& indices) const;
};

/// `dataset.get(i)` for each index in `indices` (an int64 tensor), in order: what a collate
/// function takes.
std::vector<Example> examples_at(const Dataset& dataset, const torch::Tensor& indices);

/// The examples of `dataset` at `indices`, in that order (PyTorch's Subset): a train/validation
/// split of one data set without copying it.
class Subset : public Dataset {
 public:
  /// `indices` is an int64 tensor of indices into `dataset`; throws volt::Error when one is out of range.
  Subset(std::shared_ptr<const Dataset> dataset, torch::Tensor indices);
  int64_t size() const override;
  Example get(int64_t index) const override;
  Batch get_batch(const torch::Tensor& indices) const override;

 private:
  std::shared_ptr<const Dataset> dataset_;
  torch::Tensor indices_;
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
