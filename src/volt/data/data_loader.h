// The loader a module returns from its *_dataloader hooks.
#pragma once

#include <ATen/core/Generator.h>

#include <memory>
#include <optional>

#include "volt/data/dataset.h"
#include "volt/data/distributed_sampler.h"

namespace volt {

namespace internal {
class BatchWorkers;
}  // namespace internal

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
  /// Batches the dataset's examples (Dataset::get) for a custom layout, e.g. padding; unset:
  /// the dataset's get_batch (default_collate of its examples unless it gathers whole batches).
  CollateFn collate;
  /// Threads that make batches ahead of the step (0: the step's thread makes each when needed).
  /// Any count gives the same batches in the same order.
  int64_t num_workers = 0;
  /// Batches each worker may have made ahead of the step (PyTorch's prefetch_factor).
  int64_t prefetch_factor = 2;
  /// Keep the worker threads from one pass over the data to the next instead of starting them
  /// for each epoch (and each validation).
  bool persistent_workers = false;
  /// Make batches in pinned host memory, so that their copy to the GPU does not block the step
  /// (PyTorch's pin_memory). Only where a CUDA device is present; on CPU it changes nothing.
  bool pin_memory = false;
};

class DataLoader;

/// A generator for the random augmentations of example `index` (a random crop, a flip): seeded
/// from the loader's seed, the epoch and `index`, so that an example gets the same augmentation
/// whichever worker thread makes its batch and after a resume, and another one every epoch.
/// Datasets call it while the loader makes a batch; elsewhere it is seeded from `index` alone.
at::Generator example_generator(int64_t index);

/// Batches [first, end) of a loader's current epoch, in order: made by its workers ahead of
/// time, or one by one on this thread without workers. Destroying it stops the workers' pass.
class BatchStream {
 public:
  /// Whether batches remain.
  bool has_next() const { return next_ < end_; }
  /// The next batch; a worker's exception comes out here as volt::Error naming the batch.
  Batch next();
  /// Stops the workers' pass (a persistent loader keeps its threads for the next one).
  ~BatchStream();
  /// Moves the pass to a new owner.
  BatchStream(BatchStream&& other) noexcept;
  BatchStream& operator=(BatchStream&&) = delete;
  BatchStream(const BatchStream&) = delete;
  BatchStream& operator=(const BatchStream&) = delete;

 private:
  friend class DataLoader;
  BatchStream(const DataLoader& loader, std::shared_ptr<internal::BatchWorkers> workers, int64_t first, int64_t end);
  std::shared_ptr<const DataLoader> loader_;  // a copy: later set_epoch calls do not change this pass
  std::shared_ptr<internal::BatchWorkers> workers_;
  int64_t next_ = 0;
  int64_t end_ = 0;
};

/// Produces the batches of one epoch by index. Copies share the dataset.
class DataLoader {
 public:
  /// An empty loader: `defined()` is false (a module without that stage returns one).
  DataLoader() = default;
  /// A loader over `dataset`; throws volt::Error on a non-positive batch size or worker count.
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
  /// The epoch set_epoch fixed last (-1 before the first).
  int64_t epoch() const { return epoch_; }
  /// Batches per epoch for this process.
  int64_t num_batches() const;
  /// Batch `index` of the current epoch, made on this thread.
  Batch batch(int64_t index) const;
  /// Batches [first, end) of the current epoch, made ahead by the workers (see BatchStream).
  BatchStream stream(int64_t first, int64_t end) const;

 private:
  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  // persistent_workers: the threads, shared by copies of this loader and kept between passes.
  std::shared_ptr<internal::BatchWorkers> persistent_;
  std::shared_ptr<DistributedSampler> sampler_;
  uint64_t seed_ = 0;  // the sampler's seed, also the augmentations' (example_generator)
  torch::Tensor epoch_indices_;
  int64_t epoch_ = -1;
};

}  // namespace volt
