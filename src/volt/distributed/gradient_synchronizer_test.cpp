// The gradient bucket layout that bucket_cap_mb decides (built into distributed_test).
#include "volt/distributed/gradient_synchronizer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "volt/core/error.h"

namespace volt {
namespace {

using Buckets = std::vector<std::vector<size_t>>;

/// Four float32 parameters of exactly 1 MiB each (uninitialized: only their sizes matter).
std::vector<torch::Tensor> four_mebibyte_parameters() {
  std::vector<torch::Tensor> out;
  for (int i = 0; i < 4; ++i) out.push_back(torch::empty({256 * 1024}));
  return out;
}

TEST(GradientBuckets, TheCapDecidesHowManyParametersShareABucket) {
  const std::vector<torch::Tensor> parameters = four_mebibyte_parameters();
  // The first bucket closes at 1 MiB (PyTorch DDP's), then the cap: 25 MiB takes the other three.
  EXPECT_EQ(internal::gradient_buckets(parameters, 25), (Buckets{{3}, {2, 1, 0}}));
  EXPECT_EQ(internal::gradient_buckets(parameters, 2), (Buckets{{3}, {2, 1}, {0}}));
  EXPECT_EQ(internal::gradient_buckets(parameters, 1), (Buckets{{3}, {2}, {1}, {0}}));
}

TEST(GradientBuckets, SmallParametersShareOneBucketAtTheDefaultCap) {
  const std::vector<torch::Tensor> parameters = {torch::empty({4, 3}), torch::empty({4}), torch::empty({1, 4})};
  EXPECT_EQ(internal::gradient_buckets(parameters, GradientSyncOptions{}.bucket_cap_mb), (Buckets{{2, 1, 0}}));
}

TEST(GradientBuckets, ANonPositiveCapIsAnError) {
  EXPECT_THROW(internal::gradient_buckets(four_mebibyte_parameters(), 0), Error);
}

}  // namespace
}  // namespace volt
