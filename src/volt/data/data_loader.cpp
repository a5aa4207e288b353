#include "volt/data/data_loader.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>

#include <algorithm>

#include "volt/core/error.h"
#include "volt/data/batch_context.h"
#include "volt/data/batch_workers.h"
#include "volt/data/stream_lanes.h"

namespace volt {

namespace {

/// The batch a thread is making: example_generator's seed and epoch.
struct BatchContext {
  bool active = false;
  uint64_t seed = 0;
  int64_t epoch = 0;
};
thread_local BatchContext current_batch;

using internal::BatchContextScope;
using internal::mix;

}  // namespace

internal::BatchContextScope::BatchContextScope(uint64_t seed, int64_t epoch)
    : active_(current_batch.active), seed_(current_batch.seed), epoch_(current_batch.epoch) {
  current_batch = {true, seed, epoch};
}

internal::BatchContextScope::~BatchContextScope() { current_batch = {active_, seed_, epoch_}; }

at::Generator example_generator(int64_t index) {
  const BatchContext& c = current_batch;
  const uint64_t seed = c.active ? mix(mix(c.seed) ^ static_cast<uint64_t>(c.epoch)) : 0;
  return at::make_generator<at::CPUGeneratorImpl>(mix(seed ^ mix(static_cast<uint64_t>(index))));
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(std::move(options)) {
  VOLT_CHECK(dataset_ != nullptr,
             "DataLoader got a null dataset. HINT: pass a constructed dataset, e.g. "
             "std::make_shared<TensorDataset>(data, target).");
  check_options();
  VOLT_CHECK(!options_.batch_sampler || options_.batch_sampler->size() == dataset_->size(),
             "DataLoader: the batch sampler was built for {} examples, the dataset has {}. HINT: give the sampler "
             "one length per example of this dataset.",
             options_.batch_sampler ? options_.batch_sampler->size() : 0, dataset_->size());
  if (options_.persistent_workers && options_.num_workers > 0)
    persistent_ = std::make_shared<internal::BatchWorkers>(options_.num_workers);
  configure(1, 0, 0);
}

DataLoader::DataLoader(std::shared_ptr<const IterableDataset> dataset, DataLoaderOptions options)
    : stream_dataset_(std::move(dataset)), options_(std::move(options)) {
  VOLT_CHECK(
      stream_dataset_ != nullptr,
      "DataLoader got a null IterableDataset. HINT: pass a constructed stream, e.g. std::make_shared<NpyShards>(...).");
  check_options();
  VOLT_CHECK(!options_.batch_sampler,
             "DataLoader: a batch_sampler needs a map-style Dataset; this one is a stream (IterableDataset), read in "
             "order. HINT: batch a stream in its reader (group examples of similar length there), or drop the "
             "batch_sampler.");
  VOLT_CHECK(options_.shuffle_buffer >= 0,
             "DataLoader shuffle_buffer={} must be >= 0. HINT: 0 shuffles only the shard order; a few thousand "
             "examples mix the stream well.",
             options_.shuffle_buffer);
  configure(1, 0, 0);
}

void DataLoader::check_options() const {
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
  if (!options_.batch_sampler) return;
  VOLT_CHECK(options_.batch_size == 1,
             "DataLoader was given both batch_size={} and a batch_sampler. HINT: the batch sampler decides the batch "
             "size (e.g. LengthBucketOptions::batch_size); leave DataLoaderOptions::batch_size at 1.",
             options_.batch_size);
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
  num_replicas_ = num_replicas;
  rank_ = rank;
  epoch_ = -1;
  if (streaming()) return;
  sampler_ = std::make_shared<DistributedSampler>(dataset_->size(), sampler);
  if (!options_.batch_sampler) return;
  batch_context_ = BatchSamplerContext{.shuffle = sampler.shuffle,
                                       .seed = sampler.seed,
                                       .epoch = 0,
                                       .drop_last = sampler.drop_last,
                                       .num_replicas = num_replicas,
                                       .rank = rank,
                                       .pad = pad,
                                       .contiguous = contiguous};
  sampled_batches_ = static_cast<int64_t>(options_.batch_sampler->batches(batch_context_).size());
}

void DataLoader::set_epoch(int64_t epoch) {
  VOLT_INTERNAL_ASSERT(defined(), "set_epoch on an empty DataLoader");
  if (epoch == epoch_) return;
  if (options_.batch_sampler) {
    BatchSamplerContext context = batch_context_;
    context.epoch = epoch;
    auto batches = std::make_shared<const std::vector<std::vector<int64_t>>>(options_.batch_sampler->batches(context));
    // The loop counts the epoch's steps once; a sampler whose count moves would cut an epoch short.
    VOLT_CHECK(static_cast<int64_t>(batches->size()) == sampled_batches_,
               "the batch sampler gave {} batches in epoch {} but {} in epoch 0. HINT: a BatchSampler must give "
               "the same number of batches every epoch (fix the batch size, not a token budget).",
               batches->size(), epoch, sampled_batches_);
    epoch_batches_ = std::move(batches);
  } else if (!streaming()) {
    epoch_indices_ = sampler_->indices(epoch);
  }
  epoch_ = epoch;
}

std::vector<DataLoader> as_loaders(DataLoader loader) {
  if (!loader.defined()) return {};
  return {std::move(loader)};
}

std::string DataLoader::stream_layout() const {
  if (!streaming()) return "";
  return fmt::format("{} shards to {} processes x {} lanes, batch {}{}, shuffle {}{}", stream_dataset_->num_shards(),
                     num_replicas_, std::max<int64_t>(1, options_.num_workers), options_.batch_size,
                     options_.drop_last ? " (drop_last)" : "", options_.shuffle ? "on" : "off",
                     options_.shuffle ? fmt::format(" (buffer {})", options_.shuffle_buffer) : "");
}

int64_t DataLoader::num_batches() const {
  if (!defined()) return 0;
  VOLT_INTERNAL_ASSERT(!streaming(), "num_batches() of a stream");
  if (options_.batch_sampler) return sampled_batches_;
  const int64_t n = sampler_->num_samples();
  return options_.drop_last ? n / options_.batch_size : (n + options_.batch_size - 1) / options_.batch_size;
}

Batch DataLoader::batch(int64_t index) const {
  VOLT_INTERNAL_ASSERT(epoch_ >= 0, "batch() before set_epoch()");
  VOLT_INTERNAL_ASSERT(index >= 0 && index < num_batches(), "batch {} of {}", index, num_batches());
  torch::Tensor indices;
  if (options_.batch_sampler) {
    const std::vector<int64_t>& chosen = (*epoch_batches_)[static_cast<size_t>(index)];
    indices = torch::tensor(chosen, torch::kLong);
  } else {
    const int64_t start = index * options_.batch_size;
    const int64_t length = std::min(options_.batch_size, epoch_indices_.size(0) - start);
    indices = epoch_indices_.narrow(0, start, length);
  }
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

BatchStream DataLoader::stream(int64_t first, std::optional<int64_t> end) const {
  VOLT_INTERNAL_ASSERT(epoch_ >= 0, "stream() before set_epoch()");
  if (streaming()) return BatchStream(*this, nullptr, first, end);
  const int64_t last = end.value_or(num_batches());
  VOLT_INTERNAL_ASSERT(0 <= first && first <= last && last <= num_batches(), "stream [{}, {}) of {} batches", first,
                       last, num_batches());
  std::shared_ptr<internal::BatchWorkers> workers;
  if (options_.num_workers > 0) {
    // A persistent pool busy with another pass (a copy of this loader streaming too) cannot be
    // shared: this pass gets threads of its own.
    workers = persistent_ && !persistent_->busy() ? persistent_
                                                  : std::make_shared<internal::BatchWorkers>(options_.num_workers);
  }
  return BatchStream(*this, std::move(workers), first, last);
}

std::shared_ptr<internal::LaneStream> DataLoader::lanes(int64_t first, bool workers) const {
  const int64_t num_lanes = std::max<int64_t>(1, options_.num_workers);
  internal::LaneOptions lane;
  lane.batch_size = options_.batch_size;
  lane.drop_last = options_.drop_last;
  lane.shuffle_buffer = options_.shuffle ? options_.shuffle_buffer : 0;
  lane.collate = options_.collate;
  lane.pin_memory = options_.pin_memory;
  lane.seed = seed_;
  lane.epoch = epoch_;
  std::vector<internal::Lane> lanes;
  for (int64_t l = 0; l < num_lanes; ++l) {
    const uint64_t lane_seed =
        mix(mix(mix(seed_) ^ static_cast<uint64_t>(epoch_)) ^ static_cast<uint64_t>(rank_ * num_lanes + l));
    lanes.emplace_back(stream_dataset_,
                       internal::lane_shards(stream_dataset_->num_shards(), options_.shuffle, seed_, epoch_,
                                             num_replicas_, rank_, num_lanes, l),
                       lane, lane_seed);
  }
  return std::make_shared<internal::LaneStream>(std::move(lanes), first, workers, options_.prefetch_factor);
}

BatchStream::BatchStream(const DataLoader& loader, std::shared_ptr<internal::BatchWorkers> workers, int64_t first,
                         std::optional<int64_t> end)
    : loader_(std::make_shared<const DataLoader>(loader)), workers_(std::move(workers)), next_(first), end_(end) {
  if (loader.streaming()) {
    lanes_ = loader.lanes(first, loader.options().num_workers > 0);
    return;
  }
  if (!workers_) return;
  const std::shared_ptr<const DataLoader> source = loader_;
  const int64_t epoch = loader.epoch();
  workers_->start([source](int64_t index) { return source->batch(index); },
                  [epoch](int64_t index) { return fmt::format("batch {} of epoch {}", index, epoch); }, first, *end,
                  loader.options().num_workers * loader.options().prefetch_factor);
}

BatchStream::BatchStream(BatchStream&& other) noexcept
    : loader_(std::move(other.loader_)),
      workers_(std::move(other.workers_)),
      lanes_(std::move(other.lanes_)),
      peeked_(std::move(other.peeked_)),
      peeked_valid_(other.peeked_valid_),
      first_(std::move(other.first_)),
      next_(other.next_),
      end_(other.end_) {
  other.workers_ = nullptr;
  other.lanes_ = nullptr;
  other.next_ = 0;
  other.end_ = 0;
}

BatchStream::~BatchStream() {
  if (workers_) workers_->cancel();
}

bool BatchStream::has_next() {
  if (end_ && next_ >= *end_) return false;
  if (!lanes_) return true;
  if (!peeked_valid_) {
    peeked_ = lanes_->next();
    peeked_valid_ = true;
  }
  return peeked_.has_value();
}

Batch BatchStream::next() {
  VOLT_INTERNAL_ASSERT(has_next(), "BatchStream::next() after the last batch ({})", next_);
  const int64_t index = next_++;
  if (!lanes_ && workers_) return workers_->take(index);
  if (!lanes_) {
    // As the workers report a failure (and streams do), so that num_workers changes nothing: an
    // exception of the dataset's becomes bad input naming the batch.
    try {
      return loader_->batch(index);
    } catch (const std::exception& e) {
      throw Error(fmt::format("DataLoader failed making batch {} of epoch {}: {}", index, loader_->epoch(), e.what()));
    }
  }
  peeked_valid_ = false;
  Batch batch = std::move(*peeked_);
  peeked_.reset();
  if (index == 0) first_ = batch;
  return batch;
}

std::optional<Batch> BatchStream::replay_batch() {
  VOLT_INTERNAL_ASSERT(lanes_ != nullptr, "replay_batch() of a map-style loader");
  // A resumed pass never read its batch 0: read it again from the epoch's start.
  if (!first_) first_ = loader_->lanes(0, /*workers=*/false)->next();
  return first_;
}

}  // namespace volt
