#include "volt/metrics/metric.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <string>
#include <vector>

#include "volt/base/testing_collectives.h"
#include "volt/core/error.h"

namespace volt {
namespace {

/// A metric with a state of every reduction, whose compute returns nothing of interest but
/// keeps the synced states for the test to read. preds are [N, 2] rows; target is unused.
class Stats : public Metric {
 public:
  explicit Stats(bool with_mean = true) : Metric("Stats"), with_mean_(with_mean) {
    add_state("sum", torch::zeros({2}), StateReduce::kSum);
    if (with_mean_) add_state("mean", torch::zeros({}, torch::kDouble), StateReduce::kMean);
    add_state("max", torch::full({}, -std::numeric_limits<double>::infinity(), torch::kDouble), StateReduce::kMax);
    add_state("min", torch::full({}, std::numeric_limits<double>::infinity(), torch::kDouble), StateReduce::kMin);
    add_state("rows", torch::empty({0, 2}), StateReduce::kCat);
  }
  /// The states the last compute() synced.
  mutable States synced;

 protected:
  void update_state(const torch::Tensor& preds, const torch::Tensor&) override {
    state("sum") += preds.sum(0);
    if (with_mean_) state("mean").fill_(preds.to(torch::kDouble).mean());
    state("max") = torch::maximum(state("max"), preds.to(torch::kDouble).max());
    state("min") = torch::minimum(state("min"), preds.to(torch::kDouble).min());
    append("rows", preds);
  }
  torch::Tensor compute_from(const States& states) const override {
    synced = states;
    return torch::tensor(0.0);
  }

 private:
  bool with_mean_;
};

/// Rank r's rows in the sync tests: 3 rows for rank 0, none for rank 1, 2 rows for rank 2.
torch::Tensor rows_of(int64_t rank) {
  if (rank == 0) return torch::tensor({1.0F, 2.0F, -3.0F, 4.0F, 5.0F, 0.5F}).view({3, 2});
  if (rank == 1) return torch::empty({0, 2});
  return torch::tensor({7.0F, -8.0F, 0.25F, 1.0F}).view({2, 2});
}

void expect_same_states(const StateDict& a, const StateDict& b) {
  EXPECT_EQ(a.at("update_count").toInt(), b.at("update_count").toInt());
  const auto sa = a.at("states").toGenericDict();
  const auto sb = b.at("states").toGenericDict();
  ASSERT_EQ(sa.size(), sb.size());
  for (const auto& entry : sa) {
    const torch::Tensor x = entry.value().toTensor();
    const torch::Tensor y = sb.at(entry.key()).toTensor();
    EXPECT_TRUE(x.sizes() == y.sizes() && torch::equal(x, y)) << "state " << entry.key().toStringRef();
  }
}

TEST(StateReduce, NamesRoundTripAndBadNamesListTheChoices) {
  for (const StateReduce r :
       {StateReduce::kSum, StateReduce::kMean, StateReduce::kMax, StateReduce::kMin, StateReduce::kCat}) {
    EXPECT_EQ(parse_state_reduce(to_string(r)), r);
  }
  try {
    parse_state_reduce("median");
    ADD_FAILURE() << "expected a volt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'median'; expected one of: sum, mean, max, min, cat"), std::string::npos)
        << e.what();
  }
}

TEST(Metric, ComputeSyncsEveryReductionAcrossRanksIncludingOneWithoutData) {
  const int64_t world = 3;
  std::vector<Metric::States> synced(world);
  testing::run_ranks(world, [&](int64_t rank, Collectives& collectives) {
    Stats stats;
    if (rank != 1) stats.update(rows_of(rank), torch::zeros({rows_of(rank).size(0)}));
    stats.compute(collectives);
    synced[static_cast<size_t>(rank)] = stats.synced;
  });
  const torch::Tensor all = torch::cat({rows_of(0), rows_of(2)});
  for (int64_t rank = 0; rank < world; ++rank) {
    const Metric::States& s = synced[static_cast<size_t>(rank)];
    EXPECT_TRUE(torch::allclose(s.at("sum"), all.sum(0))) << s.at("sum");
    EXPECT_EQ(s.at("max").item<double>(), 7.0);
    EXPECT_EQ(s.at("min").item<double>(), -8.0);
    // The mean of the ranks' values; rank 1 contributes its default, 0.
    const double mean0 = (1.0 + 2 - 3 + 4 + 5 + 0.5) / 6;
    const double mean2 = (7.0 - 8 + 0.25 + 1) / 4;
    EXPECT_NEAR(s.at("mean").item<double>(), (mean0 + 0.0 + mean2) / 3, 1e-12);
    // Rows in rank order, none padded in for rank 1.
    EXPECT_TRUE(torch::equal(s.at("rows"), all)) << s.at("rows");
  }
}

TEST(Metric, ComputeWithNoDataAnywhereGivesTheDefaults) {
  testing::run_ranks(2, [&](int64_t, Collectives& collectives) {
    Stats stats;
    stats.compute(collectives);
    EXPECT_EQ(stats.synced.at("rows").sizes(), (std::vector<int64_t>{0, 2}));
    EXPECT_EQ(stats.synced.at("max").item<double>(), -std::numeric_limits<double>::infinity());
  });
}

TEST(Metric, ComputeLeavesTheLocalStatesAsTheyWereSoUpdatesContinue) {
  Stats stats;
  stats.update(rows_of(0), torch::zeros({3}));
  const StateDict before = stats.state_dict();
  stats.compute();
  stats.compute();
  expect_same_states(stats.state_dict(), before);
  stats.update(rows_of(2), torch::zeros({2}));
  stats.compute();
  EXPECT_TRUE(torch::equal(stats.synced.at("rows"), torch::cat({rows_of(0), rows_of(2)})));
  EXPECT_EQ(stats.update_count(), 2);

  // Under sync too: the synced copy is not written back into the local states.
  testing::run_ranks(2, [&](int64_t rank, Collectives& collectives) {
    Stats mine;
    mine.update(rows_of(rank == 0 ? 0 : 2), torch::zeros({1}));
    const StateDict local = mine.state_dict();
    mine.compute(collectives);
    expect_same_states(mine.state_dict(), local);
  });
}

TEST(Metric, ResetGoesBackToTheDefaults) {
  Stats stats;
  stats.update(rows_of(0), torch::zeros({3}));
  stats.reset();
  EXPECT_EQ(stats.update_count(), 0);
  expect_same_states(stats.state_dict(), Stats().state_dict());
}

TEST(Metric, StateDictRoundTripContinuesBitIdentically) {
  Stats uninterrupted;
  Stats first;
  uninterrupted.update(rows_of(0), torch::zeros({3}));
  first.update(rows_of(0), torch::zeros({3}));
  Stats resumed;
  resumed.load_state_dict(first.state_dict());
  EXPECT_EQ(resumed.update_count(), 1);
  uninterrupted.update(rows_of(2), torch::zeros({2}));
  resumed.update(rows_of(2), torch::zeros({2}));
  expect_same_states(resumed.state_dict(), uninterrupted.state_dict());
}

TEST(Metric, LoadingAnotherMetricsStatesIsRefusedNamingTheDifference) {
  Stats stats;
  StateDict other = Stats().state_dict();
  other.insert_or_assign("metric", std::string("MulticlassAccuracy"));
  try {
    stats.load_state_dict(other);
    ADD_FAILURE() << "expected a volt::CheckpointError";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("holds the states of a MulticlassAccuracy, not of a Stats"), std::string::npos)
        << e.what();
  }
  StateDict reshaped = Stats().state_dict();
  reshaped.at("states").toGenericDict().insert_or_assign("sum", torch::zeros({3}));
  try {
    stats.load_state_dict(reshaped);
    ADD_FAILURE() << "expected a volt::CheckpointError";
  } catch (const CheckpointError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("state 'sum' as [3] Float, but this Stats expects [2] Float"), std::string::npos) << message;
    EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
  }
}

TEST(Metric, GatheredStatesResumeBitIdenticallyOnTheSameNumberOfRanks) {
  const int64_t world = 3;
  StateDict saved = make_state_dict();
  std::vector<StateDict> uninterrupted(world, make_state_dict());
  testing::run_ranks(world, [&](int64_t rank, Collectives& collectives) {
    Stats stats;
    if (rank != 1) stats.update(rows_of(rank), torch::zeros({1}));
    const StateDict gathered = stats.gathered_state_dict(collectives);
    if (rank == 0) saved = gathered;  // rank 0 writes the checkpoint
    stats.update(rows_of(rank == 1 ? 0 : 2), torch::zeros({1}));
    uninterrupted[static_cast<size_t>(rank)] = stats.state_dict();
  });
  EXPECT_EQ(saved.at("world_size").toInt(), world);
  testing::run_ranks(world, [&](int64_t rank, Collectives& collectives) {
    Stats resumed;
    resumed.load_gathered_state_dict(saved, collectives);
    resumed.update(rows_of(rank == 1 ? 0 : 2), torch::zeros({1}));
    expect_same_states(resumed.state_dict(), uninterrupted[static_cast<size_t>(rank)]);
  });
}

TEST(Metric, GatheredStatesFoldIntoRankZeroOnAnotherNumberOfRanks) {
  // Saved by 3 ranks, resumed by 1 and by 2: compute gives the saved value, and further updates
  // count on top of it.
  StateDict saved = make_state_dict();
  testing::run_ranks(3, [&](int64_t rank, Collectives& collectives) {
    Stats stats(/*with_mean=*/false);
    if (rank != 1) stats.update(rows_of(rank), torch::zeros({1}));
    const StateDict gathered = stats.gathered_state_dict(collectives);
    if (rank == 0) saved = gathered;
  });
  const torch::Tensor all = torch::cat({rows_of(0), rows_of(2)});
  for (const int64_t world : {1, 2}) {
    testing::run_ranks(world, [&](int64_t rank, Collectives& collectives) {
      Stats resumed(/*with_mean=*/false);
      resumed.load_gathered_state_dict(saved, collectives);
      EXPECT_EQ(resumed.update_count(), rank == 0 ? 2 : 0);
      resumed.compute(collectives);
      EXPECT_TRUE(torch::equal(resumed.synced.at("rows"), all)) << "world " << world;
      EXPECT_TRUE(torch::allclose(resumed.synced.at("sum"), all.sum(0)));
      EXPECT_EQ(resumed.synced.at("max").item<double>(), 7.0);
      EXPECT_EQ(resumed.synced.at("min").item<double>(), -8.0);
      const torch::Tensor more = torch::tensor({9.0F, -9.0F}).view({1, 2});
      resumed.update(more, torch::zeros({1}));
      resumed.compute(collectives);
      EXPECT_EQ(resumed.synced.at("rows").size(0), all.size(0) + world);
      EXPECT_EQ(resumed.synced.at("max").item<double>(), 9.0);
    });
  }
}

TEST(Metric, AMeanStateCannotMoveToAnotherNumberOfRanks) {
  StateDict saved = make_state_dict();
  testing::run_ranks(2, [&](int64_t rank, Collectives& collectives) {
    Stats stats;
    stats.update(rows_of(rank == 0 ? 0 : 2), torch::zeros({1}));
    const StateDict gathered = stats.gathered_state_dict(collectives);
    if (rank == 0) saved = gathered;
  });
  Stats resumed;
  try {
    resumed.load_gathered_state_dict(saved, local_collectives());
    ADD_FAILURE() << "expected a volt::CheckpointError";
  } catch (const CheckpointError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("saved by 2 processes and is loaded by 1"), std::string::npos) << message;
    EXPECT_NE(message.find("state 'mean'"), std::string::npos) << message;
    EXPECT_NE(message.find("HINT: resume on 2 processes"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace volt
