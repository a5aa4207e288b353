#include "volt/data/data_loader.h"

#include <algorithm>

#include "volt/core/error.h"

namespace volt {

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  VOLT_CHECK(dataset_ != nullptr, "DataLoader got a null dataset.");
  VOLT_CHECK(options_.batch_size >= 1, "DataLoader batch_size={} must be at least 1. HINT: pass a positive batch size.",
             options_.batch_size);
  configure(1, 0, 0);
}

void DataLoader::configure(int64_t num_replicas, int64_t rank, uint64_t default_seed, bool pad, bool contiguous) {
  SamplerOptions sampler;
  sampler.shuffle = options_.shuffle;
  sampler.seed = options_.seed.value_or(default_seed);
  sampler.num_replicas = num_replicas;
  sampler.rank = rank;
  // Padding keeps every rank at the same batch count; a user who drops the last batch also
  // drops the uneven tail, as PyTorch's DistributedSampler(drop_last=True) does.
  sampler.drop_last = options_.drop_last;
  sampler.pad = pad;
  sampler.contiguous = contiguous;
  sampler_ = std::make_shared<DistributedSampler>(dataset_->size(), sampler);
  epoch_ = -1;
}

void DataLoader::set_epoch(int64_t epoch) {
  VOLT_INTERNAL_ASSERT(defined(), "set_epoch on an empty DataLoader");
  if (epoch == epoch_) return;
  epoch_indices_ = sampler_->indices(epoch);
  epoch_ = epoch;
}

int64_t DataLoader::num_batches() const {
  if (!defined()) return 0;
  const int64_t n = sampler_->num_samples();
  return options_.drop_last ? n / options_.batch_size : (n + options_.batch_size - 1) / options_.batch_size;
}

Batch DataLoader::batch(int64_t index) const {
  VOLT_INTERNAL_ASSERT(epoch_ >= 0, "batch() before set_epoch()");
  VOLT_INTERNAL_ASSERT(index >= 0 && index < num_batches(), "batch {} of {}", index, num_batches());
  const int64_t start = index * options_.batch_size;
  const int64_t length = std::min(options_.batch_size, epoch_indices_.size(0) - start);
  return dataset_->get_batch(epoch_indices_.narrow(0, start, length));
}

}  // namespace volt
