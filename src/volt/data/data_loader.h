// The loader a module returns from its *_dataloader hooks.
#pragma once

#include <memory>
#include <optional>

#include "volt/data/dataset.h"
#include "volt/data/distributed_sampler.h"

namespace volt {

/// Options of DataLoader, with PyTorch's defaults.
///
/// Example: `volt::DataLoader(dataset, {.batch_size = 64, .shuffle = true})`.
struct DataLoaderOptions {
  /// Examples per batch (per process under ddp).
  int64_t batch_size = 1;
  /// Reshuffle every epoch (the order is a pure function of the seed and the epoch).
  bool shuffle = false;
  /// Drop the last incomplete batch.
  bool drop_last = false;
  /// The shuffle seed; unset means the Trainer's seed (0 when the Trainer has none).
  std::optional<uint64_t> seed;
};

/// Produces the batches of one epoch by index. Copies share the dataset.
class DataLoader {
 public:
  /// An empty loader: `defined()` is false (a module without that stage returns one).
  DataLoader() = default;
  /// A loader over `dataset`; throws volt::Error on a non-positive batch size.
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options);

  /// True when this loader has a dataset.
  bool defined() const { return dataset_ != nullptr; }
  /// The options given at construction.
  const DataLoaderOptions& options() const { return options_; }
  /// The dataset (shared).
  const std::shared_ptr<const Dataset>& dataset() const { return dataset_; }

  /// Shards the data across `num_replicas` processes and fills an unset seed; the Trainer
  /// calls this once before the first epoch (`use_distributed_sampler`). `pad` evens out the
  /// shards by repeating examples (training); evaluation passes false so that no example is
  /// counted twice. `contiguous` (with pad false) gives each process one block of the data in
  /// rank order (prediction).
  void configure(int64_t num_replicas, int64_t rank, uint64_t default_seed, bool pad = true, bool contiguous = false);
  /// Fixes the order of `epoch` (like `sampler.set_epoch`); must precede batch().
  void set_epoch(int64_t epoch);
  /// Batches per epoch for this process.
  int64_t num_batches() const;
  /// Batch `index` of the current epoch.
  Batch batch(int64_t index) const;

 private:
  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  std::shared_ptr<DistributedSampler> sampler_;
  torch::Tensor epoch_indices_;
  int64_t epoch_ = -1;
};

}  // namespace volt
