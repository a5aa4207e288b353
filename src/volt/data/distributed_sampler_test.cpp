#include "volt/data/distributed_sampler.h"

#include <set>

#include <gtest/gtest.h>

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

TEST(DistributedSampler, PaddingIsCountedPerReplica) {
  SamplerOptions options;
  options.num_replicas = 3;
  // 10 examples over 3 replicas: positions 10 and 11 are padding; they belong to ranks 1 and 2.
  int64_t padding = 0;
  for (int64_t rank = 0; rank < 3; ++rank) {
    options.rank = rank;
    DistributedSampler sampler(10, options);
    padding += sampler.padding_in_first(sampler.num_samples());
    EXPECT_EQ(sampler.padding_in_first(3), 0);
  }
  EXPECT_EQ(padding, 2);
}

TEST(DistributedSampler, DropLastTruncatesTheUnevenTail) {
  SamplerOptions options;
  options.num_replicas = 3;
  options.drop_last = true;
  DistributedSampler sampler(10, options);
  EXPECT_EQ(sampler.num_samples(), 3);
  EXPECT_EQ(sampler.padding_in_first(3), 0);
}

TEST(DistributedSampler, RankOutOfRangeIsAClearError) {
  SamplerOptions options;
  options.num_replicas = 2;
  options.rank = 2;
  EXPECT_THROW(DistributedSampler(10, options), Error);
}

}  // namespace
}  // namespace volt
