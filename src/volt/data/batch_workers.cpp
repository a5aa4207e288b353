#include "volt/data/batch_workers.h"

#include <exception>

#include "volt/core/error.h"

namespace volt::internal {

BatchWorkers::BatchWorkers(int64_t num_workers) {
  VOLT_INTERNAL_ASSERT(num_workers >= 1, "BatchWorkers with {} threads", num_workers);
  threads_.reserve(static_cast<size_t>(num_workers));
  for (int64_t w = 0; w < num_workers; ++w) threads_.emplace_back([this, w] { work(w); });
}

BatchWorkers::~BatchWorkers() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    exiting_ = true;
    running_ = false;
    ++pass_;
  }
  work_ready_.notify_all();
  batch_ready_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void BatchWorkers::start(std::function<Batch(int64_t)> make, std::function<std::string(int64_t)> describe,
                         int64_t first, int64_t end, int64_t ahead) {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    ++pass_;
    made_.clear();
    make_ = std::move(make);
    describe_ = std::move(describe);
    next_ = first;
    taken_ = first;
    end_ = end;
    ahead_ = std::max<int64_t>(ahead, 1);
    failed_ = false;
    running_ = first < end;
  }
  work_ready_.notify_all();
}

void BatchWorkers::cancel() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    ++pass_;
    running_ = false;
    made_.clear();
    // The functions may hold the loader that holds these workers: let go of them between passes.
    make_ = nullptr;
    describe_ = nullptr;
  }
  batch_ready_.notify_all();
}

bool BatchWorkers::busy() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return running_;
}

Batch BatchWorkers::take(int64_t index) {
  std::unique_lock<std::mutex> lock(mutex_);
  VOLT_INTERNAL_ASSERT(running_ && index == taken_ && index < end_, "take({}) but the pass expects {} of [.., {})",
                       index, taken_, end_);
  batch_ready_.wait(lock, [&] { return exiting_ || made_.count(index) > 0; });
  VOLT_INTERNAL_ASSERT(!exiting_, "BatchWorkers destroyed while batch {} was awaited", index);
  Made made = std::move(made_.at(index));
  made_.erase(index);
  taken_ = index + 1;
  if (taken_ >= end_) running_ = false;
  if (!made.error.empty()) {
    running_ = false;
    failed_ = true;
    made_.clear();
    throw Error(made.error);
  }
  lock.unlock();
  work_ready_.notify_all();  // room for one more batch ahead
  return std::move(made.batch);
}

void BatchWorkers::work(int64_t worker) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    work_ready_.wait(lock,
                     [&] { return exiting_ || (running_ && !failed_ && next_ < end_ && next_ < taken_ + ahead_); });
    if (exiting_) return;
    const int64_t index = next_++;
    const int64_t pass = pass_;
    const std::function<Batch(int64_t)> make = make_;
    const std::function<std::string(int64_t)> describe = describe_;
    lock.unlock();
    Made made;
    try {
      made.batch = make(index);
    } catch (const std::exception& e) {
      made.error = fmt::format("DataLoader worker {} failed making {}: {}", worker, describe(index), e.what());
    } catch (...) {
      made.error =
          fmt::format("DataLoader worker {} failed making {} (a non-standard exception)", worker, describe(index));
    }
    lock.lock();
    if (pass != pass_) continue;              // the pass was cancelled or restarted meanwhile
    if (!made.error.empty()) failed_ = true;  // start nothing more; the consumer hears of it in order
    made_.emplace(index, std::move(made));
    batch_ready_.notify_all();
  }
}

}  // namespace volt::internal
