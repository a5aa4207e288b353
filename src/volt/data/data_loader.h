// The loader a module returns from its *_dataloader hooks.
#pragma once

#include <ATen/core/Generator.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "volt/data/batch_sampler.h"
#include "volt/data/dataset.h"
#include "volt/data/distributed_sampler.h"
#include "volt/data/iterable_dataset.h"

namespace volt {

namespace internal {
class BatchWorkers;
class LaneStream;
}  // namespace internal

/// Options of DataLoader, with PyTorch's defaults.
///
/// Example: `volt::DataLoader(dataset, {.batch_size = 64, .shuffle = true})`.
struct DataLoaderOptions {
  /// Examples per batch (per process under ddp).
  int64_t batch_size = 1;
  /// Reshuffle every epoch (the order is a pure function of the seed and the epoch). A stream
  /// (IterableDataset) shuffles its shard order, and its examples through `shuffle_buffer`.
  bool shuffle = false;
  /// Streams with shuffle: examples held in a buffer that hands them out in random order (as
  /// torchdata's Shuffler); 0 shuffles only the order of the shards. Ignored by map-style datasets.
  int64_t shuffle_buffer = 1000;
  /// Drop the last incomplete batch.
  bool drop_last = false;
  /// The shuffle seed; unset means the Trainer's seed (0 when the Trainer has none).
  std::optional<uint64_t> seed;
  /// Batches the dataset's examples (Dataset::get) for a custom layout, e.g. padding; unset:
  /// the dataset's get_batch (default_collate of its examples unless it gathers whole batches).
  CollateFn collate;
  /// Threads that make batches ahead of the step (0: the step's thread makes each when needed).
  /// For a map-style dataset any count gives the same batches in the same order; a stream is
  /// read by one lane per worker (PyTorch's order), so a resume needs the same count.
  int64_t num_workers = 0;
  /// Batches each worker may have made ahead of the step (PyTorch's prefetch_factor).
  int64_t prefetch_factor = 2;
  /// Keep the worker threads from one pass over the data to the next instead of starting them
  /// for each epoch (and each validation). Streams start their lanes' threads for each pass.
  bool persistent_workers = false;
  /// Make batches in pinned host memory, so that their copy to the GPU does not block the step
  /// (PyTorch's pin_memory). Only where a CUDA device is present; on CPU it changes nothing.
  bool pin_memory = false;
  /// Forms the batches of a map-style dataset instead of cutting the epoch's order into
  /// batch_size runs, e.g. LengthBucketBatchSampler for sequences of varying length. It is
  /// given shuffle, drop_last, the seed, the epoch and the process's rank, and deals batches to
  /// processes itself; batch_size must stay 1 (as PyTorch's batch_sampler requires).
  std::shared_ptr<const BatchSampler> batch_sampler;
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
  /// Whether batches remain. For a stream this reads the next batch ahead to find out.
  bool has_next();
  /// The next batch; a worker's exception comes out here as volt::Error naming the batch.
  Batch next();
  /// A stream's first batch of this epoch for this process (none when it has no data): what a
  /// process whose stream ran dry steps through, at zero weight, while the others finish.
  std::optional<Batch> replay_batch();
  /// Stops the workers' pass (a persistent loader keeps its threads for the next one).
  ~BatchStream();
  /// Moves the pass to a new owner.
  BatchStream(BatchStream&& other) noexcept;
  BatchStream& operator=(BatchStream&&) = delete;
  BatchStream(const BatchStream&) = delete;
  BatchStream& operator=(const BatchStream&) = delete;

 private:
  friend class DataLoader;
  BatchStream(const DataLoader& loader, std::shared_ptr<internal::BatchWorkers> workers, int64_t first,
              std::optional<int64_t> end);
  std::shared_ptr<const DataLoader> loader_;  // a copy: later set_epoch calls do not change this pass
  std::shared_ptr<internal::BatchWorkers> workers_;
  std::shared_ptr<internal::LaneStream> lanes_;  // a stream's lanes
  std::optional<Batch> peeked_;                  // a stream's next batch, read by has_next()
  bool peeked_valid_ = false;
  std::optional<Batch> first_;  // a stream's batch 0, kept for replay_batch()
  int64_t next_ = 0;
  std::optional<int64_t> end_;  // unset: a stream's end
};

/// Produces the batches of one epoch by index. Copies share the dataset.
class DataLoader {
 public:
  /// An empty loader: `defined()` is false (a module without that stage returns one).
  DataLoader() = default;
  /// A loader over `dataset`; throws volt::Error on a non-positive batch size or worker count.
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options);
  /// A loader over a stream of examples (see IterableDataset): it has no length, so an epoch
  /// ends when every process's share of the shards is read.
  DataLoader(std::shared_ptr<const IterableDataset> dataset, DataLoaderOptions options);

  /// True when this loader has a dataset.
  bool defined() const { return dataset_ != nullptr || stream_dataset_ != nullptr; }
  /// True for a loader over an IterableDataset (no num_batches()).
  bool streaming() const { return stream_dataset_ != nullptr; }
  /// The options given at construction.
  const DataLoaderOptions& options() const { return options_; }
  /// The map-style dataset (shared); null for a stream.
  const std::shared_ptr<const Dataset>& dataset() const { return dataset_; }
  /// The stream (shared); null for a map-style dataset.
  const std::shared_ptr<const IterableDataset>& stream_dataset() const { return stream_dataset_; }

  /// Shards the data across `num_replicas` processes and fills an unset seed; the Trainer
  /// calls this once before the first epoch (`use_distributed_sampler`). `pad` evens out the
  /// shards by repeating examples (training); evaluation passes false so that no example is
  /// counted twice. `contiguous` (with pad false) gives each process one block of the data in
  /// rank order (prediction). A stream deals its shards to the processes whatever `pad` says.
  void configure(int64_t num_replicas, int64_t rank, uint64_t default_seed, bool pad = true, bool contiguous = false);
  /// Turns the per-epoch reshuffling (DataLoaderOptions::shuffle) on or off; it takes effect at
  /// the next configure(). The Trainer's overfit_batches turns it off.
  void set_shuffle(bool shuffle) { options_.shuffle = shuffle; }
  /// Fixes the order of `epoch` (like `sampler.set_epoch`); must precede batch().
  void set_epoch(int64_t epoch);
  /// The epoch set_epoch fixed last (-1 before the first).
  int64_t epoch() const { return epoch_; }
  /// How a stream is dealt out, e.g. "205 shards to 2 processes x 2 lanes, batch 64, shuffle
  /// buffer 1000": a position inside an epoch means the same batches only under the same layout.
  /// Empty for a map-style dataset.
  std::string stream_layout() const;
  /// Batches per epoch for this process; only for map-style datasets (a stream has no length).
  int64_t num_batches() const;
  /// Batch `index` of the current epoch, made on this thread.
  Batch batch(int64_t index) const;
  /// Batches [first, end) of the current epoch, made ahead by the workers (see BatchStream);
  /// unset `end`: to the end of the epoch (a stream's end is where its data ends).
  BatchStream stream(int64_t first, std::optional<int64_t> end = std::nullopt) const;

 private:
  friend class BatchStream;
  // A stream's lanes for the current epoch, after `first` batches (see stream_lanes.h).
  std::shared_ptr<internal::LaneStream> lanes(int64_t first, bool workers) const;
  void check_options() const;
  std::shared_ptr<const Dataset> dataset_;
  std::shared_ptr<const IterableDataset> stream_dataset_;
  DataLoaderOptions options_;
  // persistent_workers: the threads, shared by copies of this loader and kept between passes.
  std::shared_ptr<internal::BatchWorkers> persistent_;
  std::shared_ptr<DistributedSampler> sampler_;
  // With a batch_sampler: what it is asked with (all but the epoch), its batch count, and the
  // current epoch's batches (shared by copies, like the tensor of indices).
  BatchSamplerContext batch_context_;
  int64_t sampled_batches_ = 0;
  std::shared_ptr<const std::vector<std::vector<int64_t>>> epoch_batches_;
  uint64_t seed_ = 0;         // the sampler's seed, also the augmentations' (example_generator)
  int64_t num_replicas_ = 1;  // a stream's share of the shards
  int64_t rank_ = 0;
  torch::Tensor epoch_indices_;
  int64_t epoch_ = -1;
};

/// `{loader}`, or none when `loader` is undefined: a single-loader hook as the several-loader
/// hooks' default (LightningModule::val_dataloaders).
std::vector<DataLoader> as_loaders(DataLoader loader);

}  // namespace volt
