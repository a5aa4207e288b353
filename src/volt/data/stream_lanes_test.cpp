#include "volt/data/stream_lanes.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <stdexcept>

#include "volt/core/error.h"
#include "volt/data/data_loader.h"

namespace volt {
namespace {

/// Shards of the given sizes holding consecutive example ids (data = target = id); reading
/// example `fail_at` throws.
class CountingStream : public IterableDataset {
 public:
  explicit CountingStream(std::vector<int64_t> sizes, int64_t fail_at = -1)
      : sizes_(std::move(sizes)), fail_at_(fail_at) {
    int64_t offset = 0;
    for (const int64_t size : sizes_) {
      offsets_.push_back(offset);
      offset += size;
    }
    total_ = offset;
  }
  int64_t num_shards() const override { return static_cast<int64_t>(sizes_.size()); }
  std::unique_ptr<ExampleReader> open(int64_t shard) const override {
    return std::make_unique<Reader>(offsets_[shard], offsets_[shard] + sizes_[shard], fail_at_);
  }
  std::string describe(int64_t shard) const override { return fmt::format("part-{}.bin", shard); }
  int64_t total() const { return total_; }

 private:
  class Reader : public ExampleReader {
   public:
    Reader(int64_t next, int64_t end, int64_t fail_at) : next_(next), end_(end), fail_at_(fail_at) {}
    std::optional<Example> next() override {
      if (next_ >= end_) return std::nullopt;
      if (next_ == fail_at_) throw std::runtime_error(fmt::format("example {} is corrupt", next_));
      Example e;
      e.data = torch::tensor({static_cast<float>(next_)});
      e.target = torch::tensor(next_);
      ++next_;
      return e;
    }

   private:
    int64_t next_;
    int64_t end_;
    int64_t fail_at_;
  };
  std::vector<int64_t> sizes_;
  std::vector<int64_t> offsets_;
  int64_t total_ = 0;
  int64_t fail_at_;
};

const std::vector<int64_t> kUneven = {7, 3, 12, 1, 5, 9, 4, 6};

std::vector<std::vector<int64_t>> all_batches(DataLoader& loader, int64_t first = 0) {
  std::vector<std::vector<int64_t>> out;
  BatchStream stream = loader.stream(first);
  while (stream.has_next()) {
    const torch::Tensor t = stream.next().target;
    out.emplace_back(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
  }
  return out;
}

TEST(LaneShards, EveryShardGoesToExactlyOneLaneOfOneProcess) {
  for (const bool shuffle : {false, true}) {
    for (int64_t replicas = 1; replicas <= 3; ++replicas) {
      for (int64_t lanes = 1; lanes <= 3; ++lanes) {
        std::multiset<int64_t> seen;
        for (int64_t rank = 0; rank < replicas; ++rank) {
          for (int64_t lane = 0; lane < lanes; ++lane) {
            for (const int64_t s : internal::lane_shards(10, shuffle, 3, 1, replicas, rank, lanes, lane))
              seen.insert(s);
          }
        }
        ASSERT_EQ(seen.size(), 10u) << replicas << "x" << lanes;
        for (int64_t s = 0; s < 10; ++s) EXPECT_EQ(seen.count(s), 1u) << s;
      }
    }
  }
}

TEST(LaneShards, ShuffleChangesTheOrderWithTheEpoch) {
  EXPECT_NE(internal::lane_shards(50, true, 3, 0, 1, 0, 1, 0), internal::lane_shards(50, true, 3, 1, 1, 0, 1, 0));
  EXPECT_EQ(internal::lane_shards(50, true, 3, 1, 1, 0, 1, 0), internal::lane_shards(50, true, 3, 1, 1, 0, 1, 0));
}

TEST(StreamingLoader, EveryExampleOnceAcrossProcessesAndWorkers) {
  const auto data = std::make_shared<CountingStream>(kUneven);
  for (const bool shuffle : {false, true}) {
    for (int64_t replicas = 1; replicas <= 3; ++replicas) {
      for (const int64_t workers : {0, 2}) {
        std::multiset<int64_t> seen;
        for (int64_t rank = 0; rank < replicas; ++rank) {
          DataLoaderOptions options;
          options.batch_size = 4;
          options.shuffle = shuffle;
          options.shuffle_buffer = 5;
          options.num_workers = workers;
          DataLoader loader(std::static_pointer_cast<const IterableDataset>(data), options);
          loader.configure(replicas, rank, 11);
          loader.set_epoch(2);
          for (const auto& batch : all_batches(loader)) seen.insert(batch.begin(), batch.end());
        }
        ASSERT_EQ(static_cast<int64_t>(seen.size()), data->total()) << replicas << " x " << workers;
        for (int64_t id = 0; id < data->total(); ++id) EXPECT_EQ(seen.count(id), 1u) << id;
      }
    }
  }
}

TEST(StreamingLoader, WorkerThreadsKeepTheLanesOrder) {
  // Lanes follow num_workers; whether a lane is read by its thread or inline must not matter.
  const auto data = std::make_shared<CountingStream>(kUneven);
  std::vector<internal::Lane> a;
  std::vector<internal::Lane> b;
  internal::LaneOptions options;
  options.batch_size = 3;
  options.shuffle_buffer = 4;
  for (int64_t l = 0; l < 2; ++l) {
    a.emplace_back(data, internal::lane_shards(8, true, 1, 0, 1, 0, 2, l), options, 100 + l);
    b.emplace_back(data, internal::lane_shards(8, true, 1, 0, 1, 0, 2, l), options, 100 + l);
  }
  internal::LaneStream threaded(std::move(a), 0, /*workers=*/true, 2);
  internal::LaneStream inline_(std::move(b), 0, /*workers=*/false, 2);
  int64_t batches = 0;
  while (std::optional<Batch> x = threaded.next()) {
    std::optional<Batch> y = inline_.next();
    ASSERT_TRUE(y.has_value());
    EXPECT_TRUE(torch::equal(x->target, y->target)) << "batch " << batches;
    ++batches;
  }
  EXPECT_FALSE(inline_.next().has_value());
  int64_t expected = 0;  // each lane cuts its own batches of 3
  for (int64_t l = 0; l < 2; ++l) {
    int64_t examples = 0;
    for (const int64_t s : internal::lane_shards(8, true, 1, 0, 1, 0, 2, l)) examples += kUneven[s];
    expected += (examples + 2) / 3;
  }
  EXPECT_EQ(batches, expected);
}

TEST(StreamingLoader, AResumedPassContinuesWithTheSameBatches) {
  const auto data = std::make_shared<CountingStream>(kUneven);
  for (const int64_t workers : {0, 3}) {
    for (const int64_t shuffle_buffer : {0, 6}) {
      DataLoaderOptions options;
      options.batch_size = 2;
      options.shuffle = true;
      options.shuffle_buffer = shuffle_buffer;
      options.num_workers = workers;
      DataLoader loader(std::static_pointer_cast<const IterableDataset>(data), options);
      loader.configure(2, 1, 7);
      loader.set_epoch(3);
      const auto whole = all_batches(loader);
      ASSERT_GT(whole.size(), 6u);
      for (const int64_t first : {int64_t{1}, int64_t{5}, static_cast<int64_t>(whole.size())}) {
        const auto rest = all_batches(loader, first);
        EXPECT_EQ(rest, std::vector<std::vector<int64_t>>(whole.begin() + first, whole.end()))
            << workers << " workers, buffer " << shuffle_buffer << ", from " << first;
      }
    }
  }
}

TEST(StreamingLoader, DropLastDropsEachLanesShortBatch) {
  DataLoaderOptions options;
  options.batch_size = 4;
  options.drop_last = true;
  options.num_workers = 2;
  DataLoader loader(std::static_pointer_cast<const IterableDataset>(std::make_shared<CountingStream>(kUneven)),
                    options);
  loader.set_epoch(0);
  const auto batches = all_batches(loader);
  for (const auto& b : batches) EXPECT_EQ(b.size(), 4u);
  EXPECT_EQ(batches.size(), 11u);  // lane 0: 7+12+5+4 = 28 examples -> 7; lane 1: 3+1+9+6 = 19 -> 4
}

TEST(StreamingLoader, ReplayBatchIsTheFirstBatchAlsoAfterAResume) {
  DataLoaderOptions options;
  options.batch_size = 3;
  DataLoader loader(std::static_pointer_cast<const IterableDataset>(std::make_shared<CountingStream>(kUneven)),
                    options);
  loader.set_epoch(0);
  BatchStream fresh = loader.stream(0);
  const Batch first = fresh.next();
  ASSERT_TRUE(fresh.replay_batch().has_value());
  EXPECT_TRUE(torch::equal(fresh.replay_batch()->target, first.target));
  BatchStream resumed = loader.stream(4);
  ASSERT_TRUE(resumed.replay_batch().has_value());
  EXPECT_TRUE(torch::equal(resumed.replay_batch()->target, first.target));
}

TEST(StreamingLoader, AFailingReaderNamesTheWorkerAndTheShard) {
  for (const int64_t workers : {0, 2}) {
    DataLoaderOptions options;
    options.batch_size = 2;
    options.num_workers = workers;
    DataLoader loader(
        std::static_pointer_cast<const IterableDataset>(std::make_shared<CountingStream>(kUneven, /*fail_at=*/12)),
        options);
    loader.set_epoch(0);
    try {
      all_batches(loader);
      ADD_FAILURE() << "no error with " << workers << " workers";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("part-2.bin"), std::string::npos) << what;
      EXPECT_NE(what.find("example 12 is corrupt"), std::string::npos) << what;
      if (workers > 0) {
        EXPECT_NE(what.find("worker 0"), std::string::npos) << what;
      }
    }
  }
}

TEST(StreamingLoader, RefusesANegativeShuffleBuffer) {
  DataLoaderOptions options;
  options.shuffle_buffer = -1;
  EXPECT_THROW(
      DataLoader(std::static_pointer_cast<const IterableDataset>(std::make_shared<CountingStream>(kUneven)), options),
      Error);
}

}  // namespace
}  // namespace volt
