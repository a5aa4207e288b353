#include "volt/data/stream_lanes.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <exception>

#include "volt/core/error.h"
#include "volt/data/batch_context.h"

namespace volt {

int64_t ExampleReader::skip(int64_t count) {
  int64_t skipped = 0;
  while (skipped < count && next()) ++skipped;
  return skipped;
}

std::string IterableDataset::describe(int64_t shard) const { return fmt::format("shard {}", shard); }

namespace internal {

std::vector<int64_t> lane_shards(int64_t num_shards, bool shuffle, uint64_t seed, int64_t epoch, int64_t num_replicas,
                                 int64_t rank, int64_t num_lanes, int64_t lane) {
  std::vector<int64_t> order(static_cast<size_t>(num_shards));
  for (int64_t i = 0; i < num_shards; ++i) order[static_cast<size_t>(i)] = i;
  if (shuffle) {
    // Fisher-Yates from a 64-bit engine: the same order on every process and platform.
    std::mt19937_64 random(mix(mix(seed) ^ static_cast<uint64_t>(epoch)));
    for (int64_t i = num_shards - 1; i > 0; --i) {
      const auto j = static_cast<int64_t>(random() % static_cast<uint64_t>(i + 1));
      std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
    }
  }
  std::vector<int64_t> mine;
  for (int64_t i = rank + num_replicas * lane; i < num_shards; i += num_replicas * num_lanes) {
    mine.push_back(order[static_cast<size_t>(i)]);
  }
  return mine;
}

Lane::Lane(std::shared_ptr<const IterableDataset> dataset, std::vector<int64_t> shards, LaneOptions options,
           uint64_t seed)
    : dataset_(std::move(dataset)), shards_(std::move(shards)), options_(std::move(options)), random_(seed) {}

ExampleReader& Lane::reader() {
  if (!reader_) {
    reader_ = dataset_->open(shards_[shard_]);
    read_in_shard_ = 0;
    VOLT_CHECK(reader_ != nullptr, "{} opened no reader. HINT: IterableDataset::open must return a reader.",
               dataset_->describe(shards_[shard_]));
  }
  return *reader_;
}

void Lane::next_shard() {
  reader_.reset();
  ++shard_;
}

std::optional<Example> Lane::read() {
  for (; shard_ < shards_.size(); next_shard()) {
    if (std::optional<Example> example = reader().next()) {
      ++read_in_shard_;
      return example;
    }
  }
  return std::nullopt;
}

std::optional<Example> Lane::next_example() {
  if (options_.shuffle_buffer <= 0) return read();
  // A shuffle buffer (torchdata's Shuffler): fill it, then hand out a random slot and refill it.
  const auto capacity = static_cast<size_t>(options_.shuffle_buffer);
  while (buffer_.size() < capacity) {
    std::optional<Example> example = read();
    if (!example) break;
    buffer_.push_back(std::move(*example));
  }
  if (buffer_.empty()) return std::nullopt;
  const size_t pick = static_cast<size_t>(random_() % buffer_.size());
  std::swap(buffer_[pick], buffer_.back());
  Example out = std::move(buffer_.back());
  buffer_.pop_back();
  return out;
}

int64_t Lane::skip_examples(int64_t count) {
  // Through a shuffle buffer the position depends on every example read: replay it.
  if (options_.shuffle_buffer > 0) {
    int64_t skipped = 0;
    while (skipped < count && next_example()) ++skipped;
    return skipped;
  }
  int64_t skipped = 0;
  while (skipped < count && shard_ < shards_.size()) {
    const int64_t n = reader().skip(count - skipped);
    skipped += n;
    read_in_shard_ += n;
    if (skipped < count) next_shard();
  }
  return skipped;
}

std::optional<Batch> Lane::next_batch() {
  const BatchContextScope context(options_.seed, options_.epoch);
  std::vector<Example> examples;
  examples.reserve(static_cast<size_t>(options_.batch_size));
  while (static_cast<int64_t>(examples.size()) < options_.batch_size) {
    std::optional<Example> example = next_example();
    if (!example) break;
    examples.push_back(std::move(*example));
  }
  if (examples.empty()) return std::nullopt;
  if (options_.drop_last && static_cast<int64_t>(examples.size()) < options_.batch_size) return std::nullopt;
  Batch batch = options_.collate ? options_.collate(std::move(examples)) : default_collate(std::move(examples));
  if (options_.pin_memory && torch::cuda::is_available()) {
    batch = batch.map([](const torch::Tensor& t) { return t.is_cuda() ? t : t.pin_memory(); });
  }
  return batch;
}

bool Lane::skip_batch() {
  const BatchContextScope context(options_.seed, options_.epoch);
  const int64_t n = skip_examples(options_.batch_size);
  return n > 0 && !(options_.drop_last && n < options_.batch_size);
}

std::string Lane::position() const {
  if (shard_ >= shards_.size()) return "the end of its shards";
  return fmt::format("{}, example {}", dataset_->describe(shards_[shard_]), read_in_shard_);
}

LaneStream::LaneStream(std::vector<Lane> lanes, int64_t first, bool workers, int64_t ahead)
    : lanes_(std::move(lanes)), threaded_(workers && !lanes_.empty()), ahead_(std::max<int64_t>(ahead, 1)) {
  for (size_t l = 0; l < lanes_.size(); ++l) active_.push_back(l);
  // A resume: skip the batches already trained, taking them in the same turns as next() does.
  for (int64_t b = 0; b < first && !active_.empty();) {
    const size_t lane = active_[turn_];
    if (lanes_[lane].skip_batch()) {
      turn_ = (turn_ + 1) % active_.size();
      ++b;
    } else {
      active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(turn_));
      if (!active_.empty()) turn_ %= active_.size();
    }
  }
  if (!threaded_) return;
  workers_ = std::vector<Worker>(lanes_.size());
  for (const size_t lane : active_) workers_[lane].thread = std::thread([this, lane] { work(lane); });
}

LaneStream::~LaneStream() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  for (Worker& w : workers_)
    if (w.thread.joinable()) w.thread.join();
}

void LaneStream::work(size_t lane) {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || static_cast<int64_t>(workers_[lane].made.size()) < ahead_; });
      if (stopping_) return;
    }
    Made made;
    try {
      made.batch = lanes_[lane].next_batch();
    } catch (const std::exception& e) {
      made.error = e.what();
    }
    const bool done = !made.batch;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      workers_[lane].made.push_back(std::move(made));
    }
    changed_.notify_all();
    if (done) return;
  }
}

std::optional<Batch> LaneStream::take(size_t lane) {
  if (!threaded_) {
    try {
      return lanes_[lane].next_batch();
    } catch (const std::exception& e) {
      throw Error(fmt::format("Reading the data failed at {}: {}", lanes_[lane].position(), e.what()));
    }
  }
  Made made;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return !workers_[lane].made.empty(); });
    made = std::move(workers_[lane].made.front());
    workers_[lane].made.pop_front();
  }
  changed_.notify_all();
  if (!made.error.empty()) {
    // The lane stops at its error; the stream stops with it, so the error comes out once.
    active_.clear();
    throw Error(fmt::format("Loader worker {} failed reading {}: {}", lane, lanes_[lane].position(), made.error));
  }
  return std::move(made.batch);
}

std::optional<Batch> LaneStream::next() {
  while (!active_.empty()) {
    const size_t lane = active_[turn_];
    std::optional<Batch> batch = take(lane);
    if (batch) {
      turn_ = (turn_ + 1) % active_.size();
      return batch;
    }
    active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(turn_));
    if (!active_.empty()) turn_ %= active_.size();
  }
  return std::nullopt;
}

}  // namespace internal
}  // namespace volt
