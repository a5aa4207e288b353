// Metric states through a real checkpoint archive (torch.save's zip format, read back with
// Volt's plain unpickler), as the Trainer would save them: rank 0 writes every rank's states.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "volt/base/testing_collectives.h"
#include "volt/checkpoint/checkpoint_io.h"
#include "volt/metrics/accuracy.h"
#include "volt/metrics/auroc.h"

namespace volt {
namespace {

/// Rank r's shard of 29 examples over `world` ranks (contiguous, unpadded), split in two halves:
/// `part` 0 before the checkpoint, 1 after. The ranks are threads, so the data comes from a
/// private generator: seeding the global one raced with the other ranks' draws.
struct Shard {
  torch::Tensor scores, target;
};
Shard shard(int64_t world, int64_t rank, int64_t part) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(9);
  const torch::Tensor scores = torch::randint(0, 6, {29, 4}, generator).to(torch::kFloat) / 5;
  const torch::Tensor target = torch::randint(0, 4, {29}, generator, torch::kLong);
  const int64_t start = 29 * rank / world;
  const int64_t end = 29 * (rank + 1) / world;
  const int64_t middle = (start + end) / 2;
  const int64_t from = part == 0 ? start : middle;
  const int64_t to = part == 0 ? middle : end;
  return {scores.narrow(0, from, to - from), target.narrow(0, from, to - from)};
}

/// What a checkpoint file holds, read back.
StateDict round_trip(const StateDict& saved) { return load_from_bytes(save_to_bytes(saved)).toGenericDict(); }

TEST(MetricCheckpoint, ThroughAFileTheSameRanksContinueBitIdentically) {
  const int64_t world = 3;
  StateDict auroc_file = make_state_dict();
  StateDict accuracy_file = make_state_dict();
  std::vector<double> uninterrupted(world);
  testing::run_ranks(world, [&](int64_t rank, Collectives& collectives) {
    MulticlassAUROC auroc(4);
    MulticlassAccuracy accuracy({.num_classes = 4, .top_k = 2});
    const Shard first = shard(world, rank, 0);
    auroc.update(first.scores, first.target);
    accuracy.update(first.scores, first.target);
    const StateDict a = auroc.gathered_state_dict(collectives);
    const StateDict b = accuracy.gathered_state_dict(collectives);
    if (rank == 0) {
      auroc_file = round_trip(a);
      accuracy_file = round_trip(b);
    }
    const Shard second = shard(world, rank, 1);
    auroc.update(second.scores, second.target);
    accuracy.update(second.scores, second.target);
    uninterrupted[static_cast<size_t>(rank)] = auroc.compute(collectives).item<double>();
    EXPECT_EQ(accuracy.update_count(), 2);
  });
  testing::run_ranks(world, [&](int64_t rank, Collectives& collectives) {
    MulticlassAUROC auroc(4);
    auroc.load_gathered_state_dict(auroc_file, collectives);
    const Shard second = shard(world, rank, 1);
    auroc.update(second.scores, second.target);
    EXPECT_EQ(auroc.compute(collectives).item<double>(), uninterrupted[static_cast<size_t>(rank)]);
  });
}

TEST(MetricCheckpoint, ThroughAFileAnotherNumberOfRanksComputesTheSavedValue) {
  StateDict saved = make_state_dict();
  double expected_auroc = 0;
  double expected_accuracy = 0;
  testing::run_ranks(3, [&](int64_t rank, Collectives& collectives) {
    MulticlassAUROC auroc(4);
    MulticlassAccuracy accuracy({.num_classes = 4, .average = Average::kMacro});
    const Shard first = shard(3, rank, 0);
    auroc.update(first.scores, first.target);
    accuracy.update(first.scores, first.target);
    StateDict both = make_state_dict();
    both.insert("auroc", auroc.gathered_state_dict(collectives));
    both.insert("accuracy", accuracy.gathered_state_dict(collectives));
    const double a = auroc.compute(collectives).item<double>();
    const double b = accuracy.compute(collectives).item<double>();
    if (rank == 0) {
      saved = round_trip(both);
      expected_auroc = a;
      expected_accuracy = b;
    }
  });
  for (const int64_t world : {1, 2, 4}) {
    testing::run_ranks(world, [&](int64_t, Collectives& collectives) {
      MulticlassAUROC auroc(4);
      MulticlassAccuracy accuracy({.num_classes = 4, .average = Average::kMacro});
      auroc.load_gathered_state_dict(saved.at("auroc").toGenericDict(), collectives);
      accuracy.load_gathered_state_dict(saved.at("accuracy").toGenericDict(), collectives);
      EXPECT_EQ(auroc.compute(collectives).item<double>(), expected_auroc) << "world " << world;
      EXPECT_EQ(accuracy.compute(collectives).item<double>(), expected_accuracy) << "world " << world;
    });
  }
}

}  // namespace
}  // namespace volt
