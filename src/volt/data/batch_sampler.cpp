#include "volt/data/batch_sampler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <numeric>
#include <utility>

#include "volt/core/error.h"

namespace volt {

namespace {

// A permutation of [0, n) drawn from a private generator seeded by (seed, epoch) and a stream
// number, so that the sampler's two shuffles differ and never touch the global RNG.
std::vector<int64_t> permutation(int64_t n, uint64_t seed, int64_t epoch, uint64_t stream) {
  auto generator =
      at::make_generator<at::CPUGeneratorImpl>(seed + static_cast<uint64_t>(epoch) + stream * 0x9E3779B97F4A7C15ULL);
  const torch::Tensor order = torch::randperm(n, generator, torch::kLong);
  const int64_t* data = order.data_ptr<int64_t>();
  return {data, data + n};
}

}  // namespace

std::vector<std::vector<int64_t>> deal_batches(std::vector<std::vector<int64_t>> batches,
                                               const BatchSamplerContext& context) {
  const int64_t n = context.num_replicas;
  VOLT_CHECK(n >= 1 && context.rank >= 0 && context.rank < n,
             "deal_batches: rank {} of num_replicas {} is out of range. HINT: 0 <= rank < num_replicas.", context.rank,
             n);
  VOLT_CHECK(!context.contiguous || !context.pad,
             "deal_batches: contiguous runs of batches cannot be padded (pad=true). HINT: set pad=false; contiguous "
             "runs are for prediction, where no example may be repeated.");
  const int64_t count = static_cast<int64_t>(batches.size());
  if (context.drop_last) {
    batches.resize(static_cast<size_t>(count / n * n));  // every process the same count
  } else if (context.pad && count % n != 0 && count > 0) {
    for (int64_t i = 0; i < n - count % n; ++i) batches.push_back(batches[static_cast<size_t>(i % count)]);
  }
  const int64_t total = static_cast<int64_t>(batches.size());
  std::vector<std::vector<int64_t>> mine;
  if (context.contiguous) {
    // The first total % n processes hold one batch more, as many as the strided split gives them.
    const int64_t first = context.rank * (total / n) + std::min(context.rank, total % n);
    const int64_t length = total / n + (context.rank < total % n ? 1 : 0);
    for (int64_t i = first; i < first + length; ++i) mine.push_back(std::move(batches[static_cast<size_t>(i)]));
    return mine;
  }
  for (int64_t i = context.rank; i < total; i += n) mine.push_back(std::move(batches[static_cast<size_t>(i)]));
  return mine;
}

LengthBucketBatchSampler::LengthBucketBatchSampler(std::vector<int64_t> lengths, LengthBucketOptions options)
    : lengths_(std::move(lengths)), options_(options) {
  VOLT_CHECK(!lengths_.empty(),
             "LengthBucketBatchSampler was given no lengths. HINT: pass one length per example of the dataset.");
  VOLT_CHECK(options_.batch_size >= 1, "LengthBucketBatchSampler batch_size={} must be at least 1. HINT: {}",
             options_.batch_size, "pass the examples per batch, e.g. {.batch_size = 32}.");
  VOLT_CHECK(options_.pool_batches >= 1,
             "LengthBucketBatchSampler pool_batches={} must be at least 1. HINT: 100 (the default) sorts 100 "
             "batches' worth of examples at a time.",
             options_.pool_batches);
  const auto negative = std::find_if(lengths_.begin(), lengths_.end(), [](int64_t l) { return l < 0; });
  VOLT_CHECK(negative == lengths_.end(),
             "LengthBucketBatchSampler: example {} has length {}. HINT: lengths are sizes, at least 0.",
             negative - lengths_.begin(), negative == lengths_.end() ? 0 : *negative);
}

std::vector<std::vector<int64_t>> LengthBucketBatchSampler::batches(const BatchSamplerContext& context) const {
  const int64_t n = size();
  std::vector<int64_t> order(static_cast<size_t>(n));
  if (context.shuffle) {
    order = permutation(n, context.seed, context.epoch, 0);
  } else {
    std::iota(order.begin(), order.end(), 0);
  }
  // Sort each pool by length; without shuffle the pool is everything. Stable: equal lengths keep
  // the (random) order they came in.
  const int64_t pool = context.shuffle ? options_.batch_size * options_.pool_batches : n;
  const auto by_length = [&](int64_t a, int64_t b) {
    return lengths_[static_cast<size_t>(a)] < lengths_[static_cast<size_t>(b)];
  };
  for (int64_t start = 0; start < n; start += pool) {
    std::stable_sort(order.begin() + start, order.begin() + std::min(n, start + pool), by_length);
  }
  // Pools are whole batches, so only the epoch's last batch can be short.
  std::vector<std::vector<int64_t>> batches;
  for (int64_t start = 0; start < n; start += options_.batch_size) {
    const int64_t end = std::min(n, start + options_.batch_size);
    if (context.drop_last && end - start < options_.batch_size) break;
    batches.emplace_back(order.begin() + start, order.begin() + end);
  }
  if (context.shuffle) {
    // The batches in random order, or every epoch would run from short to long within a pool.
    const std::vector<int64_t> shuffled =
        permutation(static_cast<int64_t>(batches.size()), context.seed, context.epoch, 1);
    std::vector<std::vector<int64_t>> reordered;
    reordered.reserve(batches.size());
    for (int64_t i : shuffled) reordered.push_back(std::move(batches[static_cast<size_t>(i)]));
    batches = std::move(reordered);
  }
  return deal_batches(std::move(batches), context);
}

}  // namespace volt
