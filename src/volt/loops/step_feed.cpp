#include "volt/loops/step_feed.h"

#include "volt/core/error.h"

namespace volt {

StepFeed::StepFeed(const DataLoader& loader, int64_t first, std::optional<int64_t> end, Collectives& collectives)
    : stream_(loader.stream(first, end)),
      streaming_(loader.streaming()),
      collectives_(collectives),
      world_size_(streaming_ ? collectives.world_size() : 1),
      next_(first),
      end_(end) {
  VOLT_INTERNAL_ASSERT(streaming_ || end_, "a map-style StepFeed needs its end");
}

bool StepFeed::has_step() {
  if (finished_) return false;
  if (reached_end()) {
    finished_ = true;
    return false;
  }
  if (!streaming_) return true;
  if (!with_data_ && !pending_count_) start_count();  // the pass's first step
  read_count();
  // Every process sees the same count, so they all refuse together instead of some training on.
  VOLT_CHECK(next_ != 0 || *with_data_ == 0 || *with_data_ == world_size_,
             "{} of {} processes have no data in this pass of the stream: it has fewer shards than processes x "
             "loader workers. HINT: split the data into more shards (at least processes x num_workers), e.g. "
             "NpyShards' examples_per_shard, or use fewer workers.",
             world_size_ - *with_data_, world_size_);
  if (*with_data_ == 0) finished_ = true;
  return !finished_;
}

StepInput StepFeed::take() {
  VOLT_INTERNAL_ASSERT(!finished_, "StepFeed::take() after the pass ended");
  StepInput input;
  if (!streaming_ || stream_.has_next()) {
    input.batch = stream_.next();
    if (streaming_ && *with_data_ < world_size_) {
      input.weight = static_cast<double>(world_size_) / static_cast<double>(*with_data_);
    }
  } else {
    std::optional<Batch> replay = stream_.replay_batch();
    VOLT_CHECK(replay.has_value(),
               "This process's stream has no data in this epoch, so it cannot step along with the others. HINT: "
               "split the data into at least processes x num_workers shards.");
    input.batch = std::move(*replay);
    input.joined = true;
    input.weight = 0.0;
  }
  ++next_;
  with_data_.reset();
  // Read the next batch ahead and start counting who has one; the step's forward pass gives the
  // count time to arrive before last() needs it.
  if (streaming_ && !reached_end()) start_count();
  return input;
}

void StepFeed::start_count() {
  const int64_t mine = stream_.has_next() ? 1 : 0;
  pending_count_ = world_size_ > 1 ? collectives_.all_reduce_async(static_cast<double>(mine), Reduce::kSum)
                                   : ReduceWork(static_cast<double>(mine));
}

void StepFeed::read_count() {
  if (with_data_) return;
  with_data_ = static_cast<int64_t>(pending_count_->wait());
  pending_count_.reset();
}

bool StepFeed::last() {
  if (reached_end()) {
    finished_ = true;
    return true;
  }
  if (!streaming_) return false;
  read_count();
  if (*with_data_ == 0) finished_ = true;
  return finished_;
}

}  // namespace volt
