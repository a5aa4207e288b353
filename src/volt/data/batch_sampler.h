// Batch samplers: which examples of a map-style dataset form each batch, when that is not
// "batch_size consecutive indices of the epoch's order" (PyTorch's batch_sampler).
//
// Sequences of varying length are the case: a batch is padded to its longest sequence, so a
// batch of random lengths wastes most of its compute on padding. A batch sampler groups
// similar lengths. Like DistributedSampler, its batches are a pure function of (seed, epoch,
// processes, rank), so every process agrees on the split and a resume reaches the same batches.
#pragma once

#include <cstdint>
#include <vector>

namespace volt {

/// What a batch sampler's batches depend on: the loader's settings and the epoch.
struct BatchSamplerContext {
  /// Reorder the batches every epoch (DataLoaderOptions::shuffle).
  bool shuffle = false;
  /// The order's seed: the same on every process (the loader's seed).
  uint64_t seed = 0;
  /// The epoch whose batches are asked for.
  int64_t epoch = 0;
  /// Drop the last incomplete batch, and the batches that do not divide evenly among the
  /// processes (DataLoaderOptions::drop_last).
  bool drop_last = false;
  /// How many processes share the batches, and which one asks.
  int64_t num_replicas = 1;
  int64_t rank = 0;  ///< see num_replicas
  /// Repeat batches so that every process gets as many (training); off for evaluation, where
  /// processes may differ by one batch and no example is counted twice.
  bool pad = true;
  /// Give each process one contiguous run of the batches in order (prediction, whose outputs are
  /// concatenated by rank); needs pad off.
  bool contiguous = false;
};

/// Groups a map-style dataset's examples into batches. Set as DataLoaderOptions::batch_sampler.
class BatchSampler {
 public:
  virtual ~BatchSampler() = default;
  /// The number of examples the sampler was built for (the dataset's size must match).
  virtual int64_t size() const = 0;
  /// The batches (dataset indices) process `context.rank` reads in `context.epoch`, in order.
  /// Must be a pure function of `context`, and give the same number of batches for every epoch.
  virtual std::vector<std::vector<int64_t>> batches(const BatchSamplerContext& context) const = 0;
};

/// Options of LengthBucketBatchSampler.
struct LengthBucketOptions {
  /// Examples per batch (the last batch of the epoch may have fewer).
  int64_t batch_size = 1;
  /// With shuffle, the epoch's random order is cut into pools of this many batches, and each
  /// pool is sorted by length before it is cut into batches (torchtext's BucketIterator, fairseq's
  /// length grouping): larger pools pad less, smaller ones keep more randomness.
  int64_t pool_batches = 100;
};

/// Batches of examples of similar length: per epoch, the examples are shuffled (seed, epoch),
/// each pool of `pool_batches` batches sorted by length and cut into batches of `batch_size`, and
/// the batches shuffled again; processes take every num_replicas-th batch. Without shuffle the
/// whole dataset is sorted by length (evaluation: the least padding). Every example is in one
/// batch per epoch (plus repeats to even out processes, as DistributedSampler pads).
///
/// Example, for token sequences of varying length and a collate that pads them:
/// `volt::DataLoader(dataset, {.shuffle = true, .collate = pad_sequences,
///     .batch_sampler = std::make_shared<volt::LengthBucketBatchSampler>(lengths, volt::LengthBucketOptions{.batch_size
///     = 32})})`.
class LengthBucketBatchSampler : public BatchSampler {
 public:
  /// `lengths[i]` is example i's length (any measure that padding grows with). Throws
  /// volt::Error for an empty list, a negative length, or batch_size or pool_batches below 1.
  LengthBucketBatchSampler(std::vector<int64_t> lengths, LengthBucketOptions options);

  int64_t size() const override { return static_cast<int64_t>(lengths_.size()); }
  std::vector<std::vector<int64_t>> batches(const BatchSamplerContext& context) const override;
  /// The lengths it groups.
  const std::vector<int64_t>& lengths() const { return lengths_; }

 private:
  std::vector<int64_t> lengths_;
  LengthBucketOptions options_;
};

/// Deals an epoch's batches (the same list on every process) to the processes as
/// DistributedSampler deals examples: with drop_last the uneven tail is dropped, else (with pad)
/// the first batches are repeated to even out the processes; then process `rank` takes every
/// num_replicas-th batch from its rank (or, contiguous, one run of them). For BatchSampler
/// implementations: a pure function, so every process calls it with its own rank.
std::vector<std::vector<int64_t>> deal_batches(std::vector<std::vector<int64_t>> batches,
                                               const BatchSamplerContext& context);

}  // namespace volt
