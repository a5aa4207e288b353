#include "volt/strategies/shard_layout.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <random>

#include "volt/base/state_dict.h"
#include "volt/core/error.h"

namespace volt {
namespace {

TEST(ShardLayoutTest, CutsTheFlatBufferIntoEqualChunksAndEachTensorIntoPieces) {
  // Tensors of 3, 5 and 2 values over 3 processes: chunks of 4, the last holding 2 of padding.
  const ShardLayout r0({3, 5, 2}, 3, 0);
  EXPECT_EQ(r0.total(), 10);
  EXPECT_EQ(r0.chunk(), 4);
  EXPECT_EQ(r0.padded(), 12);
  EXPECT_EQ(r0.offset(2), 8);
  EXPECT_EQ(r0.piece(0).begin, 0);
  EXPECT_EQ(r0.piece(0).end, 3);
  EXPECT_EQ(r0.piece(1).begin, 0);
  EXPECT_EQ(r0.piece(1).end, 1);
  EXPECT_EQ(r0.piece(1).chunk_offset, 3);
  EXPECT_EQ(r0.piece(2).numel(), 0);
  const ShardLayout r1({3, 5, 2}, 3, 1);
  EXPECT_EQ(r1.piece(0).numel(), 0);
  EXPECT_EQ(r1.piece(1).begin, 1);
  EXPECT_EQ(r1.piece(1).end, 5);
  EXPECT_EQ(r1.piece(1).chunk_offset, 0);
  const ShardLayout r2({3, 5, 2}, 3, 2);
  EXPECT_EQ(r2.piece(2).begin, 0);
  EXPECT_EQ(r2.piece(2).end, 2);
  EXPECT_EQ(r2.piece(2).chunk_offset, 0);
}

TEST(ShardLayoutTest, EveryElementBelongsToExactlyOneProcess) {
  std::mt19937 random(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t world = 1 + static_cast<int64_t>(random() % 5);
    std::vector<int64_t> numels(1 + random() % 6);
    for (int64_t& n : numels) n = static_cast<int64_t>(random() % 9);  // empty tensors too
    std::vector<std::vector<int>> owners(numels.size());
    for (size_t i = 0; i < numels.size(); ++i) owners[i].assign(static_cast<size_t>(numels[i]), 0);
    for (int64_t rank = 0; rank < world; ++rank) {
      const ShardLayout layout(numels, world, rank);
      int64_t in_chunk = 0;
      for (size_t i = 0; i < numels.size(); ++i) {
        const ShardPiece piece = layout.piece(i);
        ASSERT_GE(piece.chunk_offset, 0);
        ASSERT_LE(piece.chunk_offset + piece.numel(), layout.chunk());
        // Within the chunk, piece i sits where the flat offset says.
        if (piece.numel() > 0) {
          ASSERT_EQ(rank * layout.chunk() + piece.chunk_offset, layout.offset(i) + piece.begin);
        }
        for (int64_t e = piece.begin; e < piece.end; ++e) ++owners[i][static_cast<size_t>(e)];
        in_chunk += piece.numel();
      }
      ASSERT_LE(in_chunk, layout.chunk());
    }
    for (const auto& tensor : owners)
      for (const int count : tensor) ASSERT_EQ(count, 1);
  }
}

TEST(ShardLayoutTest, FlattenAndViewRoundTripWithUndefinedTensorsAsZeros) {
  const ShardLayout layout({6, 4}, 4, 0);
  const torch::Tensor a = torch::arange(6, torch::kFloat).reshape({2, 3});
  const torch::Tensor flat = layout.flatten({a, torch::Tensor()}, torch::kFloat);
  ASSERT_EQ(flat.numel(), layout.padded());
  EXPECT_TRUE(torch::equal(layout.view(flat, 0, a.sizes()), a));
  EXPECT_TRUE(torch::equal(layout.view(flat, 1, {4}), torch::zeros({4})));
  EXPECT_EQ(flat.narrow(0, 10, layout.padded() - 10).abs().sum().item<float>(), 0.0F);
}

TEST(ShardLayoutTest, RejectsARankOutsideTheWorld) {
  try {
    ShardLayout({3}, 2, 2);
    FAIL() << "rank 2 of 2 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2 of 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("HINT"), std::string::npos);
  }
}

c10::IValue adam_state(const torch::Tensor& exp_avg, double step) {
  StateDict param_state = make_state_dict();
  param_state.insert("step", torch::tensor(step));
  param_state.insert("exp_avg", exp_avg);
  param_state.insert("exp_avg_sq", exp_avg * 2);
  c10::impl::GenericDict state(c10::IntType::get(), c10::AnyType::get());
  state.insert(int64_t{0}, param_state);
  StateDict top = make_state_dict();
  top.insert("volt_optimizer", std::string("Adam"));
  top.insert("state", state);
  return top;
}

TEST(ShardLayoutTest, ShardsElementwiseOptimizerStateAndKeepsTheStep) {
  const torch::Tensor exp_avg = torch::arange(6, torch::kFloat).reshape({2, 3});
  const ShardPiece piece{.begin = 2, .end = 5, .chunk_offset = 0};
  const c10::IValue sharded = shard_optimizer_state(adam_state(exp_avg, 4), {piece}, {6});
  const auto param_state = sharded.toGenericDict().at("state").toGenericDict().at(int64_t{0}).toGenericDict();
  EXPECT_TRUE(torch::equal(param_state.at("exp_avg").toTensor(), torch::tensor({2.0F, 3.0F, 4.0F})));
  EXPECT_TRUE(torch::equal(param_state.at("exp_avg_sq").toTensor(), torch::tensor({4.0F, 6.0F, 8.0F})));
  EXPECT_EQ(param_state.at("step").toTensor().item<double>(), 4.0);
  // A parameter kept whole (nullopt) keeps its whole state.
  const c10::IValue whole = shard_optimizer_state(adam_state(exp_avg, 4), {std::nullopt}, {0});
  EXPECT_TRUE(torch::equal(
      whole.toGenericDict().at("state").toGenericDict().at(int64_t{0}).toGenericDict().at("exp_avg").toTensor(),
      exp_avg));
  EXPECT_TRUE(is_elementwise_state("momentum_buffer"));
  EXPECT_FALSE(is_elementwise_state("step"));
}

TEST(ShardLayoutTest, RefusesStateOfAnotherSizeThanTheParameter) {
  try {
    shard_optimizer_state(adam_state(torch::zeros({5}), 1), {ShardPiece{.begin = 0, .end = 3}}, {6});
    FAIL() << "5 values of state for a parameter of 6 were accepted";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("holds 5 values, but the parameter has 6"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace volt
