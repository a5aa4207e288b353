// Which examples a process sees in an epoch, and in what order.
#pragma once

#include <cstdint>

#include <torch/types.h>

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
};

/// Splits a dataset into disjoint, equally sized shards, one per replica, like PyTorch's
/// `DistributedSampler`: shuffle with a generator seeded by seed + epoch, pad by repeating the
/// first indices (or drop the tail), then take every num_replicas-th index from `rank`.
/// With one replica this is a plain sequential or random sampler.
class DistributedSampler {
 public:
  /// Throws volt::Error when rank or num_replicas are out of range.
  DistributedSampler(int64_t dataset_size, SamplerOptions options);

  /// This replica's example indices for `epoch` (int64, length num_samples()).
  torch::Tensor indices(int64_t epoch) const;
  /// How many examples this replica reads per epoch (padding included).
  int64_t num_samples() const { return num_samples_; }
  /// How many of this replica's first `count` samples are padding duplicates, so that
  /// evaluation metrics can leave them out.
  int64_t padding_in_first(int64_t count) const;
  /// The options this sampler was built with.
  const SamplerOptions& options() const { return options_; }

 private:
  int64_t dataset_size_;
  SamplerOptions options_;
  int64_t num_samples_;
  int64_t total_size_;
};

}  // namespace volt
