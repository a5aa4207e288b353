// How a loader reads a streaming data set (IterableDataset) in one epoch of one process.
//
// The epoch's shard order (shuffled from the seed and the epoch) is dealt to the processes in
// turn, and each process's shards to its lanes in turn: lane l of rank r reads shards
// r + R*l, r + R*(l + L), ... one after another, through an optional shuffle buffer, and cuts
// them into batches. A process has one lane per worker thread (one without workers, read on the
// step's thread) and takes batches from its lanes in turn, skipping lanes that ran dry: PyTorch's
// order for an IterableDataset with workers. Everything is a pure function of (seed, epoch,
// processes, rank, lanes), so a resume reaches the saved position by skipping, not by training.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "volt/data/batch.h"
#include "volt/data/iterable_dataset.h"

namespace volt::internal {

/// What a lane needs to know besides its shards.
struct LaneOptions {
  int64_t batch_size = 1;
  bool drop_last = false;
  /// Examples held to shuffle the stream (0: read in order).
  int64_t shuffle_buffer = 0;
  /// Batches the lane's examples; unset: default_collate.
  CollateFn collate;
  /// Pin batches in host memory (CUDA builds with a GPU).
  bool pin_memory = false;
  /// The loader's seed and the epoch: example_generator's context while reading.
  uint64_t seed = 0;
  int64_t epoch = 0;
};

/// The shards of rank `rank` of `num_replicas`, lane `lane` of `num_lanes`, in epoch `epoch`:
/// a pure function, unit-tested for "every shard exactly once".
std::vector<int64_t> lane_shards(int64_t num_shards, bool shuffle, uint64_t seed, int64_t epoch, int64_t num_replicas,
                                 int64_t rank, int64_t num_lanes, int64_t lane);

/// One sequential stream of batches: a list of shards read one after another.
class Lane {
 public:
  /// `seed` seeds the shuffle buffer (distinct per epoch, rank and lane).
  Lane(std::shared_ptr<const IterableDataset> dataset, std::vector<int64_t> shards, LaneOptions options, uint64_t seed);
  /// The next batch, or none when the lane's shards are read (a last partial batch is dropped
  /// with drop_last).
  std::optional<Batch> next_batch();
  /// Skips one batch without collating it; false when there was none.
  bool skip_batch();
  /// Names where the lane is reading, for errors ("shard 7 (file x.npy), example 12").
  std::string position() const;

 private:
  std::optional<Example> next_example();
  std::optional<Example> read();
  ExampleReader& reader();  // the current shard's, opened on first use
  void next_shard();
  int64_t skip_examples(int64_t count);

  std::shared_ptr<const IterableDataset> dataset_;
  std::vector<int64_t> shards_;
  LaneOptions options_;
  size_t shard_ = 0;  // index into shards_ of the shard being read
  int64_t read_in_shard_ = 0;
  std::unique_ptr<ExampleReader> reader_;
  std::vector<Example> buffer_;  // the shuffle buffer
  std::mt19937_64 random_;
};

/// A process's lanes for one epoch, read on this thread or by one worker thread per lane, and
/// merged in turn.
class LaneStream {
 public:
  /// Positions the stream after `first` batches (a resume) and, with `workers`, starts one
  /// thread per lane that reads up to `ahead` batches before the step takes them.
  LaneStream(std::vector<Lane> lanes, int64_t first, bool workers, int64_t ahead);
  /// Stops and joins the threads.
  ~LaneStream();
  LaneStream(const LaneStream&) = delete;
  LaneStream& operator=(const LaneStream&) = delete;

  /// The next batch in turn, or none when every lane is dry. A worker's exception comes out
  /// here as volt::Error naming the worker and the shard.
  std::optional<Batch> next();

 private:
  struct Made {
    std::optional<Batch> batch;  // none: the lane is dry
    std::string error;           // non-empty: reading threw this
  };
  struct Worker {
    std::deque<Made> made;
    std::thread thread;
  };
  std::optional<Batch> take(size_t lane);
  void work(size_t lane);

  std::vector<Lane> lanes_;
  std::vector<size_t> active_;  // lanes not yet dry, in turn order
  size_t turn_ = 0;             // index into active_ of the lane whose batch is next
  bool threaded_ = false;
  int64_t ahead_ = 1;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool stopping_ = false;
  std::vector<Worker> workers_;
};

}  // namespace volt::internal
