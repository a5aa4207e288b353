// In-process Collectives for unit tests (base, metrics, nn): one thread per simulated rank,
// exchanging tensors through shared memory the way c10d's collectives exchange them between
// processes.
#pragma once

#include <torch/torch.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "volt/base/collectives.h"

namespace volt::testing {

/// The meeting point of `ranks` threads: exchange() returns every thread's tensor, by rank.
class ThreadGroup {
 public:
  explicit ThreadGroup(int64_t ranks) : slots_(static_cast<size_t>(ranks)) {}
  /// How many threads take part.
  int64_t size() const { return static_cast<int64_t>(slots_.size()); }
  /// Deposits `mine`, waits for every other rank's, and returns all of them (an all-gather of
  /// equal shapes, which is what c10d offers).
  std::vector<torch::Tensor> exchange(int64_t rank, const torch::Tensor& mine) {
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t round = round_;
    slots_[static_cast<size_t>(rank)] = mine.clone();
    if (++arrived_ == size()) {
      result_ = slots_;
      arrived_ = 0;
      ++round_;
      changed_.notify_all();
    } else {
      changed_.wait(lock, [&] { return round_ != round; });
    }
    return result_;
  }

  /// Queues `message` from rank `from` to rank `to` (a PeerChannel's send; never blocks).
  void post(int64_t from, int64_t to, std::pair<int64_t, std::vector<char>> message) {
    const std::lock_guard<std::mutex> lock(mutex_);
    mail_[{from, to}].push_back(std::move(message));
    changed_.notify_all();
  }
  /// The oldest message from `from` to `to`, waiting for one.
  std::pair<int64_t, std::vector<char>> take(int64_t from, int64_t to) {
    std::unique_lock<std::mutex> lock(mutex_);
    auto& queue = mail_[{from, to}];
    changed_.wait(lock, [&] { return !queue.empty(); });
    auto message = std::move(queue.front());
    queue.pop_front();
    return message;
  }

 private:
  std::mutex mutex_;
  std::map<std::pair<int64_t, int64_t>, std::deque<std::pair<int64_t, std::vector<char>>>> mail_;
  std::condition_variable changed_;
  std::vector<torch::Tensor> slots_;
  std::vector<torch::Tensor> result_;
  int64_t arrived_ = 0;
  int64_t round_ = 0;
};

/// One rank's Collectives over a ThreadGroup.
class ThreadCollectives : public Collectives {
 public:
  /// Rank `rank` of `group`.
  ThreadCollectives(ThreadGroup& group, int64_t rank) : group_(group), rank_(rank) {}
  int64_t world_size() const override { return group_.size(); }
  int64_t rank() const override { return rank_; }
  void all_reduce(torch::Tensor& values, Reduce op) override {
    const std::vector<torch::Tensor> all = group_.exchange(rank_, values);
    torch::Tensor result = all[0].clone();
    for (size_t r = 1; r < all.size(); ++r) {
      switch (op) {
        case Reduce::kSum:
        case Reduce::kMean:
          result += all[r];
          break;
        case Reduce::kMax:
          result = torch::maximum(result, all[r]);
          break;
        case Reduce::kMin:
          result = torch::minimum(result, all[r]);
          break;
      }
    }
    if (op == Reduce::kMean) result /= static_cast<double>(all.size());
    values.copy_(result);
  }
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor) override {
    return all_gather_uneven(tensor, [this](const torch::Tensor& t) { return group_.exchange(rank_, t); });
  }
  /// A channel to rank `peer` through the group's mail.
  std::unique_ptr<PeerChannel> connect_peer(int64_t peer) override {
    struct Channel : PeerChannel {
      Channel(ThreadGroup& group, int64_t me, int64_t peer) : group(group), me(me), peer(peer) {}
      void send(int64_t tag, const std::vector<char>& bytes) override { group.post(me, peer, {tag, bytes}); }
      std::pair<int64_t, std::vector<char>> receive() override { return group.take(peer, me); }
      ThreadGroup& group;
      int64_t me;
      int64_t peer;
    };
    return std::make_unique<Channel>(group_, rank_, peer);
  }

 private:
  ThreadGroup& group_;
  int64_t rank_;
};

/// Runs `body(rank, collectives)` on `world` threads at once and waits for all of them; rethrows
/// the first exception a thread threw (a test's failed expectation is recorded by GoogleTest).
inline void run_ranks(int64_t world, const std::function<void(int64_t, Collectives&)>& body) {
  ThreadGroup group(world);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        ThreadCollectives collectives(group, r);
        body(r, collectives);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

}  // namespace volt::testing
