#include "volt/data/distributed_sampler.h"

#include <gtest/gtest.h>

#include <set>

#include "volt/core/error.h"

namespace volt {
namespace {

std::vector<int64_t> to_vector(const torch::Tensor& t) {
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

TEST(DistributedSampler, OneReplicaWithoutShuffleIsSequential) {
  DistributedSampler sampler(5, {});
  EXPECT_EQ(to_vector(sampler.indices(3)), (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST(DistributedSampler, ShuffleDependsOnSeedAndEpochOnly) {
  SamplerOptions options;
  options.shuffle = true;
  options.seed = 7;
  DistributedSampler a(100, options);
  DistributedSampler b(100, options);
  EXPECT_EQ(to_vector(a.indices(2)), to_vector(b.indices(2)));
  EXPECT_NE(to_vector(a.indices(2)), to_vector(a.indices(3)));
  // Consuming the global RNG does not change the order.
  torch::rand({10});
  EXPECT_EQ(to_vector(a.indices(2)), to_vector(b.indices(2)));
}

TEST(DistributedSampler, ReplicasGetDisjointShardsThatCoverTheDataset) {
  SamplerOptions options;
  options.shuffle = true;
  options.num_replicas = 3;
  std::multiset<int64_t> seen;
  for (int64_t rank = 0; rank < 3; ++rank) {
    options.rank = rank;
    DistributedSampler sampler(10, options);
    EXPECT_EQ(sampler.num_samples(), 4);
    for (int64_t i : to_vector(sampler.indices(0))) seen.insert(i);
  }
  EXPECT_EQ(seen.size(), 12u);  // 10 examples + 2 padding duplicates
  for (int64_t i = 0; i < 10; ++i) EXPECT_GE(seen.count(i), 1u) << i;
}

TEST(DistributedSampler, WithoutPaddingEveryExampleIsReadExactlyOnce) {
  SamplerOptions options;
  options.shuffle = true;
  options.num_replicas = 3;
  options.pad = false;
  std::multiset<int64_t> seen;
  std::vector<int64_t> sizes;
  for (int64_t rank = 0; rank < 3; ++rank) {
    options.rank = rank;
    DistributedSampler sampler(10, options);
    sizes.push_back(sampler.num_samples());
    const auto indices = to_vector(sampler.indices(1));
    ASSERT_EQ(static_cast<int64_t>(indices.size()), sampler.num_samples());
    seen.insert(indices.begin(), indices.end());
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 3, 3}));
  EXPECT_EQ(seen, (std::multiset<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

TEST(DistributedSampler, ContiguousBlocksConcatenateToTheDatasetOrder) {
  SamplerOptions options;
  options.num_replicas = 3;
  options.pad = false;
  options.contiguous = true;
  std::vector<int64_t> concatenated;
  std::vector<int64_t> sizes;
  for (int64_t rank = 0; rank < 3; ++rank) {
    options.rank = rank;
    DistributedSampler sampler(10, options);
    const auto indices = to_vector(sampler.indices(0));
    sizes.push_back(static_cast<int64_t>(indices.size()));
    concatenated.insert(concatenated.end(), indices.begin(), indices.end());
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 3, 3}));
  EXPECT_EQ(concatenated, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

TEST(DistributedSampler, ContiguousWithPaddingIsAClearError) {
  SamplerOptions options;
  options.num_replicas = 2;
  options.contiguous = true;
  try {
    DistributedSampler(5, options);
    FAIL() << "expected volt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("HINT: set pad=false"), std::string::npos) << e.what();
  }
}

TEST(DistributedSampler, DropLastTruncatesTheUnevenTail) {
  SamplerOptions options;
  options.num_replicas = 3;
  options.drop_last = true;
  DistributedSampler sampler(10, options);
  EXPECT_EQ(sampler.num_samples(), 3);
  EXPECT_EQ(sampler.indices(0).size(0), 3);
}

TEST(DistributedSampler, RankOutOfRangeIsAClearError) {
  SamplerOptions options;
  options.num_replicas = 2;
  options.rank = 2;
  EXPECT_THROW(DistributedSampler(10, options), Error);
}

}  // namespace
}  // namespace volt
