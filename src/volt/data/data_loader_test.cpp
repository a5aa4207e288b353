#include "volt/data/data_loader.h"

#include <gtest/gtest.h>

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

TEST(DataLoader, NonPositiveBatchSizeIsAClearError) {
  try {
    DataLoader(counting_dataset(3), {0});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch_size=0"), std::string::npos);
  }
}

}  // namespace
}  // namespace volt
