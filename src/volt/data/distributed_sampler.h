// Which examples a process sees in an epoch, and in what order.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace volt {

/// Options of DistributedSampler; the defaults are one process reading everything in order.
struct SamplerOptions {
  /// Reorder the examples every epoch.
  bool shuffle = false;
  /// The shuffle order is a pure function of (seed, epoch), the same on every process.
  uint64_t seed = 0;
  /// Drop the tail that does not divide evenly among the replicas instead of padding it.
  bool drop_last = false;
  /// How many processes share the dataset.
  int64_t num_replicas = 1;
  /// Which share this process reads, in [0, num_replicas).
  int64_t rank = 0;
  /// Pad the shards to equal length by repeating examples, so every rank runs the same number
  /// of steps (training). Evaluation turns it off (Lightning's UnrepeatedDistributedSampler):
  /// shards may differ by one example, and no example is counted twice in a metric.
  bool pad = true;
  /// Give each replica one contiguous block of the order (rank 0 the first) instead of every
  /// num_replicas-th example; needs pad = false. Prediction uses it, so that the ranks'
  /// outputs, concatenated by rank, come back in the dataset's order.
  bool contiguous = false;
};

/// Splits a dataset into disjoint shards, one per replica, like PyTorch's `DistributedSampler`:
/// shuffle with a generator seeded by seed + epoch, pad by repeating the first indices (or drop
/// the tail, or neither when `pad` is off), then take every num_replicas-th index from `rank`.
/// With one replica this is a plain sequential or random sampler.
class DistributedSampler {
 public:
  /// Throws volt::Error when rank or num_replicas are out of range.
  DistributedSampler(int64_t dataset_size, SamplerOptions options);

  /// This replica's example indices for `epoch` (int64, length num_samples()).
  torch::Tensor indices(int64_t epoch) const;
  /// How many examples this replica reads per epoch (padding included).
  int64_t num_samples() const { return num_samples_; }
  /// The options this sampler was built with.
  const SamplerOptions& options() const { return options_; }

 private:
  int64_t dataset_size_;
  SamplerOptions options_;
  int64_t num_samples_;
  int64_t total_size_;
};

}  // namespace volt
