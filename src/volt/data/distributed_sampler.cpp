#include "volt/data/distributed_sampler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>

#include "volt/core/error.h"

namespace volt {

DistributedSampler::DistributedSampler(int64_t dataset_size, SamplerOptions options)
    : dataset_size_(dataset_size), options_(options) {
  VOLT_CHECK(options_.num_replicas >= 1,
             "num_replicas={} must be at least 1. HINT: use the world size (1 for a single process).",
             options_.num_replicas);
  VOLT_CHECK(options_.rank >= 0 && options_.rank < options_.num_replicas,
             "rank={} is outside [0, {}). HINT: the rank must be below the world size.", options_.rank,
             options_.num_replicas);
  VOLT_CHECK(dataset_size_ >= 0,
             "dataset size {} is negative. HINT: pass the dataset's size(), the number of examples (0 or more).",
             dataset_size_);
  VOLT_CHECK(!options_.contiguous || !options_.pad,
             "a contiguous DistributedSampler cannot pad its shards (pad=true). HINT: set pad=false; contiguous "
             "blocks are for prediction, where no example may be repeated.");
  const int64_t n = options_.num_replicas;
  if (options_.drop_last && dataset_size_ % n != 0) {
    num_samples_ = dataset_size_ / n;  // drop the tail so every replica gets the same count
    total_size_ = num_samples_ * n;
  } else if (!options_.pad) {
    num_samples_ = (dataset_size_ - options_.rank + n - 1) / n;  // positions rank, rank + n, ... < size
    total_size_ = dataset_size_;
  } else {
    num_samples_ = (dataset_size_ + n - 1) / n;
    total_size_ = num_samples_ * n;
  }
}

torch::Tensor DistributedSampler::indices(int64_t epoch) const {
  torch::Tensor order;
  if (options_.shuffle) {
    // A private generator: the order depends on (seed, epoch) only, never on how much of the
    // global RNG stream the model consumed, so all ranks agree and resume is exact.
    auto generator = at::make_generator<at::CPUGeneratorImpl>(options_.seed + static_cast<uint64_t>(epoch));
    order = torch::randperm(dataset_size_, generator, torch::kLong);
  } else {
    order = torch::arange(dataset_size_, torch::kLong);
  }
  if (total_size_ > dataset_size_ && dataset_size_ > 0) {
    // Pad by repeating from the start (as PyTorch does), as many times as needed.
    const int64_t missing = total_size_ - dataset_size_;
    const int64_t repeats = (missing + dataset_size_ - 1) / dataset_size_;
    order = torch::cat({order, order.repeat({repeats}).narrow(0, 0, missing)});
  } else if (total_size_ < dataset_size_) {
    order = order.narrow(0, 0, total_size_);
  }
  if (options_.num_replicas == 1) return order;
  if (options_.contiguous) {
    // The first size % n ranks hold one example more, exactly as many as the strided split.
    const int64_t n = options_.num_replicas;
    const int64_t start = total_size_ < dataset_size_
                              ? options_.rank * num_samples_  // drop_last: equal blocks
                              : options_.rank * (dataset_size_ / n) + std::min(options_.rank, dataset_size_ % n);
    return order.narrow(0, start, num_samples_).contiguous();
  }
  return order.slice(0, options_.rank, total_size_, options_.num_replicas).contiguous();
}

}  // namespace volt
