#include "volt/data/batch_sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "volt/core/testing.h"
#include "volt/data/data_loader.h"

namespace volt {
namespace {

using Batches = std::vector<std::vector<int64_t>>;

// 1000 lengths drawn from 1..200: random order, as real sequences come.
std::vector<int64_t> random_lengths(int64_t n = 1000) {
  std::mt19937 random(7);
  std::vector<int64_t> lengths(static_cast<size_t>(n));
  for (int64_t& length : lengths) length = std::uniform_int_distribution<int64_t>(1, 200)(random);
  return lengths;
}

// The share of a batch's padded cells that are padding, over all batches.
double padding_share(const Batches& batches, const std::vector<int64_t>& lengths) {
  double padded = 0, used = 0;
  for (const auto& batch : batches) {
    int64_t longest = 0;
    for (int64_t i : batch) longest = std::max(longest, lengths[static_cast<size_t>(i)]);
    for (int64_t i : batch) used += static_cast<double>(lengths[static_cast<size_t>(i)]);
    padded += static_cast<double>(longest * static_cast<int64_t>(batch.size()));
  }
  return 1.0 - used / padded;
}

std::map<int64_t, int> counts(const std::vector<Batches>& per_rank) {
  std::map<int64_t, int> seen;
  for (const auto& batches : per_rank)
    for (const auto& batch : batches)
      for (int64_t i : batch) ++seen[i];
  return seen;
}

TEST(LengthBucketBatchSampler, GroupsSimilarLengthsAndSeesEveryExampleOncePerEpoch) {
  const std::vector<int64_t> lengths = random_lengths();
  const LengthBucketBatchSampler sampler(lengths, {.batch_size = 16, .pool_batches = 20});
  const Batches batches = sampler.batches({.shuffle = true, .seed = 3, .epoch = 0});
  ASSERT_EQ(batches.size(), 63u);  // ceil(1000 / 16)
  const std::map<int64_t, int> seen = counts({batches});
  ASSERT_EQ(seen.size(), 1000u);
  for (const auto& [index, count] : seen) EXPECT_EQ(count, 1) << index;
  int64_t short_batches = 0;
  for (const auto& batch : batches) short_batches += batch.size() < 16 ? 1 : 0;
  EXPECT_EQ(short_batches, 1);
  // Random batches of lengths 1..200 are about half padding; grouped ones (a pool of 320 spans
  // ~0.6 length per example, ~10 per batch) about 5 per cent.
  std::vector<int64_t> order(1000);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(1));
  Batches random_batches;
  for (size_t i = 0; i < order.size(); i += 16)
    random_batches.emplace_back(order.begin() + static_cast<int64_t>(i),
                                order.begin() + static_cast<int64_t>(std::min(order.size(), i + 16)));
  EXPECT_GT(padding_share(random_batches, lengths), 0.3);
  EXPECT_LT(padding_share(batches, lengths), 0.1);
  // Without shuffle everything is sorted: the least padding, in a fixed order (evaluation).
  const Batches sorted = sampler.batches({.shuffle = false});
  EXPECT_LT(padding_share(sorted, lengths), padding_share(batches, lengths));
  EXPECT_EQ(sorted, sampler.batches({.shuffle = false, .epoch = 5}));
}

TEST(LengthBucketBatchSampler, IsAPureFunctionOfSeedAndEpoch) {
  const LengthBucketBatchSampler sampler(random_lengths(), {.batch_size = 8});
  const Batches a = sampler.batches({.shuffle = true, .seed = 3, .epoch = 1});
  EXPECT_EQ(
      a,
      LengthBucketBatchSampler(random_lengths(), {.batch_size = 8}).batches({.shuffle = true, .seed = 3, .epoch = 1}));
  EXPECT_NE(a, sampler.batches({.shuffle = true, .seed = 3, .epoch = 2}));
  EXPECT_NE(a, sampler.batches({.shuffle = true, .seed = 4, .epoch = 1}));
  // The global RNG is neither read nor moved.
  torch::manual_seed(0);
  const torch::Tensor before = torch::rand({1});
  torch::manual_seed(0);
  EXPECT_EQ(a, sampler.batches({.shuffle = true, .seed = 3, .epoch = 1}));
  EXPECT_TRUE(torch::equal(torch::rand({1}), before));
}

TEST(LengthBucketBatchSampler, DealsBatchesToProcessesLikeDistributedSampler) {
  const LengthBucketBatchSampler sampler(random_lengths(100), {.batch_size = 8, .pool_batches = 4});  // 13 batches
  std::vector<Batches> padded, exact, dropped, blocks;
  for (int64_t rank = 0; rank < 3; ++rank) {
    const BatchSamplerContext context{.shuffle = true, .seed = 1, .epoch = 2, .num_replicas = 3, .rank = rank};
    padded.push_back(sampler.batches(context));
    BatchSamplerContext unpadded = context;
    unpadded.pad = false;
    exact.push_back(sampler.batches(unpadded));
    unpadded.contiguous = true;
    blocks.push_back(sampler.batches(unpadded));
    BatchSamplerContext drop = context;
    drop.drop_last = true;
    dropped.push_back(sampler.batches(drop));
  }
  const Batches all = sampler.batches({.shuffle = true, .seed = 1, .epoch = 2});
  for (int64_t rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(padded[rank].size(), 5u) << rank;   // 13 batches padded to 15
    EXPECT_EQ(dropped[rank].size(), 4u) << rank;  // the short batch dropped: 12
    EXPECT_EQ(exact[rank].size(), rank == 0 ? 5u : 4u) << rank;
    EXPECT_EQ(padded[rank][0], all[static_cast<size_t>(rank)]);  // every third batch from the rank
  }
  // Unpadded (evaluation): every example exactly once over the processes, strided or in blocks.
  for (const auto& split : {exact, blocks}) {
    const std::map<int64_t, int> seen = counts(split);
    ASSERT_EQ(seen.size(), 100u);
    for (const auto& [index, count] : seen) EXPECT_EQ(count, 1) << index;
  }
  EXPECT_EQ(blocks[0].front(), all.front());
  EXPECT_EQ(blocks[2].back(), all.back());
  for (const auto& batches : dropped)
    for (const auto& batch : batches) EXPECT_EQ(batch.size(), 8u);
}

TEST(LengthBucketBatchSampler, RefusesBadInputWithAHint) {
  const auto refuses = [](const std::function<void()>& call, const std::string& part) {
    const std::string message = testing::error_message(call);
    EXPECT_NE(message.find(part), std::string::npos) << message;
    EXPECT_NE(message.find("HINT"), std::string::npos) << message;
  };
  refuses([] { LengthBucketBatchSampler({}, {.batch_size = 2}); }, "no lengths");
  refuses([] { LengthBucketBatchSampler({3, -1}, {.batch_size = 2}); }, "example 1 has length -1");
  refuses([] { LengthBucketBatchSampler({3}, {.batch_size = 0}); }, "batch_size=0");
  refuses([] { LengthBucketBatchSampler({3}, {.batch_size = 1, .pool_batches = 0}); }, "pool_batches=0");
  const auto sampler = std::make_shared<LengthBucketBatchSampler>(std::vector<int64_t>{1, 2, 3}, LengthBucketOptions{});
  const auto dataset = std::make_shared<TensorDataset>(torch::arange(4).unsqueeze(1), torch::arange(4));
  refuses([&] { DataLoader(dataset, {.batch_sampler = sampler}); }, "built for 3 examples, the dataset has 4");
  const auto three = std::make_shared<TensorDataset>(torch::arange(3).unsqueeze(1), torch::arange(3));
  refuses([&] { DataLoader(three, {.batch_size = 4, .batch_sampler = sampler}); }, "both batch_size=4");
}

TEST(DataLoader, ABatchSamplerFormsTheBatchesUnderAnyProcessCountAndWorkers) {
  const std::vector<int64_t> lengths = random_lengths(50);
  const auto dataset = std::make_shared<TensorDataset>(torch::arange(50).unsqueeze(1), torch::arange(50));
  const auto sampler = std::make_shared<LengthBucketBatchSampler>(lengths, LengthBucketOptions{.batch_size = 4});
  for (int64_t workers : {0, 2}) {
    DataLoader loader(dataset, {.shuffle = true, .num_workers = workers, .batch_sampler = sampler});
    loader.configure(2, 1, /*default_seed=*/9);
    loader.set_epoch(3);
    const Batches expected = sampler->batches({.shuffle = true, .seed = 9, .epoch = 3, .num_replicas = 2, .rank = 1});
    ASSERT_EQ(loader.num_batches(), static_cast<int64_t>(expected.size()));
    // From batch 2 on, as a resume mid-epoch asks for them.
    BatchStream stream = loader.stream(2);
    for (size_t b = 2; b < expected.size(); ++b) {
      ASSERT_TRUE(stream.has_next()) << b;
      const Batch batch = stream.next();
      EXPECT_EQ(std::vector<int64_t>(batch.target.data_ptr<int64_t>(),
                                     batch.target.data_ptr<int64_t>() + batch.target.numel()),
                expected[b])
          << "batch " << b << ", workers " << workers;
    }
    EXPECT_FALSE(stream.has_next());
  }
}

}  // namespace
}  // namespace volt
