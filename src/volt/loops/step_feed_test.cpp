#include "volt/loops/step_feed.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "volt/core/error.h"

namespace volt {
namespace {

/// A stream of one shard of `n` examples (target = index).
class Numbers : public IterableDataset {
 public:
  explicit Numbers(int64_t n) : n_(n) {}
  int64_t num_shards() const override { return 1; }
  std::unique_ptr<ExampleReader> open(int64_t) const override { return std::make_unique<Reader>(n_); }

 private:
  class Reader : public ExampleReader {
   public:
    explicit Reader(int64_t n) : n_(n) {}
    std::optional<Example> next() override {
      if (i_ >= n_) return std::nullopt;
      Example e;
      e.target = torch::tensor(i_++);
      return e;
    }

   private:
    int64_t n_;
    int64_t i_ = 0;
  };
  int64_t n_;
};

/// Sums among `parties` threads, round by round: each party's k-th all_reduce_async joins round
/// k and returns at once; waiting on it blocks until every party joined the round.
class FakeSums {
 public:
  explicit FakeSums(int parties) : parties_(parties) {}

  /// One party's side: the Collectives a StepFeed of that thread counts through.
  class Party : public Collectives {
   public:
    using Collectives::all_reduce;
    explicit Party(FakeSums& sums) : sums_(sums) {}
    int64_t world_size() const override { return sums_.parties_; }
    int64_t rank() const override { return 0; }
    void all_reduce(torch::Tensor&, Reduce) override { ADD_FAILURE() << "StepFeed only counts"; }
    std::vector<torch::Tensor> all_gather(const torch::Tensor& t) override { return {t}; }
    ReduceWork all_reduce_async(double value, Reduce op) override {
      EXPECT_EQ(op, Reduce::kSum);
      FakeSums& sums = sums_;
      const int64_t r = round_++;
      {
        const std::lock_guard<std::mutex> lock(sums.mutex_);
        sums.rounds_[r].first += static_cast<int64_t>(value);
        ++sums.rounds_[r].second;
      }
      sums.changed_.notify_all();
      return ReduceWork([&sums, r] {
        std::unique_lock<std::mutex> lock(sums.mutex_);
        sums.changed_.wait(lock, [&] { return sums.rounds_[r].second == sums.parties_; });
        return static_cast<double>(sums.rounds_[r].first);
      });
    }

   private:
    FakeSums& sums_;
    int64_t round_ = 0;
  };

 private:
  int parties_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<int64_t, std::pair<int64_t, int>> rounds_;
};

/// Two processes whose every collective is a test failure.
class NoCollectives : public Collectives {
 public:
  using Collectives::all_reduce;
  int64_t world_size() const override { return 2; }
  int64_t rank() const override { return 0; }
  void all_reduce(torch::Tensor&, Reduce) override { ADD_FAILURE() << "a collective"; }
  std::vector<torch::Tensor> all_gather(const torch::Tensor& t) override {
    ADD_FAILURE() << "a collective";
    return {t, t};
  }
  ReduceWork all_reduce_async(double value, Reduce) override {
    ADD_FAILURE() << "a collective";
    return ReduceWork(value * 2);
  }
};

struct Step {
  int64_t first_target;
  bool joined;
  double weight;
  bool last;
};

std::vector<Step> run_pass(int64_t examples, Collectives& collectives, int64_t first = 0) {
  DataLoaderOptions options;
  options.batch_size = 2;
  DataLoader loader(std::static_pointer_cast<const IterableDataset>(std::make_shared<Numbers>(examples)), options);
  loader.set_epoch(0);
  StepFeed feed(loader, first, std::nullopt, collectives);
  std::vector<Step> steps;
  while (feed.has_step()) {
    const StepInput in = feed.take();
    steps.push_back({in.batch.target[0].item<int64_t>(), in.joined, in.weight, feed.last()});
  }
  EXPECT_TRUE(feed.finished());
  return steps;
}

TEST(StepFeed, UnevenStreamsStepTogetherUntilAllAreDry) {
  FakeSums sums(2);
  FakeSums::Party party_a(sums), party_b(sums);
  std::vector<Step> a;
  std::vector<Step> b;
  std::thread other([&] { b = run_pass(5, party_b); });  // 3 batches
  a = run_pass(10, party_a);                             // 5 batches
  other.join();
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_FALSE(a[i].joined);
    EXPECT_EQ(a[i].first_target, static_cast<int64_t>(2 * i));
    EXPECT_EQ(a[i].weight, i < 3 ? 1.0 : 2.0) << i;  // alone, its loss stands for both
    EXPECT_EQ(b[i].joined, i >= 3) << i;
    EXPECT_EQ(b[i].weight, i < 3 ? 1.0 : 0.0) << i;
    EXPECT_EQ(b[i].first_target, i < 3 ? static_cast<int64_t>(2 * i) : 0) << i;  // the replay is batch 0
    EXPECT_EQ(a[i].last, i == 4);
    EXPECT_EQ(b[i].last, i == 4);
  }
}

TEST(StepFeed, AResumedDryProcessStillStepsAlong) {
  FakeSums sums(2);
  FakeSums::Party party_a(sums), party_b(sums);
  std::vector<Step> a;
  std::vector<Step> b;
  std::thread other([&] { b = run_pass(5, party_b, /*first=*/4); });
  a = run_pass(10, party_a, /*first=*/4);
  other.join();
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_TRUE(b[0].joined);
  EXPECT_EQ(b[0].first_target, 0);
  EXPECT_EQ(a[0].first_target, 8);
  EXPECT_TRUE(a[0].last && b[0].last);
}

TEST(StepFeed, AProcessWithoutAnyDataFailsOnEveryProcess) {
  FakeSums sums(2);
  FakeSums::Party party_a(sums), party_b(sums);
  std::string other_error;
  std::thread other([&] {
    try {
      run_pass(0, party_b);
    } catch (const Error& e) {
      other_error = e.what();
    }
  });
  EXPECT_THROW(run_pass(6, party_a), Error);
  other.join();
  EXPECT_NE(other_error.find("1 of 2 processes have no data"), std::string::npos) << other_error;
}

TEST(StepFeed, OneProcessNeedsNoSum) {
  const std::vector<Step> steps = run_pass(5, local_collectives());
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_TRUE(steps[2].last);
  EXPECT_FALSE(steps[1].last);
}

TEST(StepFeed, AMapStyleLoaderStepsItsCount) {
  DataLoader loader(std::make_shared<TensorDataset>(torch::zeros({10, 1}), torch::arange(10)), {3});
  loader.set_epoch(0);
  NoCollectives two;  // a map-style loader steps its count: no collective at all
  StepFeed feed(loader, 1, 4, two);
  int64_t steps = 0;
  while (feed.has_step()) {
    const StepInput in = feed.take();
    EXPECT_EQ(in.weight, 1.0);
    EXPECT_EQ(feed.last(), steps == 2);
    ++steps;
  }
  EXPECT_EQ(steps, 3);
}

}  // namespace
}  // namespace volt
