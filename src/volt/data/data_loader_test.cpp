#include "volt/data/data_loader.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>

#include "volt/core/error.h"

namespace volt {
namespace {

std::shared_ptr<TensorDataset> counting_dataset(int64_t n) {
  return std::make_shared<TensorDataset>(torch::arange(n, torch::kFloat).unsqueeze(1), torch::arange(n, torch::kLong));
}

TEST(DataLoader, BatchesCoverTheEpochWithAShortLastBatch) {
  DataLoader loader(counting_dataset(10), {4});
  loader.set_epoch(0);
  ASSERT_EQ(loader.num_batches(), 3);
  EXPECT_EQ(loader.batch(2).target.size(0), 2);
  EXPECT_EQ(loader.batch(1).target[0].item<int64_t>(), 4);
  EXPECT_EQ(loader.batch(1).data.sizes(), (std::vector<int64_t>{4, 1}));
}

TEST(DataLoader, DropLastDropsTheShortBatch) {
  DataLoaderOptions options;
  options.batch_size = 4;
  options.drop_last = true;
  DataLoader loader(counting_dataset(10), options);
  EXPECT_EQ(loader.num_batches(), 2);
}

TEST(DataLoader, AnyBatchOfAnEpochCanBeProducedDirectly) {
  DataLoaderOptions options;
  options.batch_size = 3;
  options.shuffle = true;
  options.seed = 5;
  DataLoader a(counting_dataset(20), options);
  DataLoader b(counting_dataset(20), options);
  a.set_epoch(4);
  b.set_epoch(4);
  EXPECT_TRUE(torch::equal(a.batch(5).target, b.batch(5).target));
}

TEST(DataLoader, ConfigureShardsWithOrWithoutPadding) {
  DataLoader loader(counting_dataset(10), {4});
  loader.configure(3, 2, 0);
  loader.set_epoch(0);
  ASSERT_EQ(loader.num_batches(), 1);
  EXPECT_EQ(loader.batch(0).target.size(0), 4);  // 2, 5, 8 and a padding duplicate
  loader.configure(3, 2, 0, /*pad=*/false);
  loader.set_epoch(0);
  EXPECT_EQ(loader.batch(0).target.size(0), 3);
}

/// Examples one at a time (Dataset::get), optionally failing at one index, counting calls.
class ExampleDataset : public Dataset {
 public:
  explicit ExampleDataset(int64_t n, int64_t fail_at = -1) : n_(n), fail_at_(fail_at) {}
  int64_t size() const override { return n_; }
  Example get(int64_t index) const override {
    ++calls;
    if (index == fail_at_) throw std::runtime_error("cannot read example " + std::to_string(index));
    Example e;
    e.data = torch::full({2}, static_cast<float>(index));
    e.target = torch::tensor(index);
    e.lists["tokens"] = torch::arange(index % 3 + 1);
    return e;
  }
  mutable std::atomic<int64_t> calls{0};

 private:
  int64_t n_;
  int64_t fail_at_;
};

std::vector<Batch> one_pass(const DataLoader& loader, int64_t epoch) {
  DataLoader copy = loader;
  copy.set_epoch(epoch);
  std::vector<Batch> out;
  BatchStream stream = copy.stream(0, copy.num_batches());
  while (stream.has_next()) out.push_back(stream.next());
  return out;
}

bool same(const std::vector<Batch>& a, const std::vector<Batch>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i].data, b[i].data) || !torch::equal(a[i].target, b[i].target)) return false;
    if (a[i].list("tokens").size() != b[i].list("tokens").size()) return false;
  }
  return true;
}

TEST(DataLoader, ExamplesAreCollatedAndWorkersGiveTheSameBatchesInOrder) {
  auto dataset = std::make_shared<ExampleDataset>(37);
  const DataLoaderOptions base{.batch_size = 4, .shuffle = true, .seed = 3};
  const std::vector<Batch> reference = one_pass(DataLoader(dataset, base), 2);
  ASSERT_EQ(reference.size(), 10u);
  EXPECT_EQ(reference.back().size(), 1);
  EXPECT_EQ(reference[0].list("tokens").size(), 4u);
  for (const int64_t workers : {1, 2, 4}) {
    for (const bool persistent : {false, true}) {
      DataLoaderOptions options = base;
      options.num_workers = workers;
      options.persistent_workers = persistent;
      options.prefetch_factor = workers == 2 ? 1 : 3;
      const DataLoader loader(dataset, options);
      EXPECT_TRUE(same(one_pass(loader, 2), reference)) << workers << " workers, persistent " << persistent;
      EXPECT_FALSE(same(one_pass(loader, 3), reference)) << "another epoch, another order";
      EXPECT_TRUE(same(one_pass(loader, 2), reference)) << "the same loader again";
    }
  }
}

TEST(DataLoader, ACustomCollateGetsTheExamples) {
  DataLoaderOptions options{.batch_size = 3};
  options.collate = [](std::vector<Example> examples) {
    Batch batch;
    batch.tensors["count"] = torch::tensor({static_cast<int64_t>(examples.size())});
    batch.data = torch::stack({examples.front().data, examples.back().data});
    return batch;
  };
  DataLoader loader(std::make_shared<ExampleDataset>(7), options);
  loader.set_epoch(0);
  EXPECT_EQ(loader.batch(2).at("count").item<int64_t>(), 1);
  EXPECT_EQ(loader.batch(1).data[1][0].item<float>(), 5.0f);
}

TEST(DataLoader, ADatasetsExceptionReachesTheConsumerOnceNamingTheBatchWithOrWithoutWorkers) {
  // The dataset throws std::runtime_error; the consumer gets a volt::Error (bad input, exit 1)
  // either way.
  for (const int64_t workers : {3, 0}) {
    auto dataset = std::make_shared<ExampleDataset>(40, /*fail_at=*/21);
    DataLoader loader(dataset, {.batch_size = 4, .num_workers = workers});
    loader.set_epoch(0);
    BatchStream stream = loader.stream(0, loader.num_batches());
    int64_t good = 0;
    std::string message;
    try {
      while (stream.has_next()) {
        stream.next();
        ++good;
      }
    } catch (const Error& e) {
      message = e.what();
    }
    EXPECT_EQ(good, 5) << "batches 0-4 come before the failing batch 5";
    EXPECT_NE(message.find("failed making batch 5 of epoch 0: cannot read example 21"), std::string::npos) << message;
    EXPECT_EQ(message.find("DataLoader worker ") != std::string::npos, workers > 0) << message;
  }
}

TEST(DataLoader, StoppingEarlyDropsTheWorkersPassAndTheNextPassStartsClean) {
  auto dataset = std::make_shared<ExampleDataset>(400);
  const DataLoader loader(dataset,
                          {.batch_size = 4, .num_workers = 2, .prefetch_factor = 2, .persistent_workers = true});
  DataLoader copy = loader;
  copy.set_epoch(0);
  {
    BatchStream stream = copy.stream(10, copy.num_batches());
    EXPECT_EQ(stream.next().target[0].item<int64_t>(), 40);
  }
  // At most the batches in flight were made beyond the one taken (workers x prefetch ahead).
  EXPECT_LE(dataset->calls.load(), 4 * (1 + 2 * 2 + 2));
  EXPECT_TRUE(same(one_pass(loader, 0), one_pass(DataLoader(dataset, {.batch_size = 4}), 0)));
}

TEST(Subset, PicksExamplesByIndexEitherWay) {
  const auto dataset = std::make_shared<ExampleDataset>(10);
  const Subset subset(dataset, torch::tensor({7, 2, 9}));
  EXPECT_EQ(subset.size(), 3);
  EXPECT_EQ(subset.get(1).target.item<int64_t>(), 2);
  EXPECT_TRUE(torch::equal(subset.get_batch(torch::tensor({2, 0})).target, torch::tensor({9, 7})));
  const Subset of_tensors(counting_dataset(10), torch::tensor({4, 5}));
  EXPECT_TRUE(torch::equal(of_tensors.get_batch(torch::tensor({1})).target, torch::tensor({5})));
  EXPECT_THROW(Subset(dataset, torch::tensor({3, 10})), Error);
}

TEST(DataLoader, NonPositiveBatchSizeIsAClearError) {
  try {
    DataLoader(counting_dataset(3), {0});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch_size=0"), std::string::npos);
  }
  EXPECT_THROW(DataLoader(counting_dataset(3), {.num_workers = -1}), Error);
  EXPECT_THROW(DataLoader(counting_dataset(3), {.prefetch_factor = 0}), Error);
}

}  // namespace
}  // namespace volt
