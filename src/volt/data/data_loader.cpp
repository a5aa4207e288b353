#include "volt/data/data_loader.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>

#include <algorithm>

#include "volt/core/error.h"
#include "volt/data/batch_workers.h"

namespace volt {

namespace {

/// SplitMix64's finalizer: a cheap bijective mix, so nearby (seed, epoch, index) give unrelated seeds.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// The batch a thread is making: example_generator's seed and epoch.
struct BatchContext {
  bool active = false;
  uint64_t seed = 0;
  int64_t epoch = 0;
};
thread_local BatchContext current_batch;

/// Sets current_batch while a batch is made (restored after, also when making it throws).
class BatchContextScope {
 public:
  BatchContextScope(uint64_t seed, int64_t epoch) : saved_(current_batch) { current_batch = {true, seed, epoch}; }
  ~BatchContextScope() { current_batch = saved_; }
  BatchContextScope(const BatchContextScope&) = delete;
  BatchContextScope& operator=(const BatchContextScope&) = delete;

 private:
  BatchContext saved_;
};

}  // namespace

at::Generator example_generator(int64_t index) {
  const BatchContext& c = current_batch;
  const uint64_t seed = c.active ? mix(mix(c.seed) ^ static_cast<uint64_t>(c.epoch)) : 0;
  return at::make_generator<at::CPUGeneratorImpl>(mix(seed ^ mix(static_cast<uint64_t>(index))));
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  VOLT_CHECK(dataset_ != nullptr, "DataLoader got a null dataset.");
  VOLT_CHECK(options_.batch_size >= 1, "DataLoader batch_size={} must be at least 1. HINT: pass a positive batch size.",
             options_.batch_size);
  VOLT_CHECK(options_.num_workers >= 0,
             "DataLoader num_workers={} must be >= 0. HINT: 0 makes batches on the training thread; 2-8 threads "
             "make them ahead of it.",
             options_.num_workers);
  VOLT_CHECK(options_.prefetch_factor >= 1,
             "DataLoader prefetch_factor={} must be at least 1 (batches each worker makes ahead). HINT: PyTorch's "
             "default is 2.",
             options_.prefetch_factor);
  if (options_.persistent_workers && options_.num_workers > 0)
    persistent_ = std::make_shared<internal::BatchWorkers>(options_.num_workers);
  configure(1, 0, 0);
}

void DataLoader::configure(int64_t num_replicas, int64_t rank, uint64_t default_seed, bool pad, bool contiguous) {
  SamplerOptions sampler;
  sampler.shuffle = options_.shuffle;
  sampler.seed = options_.seed.value_or(default_seed);
  seed_ = sampler.seed;
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
  const torch::Tensor indices = epoch_indices_.narrow(0, start, length);
  const BatchContextScope context(seed_, epoch_);
  Batch batch;
  if (options_.collate) {
    batch = options_.collate(examples_at(*dataset_, indices));
  } else {
    batch = dataset_->get_batch(indices);
  }
  // Pinned where the batch is made (a worker thread, when there are workers), so that the step's
  // copy to the GPU does not block.
  if (options_.pin_memory && torch::cuda::is_available()) {
    batch = batch.map([](const torch::Tensor& t) { return t.is_cuda() ? t : t.pin_memory(); });
  }
  return batch;
}

BatchStream DataLoader::stream(int64_t first, int64_t end) const {
  VOLT_INTERNAL_ASSERT(epoch_ >= 0, "stream() before set_epoch()");
  VOLT_INTERNAL_ASSERT(0 <= first && first <= end && end <= num_batches(), "stream [{}, {}) of {} batches", first, end,
                       num_batches());
  std::shared_ptr<internal::BatchWorkers> workers;
  if (options_.num_workers > 0) {
    // A persistent pool busy with another pass (a copy of this loader streaming too) cannot be
    // shared: this pass gets threads of its own.
    workers = persistent_ && !persistent_->busy() ? persistent_
                                                  : std::make_shared<internal::BatchWorkers>(options_.num_workers);
  }
  return BatchStream(*this, std::move(workers), first, end);
}

BatchStream::BatchStream(const DataLoader& loader, std::shared_ptr<internal::BatchWorkers> workers, int64_t first,
                         int64_t end)
    : loader_(std::make_shared<const DataLoader>(loader)), workers_(std::move(workers)), next_(first), end_(end) {
  if (!workers_) return;
  const std::shared_ptr<const DataLoader> source = loader_;
  const int64_t epoch = loader.epoch();
  workers_->start([source](int64_t index) { return source->batch(index); },
                  [epoch](int64_t index) { return fmt::format("batch {} of epoch {}", index, epoch); }, first, end,
                  loader.options().num_workers * loader.options().prefetch_factor);
}

BatchStream::BatchStream(BatchStream&& other) noexcept
    : loader_(std::move(other.loader_)), workers_(std::move(other.workers_)), next_(other.next_), end_(other.end_) {
  other.next_ = other.end_;
}

BatchStream::~BatchStream() {
  if (workers_) workers_->cancel();
}

Batch BatchStream::next() {
  VOLT_INTERNAL_ASSERT(has_next(), "BatchStream::next() after the last batch ({})", end_);
  const int64_t index = next_++;
  return workers_ ? workers_->take(index) : loader_->batch(index);
}

}  // namespace volt
