#include "volt/checkpoint/sharded_checkpoint.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "volt/checkpoint/checkpoint_io.h"
#include "volt/core/error.h"

namespace volt {
namespace {

namespace fs = std::filesystem;
using GenericDict = c10::impl::GenericDict;
using GenericList = c10::impl::GenericList;

GenericDict dict() { return GenericDict(c10::StringType::get(), c10::AnyType::get()); }

// Two ranks' Adam states for parameters shaped [2, 3] and [4] laid end to end (10 values, 5 per
// rank: rank 0 owns a's first 5, rank 1 a's last one and all of b), and a frozen parameter
// between them that no rank shards.
struct TwoRanks {
  at::Tensor a_avg = at::arange(6, at::kFloat).view({2, 3});
  at::Tensor b_avg = at::arange(10, 14, at::kFloat);
  at::Tensor a_sq = a_avg * 2;
  at::Tensor b_sq = b_avg * 2;

  static c10::IValue param_state(const at::Tensor& avg, const at::Tensor& sq, int64_t step) {
    GenericDict s = dict();
    s.insert("step", step);
    s.insert("exp_avg", avg);
    s.insert("exp_avg_sq", sq);
    return s;
  }

  c10::IValue optimizer(int64_t rank) const {
    GenericDict state(c10::IntType::get(), c10::AnyType::get());
    const at::Tensor a = a_avg.reshape({-1}), as = a_sq.reshape({-1});
    if (rank == 0) {
      state.insert(0, param_state(a.narrow(0, 0, 5), as.narrow(0, 0, 5), 7));
      state.insert(2, param_state(b_avg.narrow(0, 0, 0), b_sq.narrow(0, 0, 0), 7));
    } else {
      state.insert(0, param_state(a.narrow(0, 5, 1), as.narrow(0, 5, 1), 7));
      state.insert(2, param_state(b_avg, b_sq, 7));
    }
    GenericDict top = dict();
    top.insert("state", state);
    top.insert("param_groups", GenericList(c10::AnyType::get()));
    return mark_shard(top, ShardMarker{.rank = rank,
                                       .world_size = 2,
                                       .shapes = {std::vector<int64_t>{2, 3}, std::nullopt, std::vector<int64_t>{4}},
                                       .elementwise = {"exp_avg", "exp_avg_sq"}});
  }

  // full_shard's pieces of the same two parameters' values, as each rank holds them: rank 0 has
  // a's first 5 values and none of b.
  at::Tensor a = at::arange(100, 106, at::kFloat).view({2, 3});
  at::Tensor b = at::arange(200, 204, at::kFloat);

  ParameterPieces parameters(int64_t rank) const {
    const at::Tensor flat = a.reshape({-1});
    ParameterPieces out;
    if (rank == 0) {
      out["layer.a"] = ParameterPiece{.values = flat.narrow(0, 0, 5).clone(), .shape = {2, 3}, .begin = 0, .end = 5};
      out["layer.b"] = ParameterPiece{.values = b.narrow(0, 0, 0).clone(), .shape = {4}, .begin = 0, .end = 0};
    } else {
      out["layer.a"] = ParameterPiece{.values = flat.narrow(0, 5, 1).clone(), .shape = {2, 3}, .begin = 5, .end = 6};
      out["layer.b"] = ParameterPiece{.values = b.clone(), .shape = {4}, .begin = 0, .end = 4};
    }
    return out;
  }

  // Saves the checkpoint "run/c.ckpt" and both shards of save `id`; with `sharded_parameters`
  // a and b are in the shards (full_shard) and the file's state_dict holds only "head.c"; with
  // `weights_only` the shards hold no optimizer states.
  void save(CheckpointIO& io, const std::string& id, bool sharded_parameters = false, bool weights_only = false) const {
    for (int64_t r = 0; r < 2; ++r) {
      const c10::IValue pieces = make_parameter_pieces(sharded_parameters ? parameters(r) : ParameterPieces{});
      io.save(make_shard(weights_only ? std::vector<c10::IValue>{} : std::vector<c10::IValue>{optimizer(r)}, pieces, id,
                         r, 2),
              shard_path("run/c.ckpt", id, r));
    }
    GenericDict top = dict();
    top.insert("global_step", int64_t{3});
    GenericDict weights = dict();
    weights.insert("head.c", at::ones({3}));
    if (sharded_parameters) {
      GenericList names(c10::StringType::get());
      names.push_back("layer.a");
      names.push_back("layer.b");
      top.insert(kShardedParametersKey, names);
    }
    top.insert("state_dict", weights);
    top.insert(kShardIndexKey, make_shard_index("run/c.ckpt", id, 2, !weights_only));
    io.save(top, "run/c.ckpt");
  }
};

TEST(ShardedCheckpointTest, TheIndexNamesEveryRanksFileBesideTheCheckpoint) {
  InMemoryCheckpointIO io;
  TwoRanks{}.save(io, "00000000000000aa");
  const c10::IValue loaded = io.load("run/c.ckpt");
  const std::optional<ShardIndex> index = read_shard_index(loaded, "run/c.ckpt");
  ASSERT_TRUE(index.has_value());
  EXPECT_EQ(index->save_id, "00000000000000aa");
  EXPECT_EQ(index->world_size, 2);
  EXPECT_EQ(index->files,
            (std::vector<std::string>{"c.ckpt.00000000000000aa.shard0", "c.ckpt.00000000000000aa.shard1"}));
  EXPECT_TRUE(index->optimizer_states);
  const Shard rank1 = load_shard(io, "run/c.ckpt", *index, 1);
  ASSERT_EQ(rank1.optimizer_states.size(), 1U);
  EXPECT_EQ(rank1.optimizer_states[0].toGenericDict().at(kShardMarkerKey).toGenericDict().at("rank").toInt(), 1);
  EXPECT_TRUE(rank1.parameters.empty());
  // A checkpoint that holds its optimizer states has no index.
  GenericDict plain = dict();
  plain.insert("optimizer_states", GenericList(c10::AnyType::get()));
  EXPECT_FALSE(read_shard_index(plain, "p").has_value());
}

TEST(ShardedCheckpointTest, AMarkerSurvivesTheFileAndComesOffTheState) {
  InMemoryCheckpointIO io;
  io.save(TwoRanks{}.optimizer(1), "marked");
  const auto [marker, state] = split_shard_marker(io.load("marked"));
  ASSERT_TRUE(marker.has_value());
  EXPECT_EQ(marker->rank, 1);
  EXPECT_EQ(marker->world_size, 2);
  ASSERT_EQ(marker->shapes.size(), 3U);
  EXPECT_EQ(marker->shapes[0], (std::vector<int64_t>{2, 3}));
  EXPECT_FALSE(marker->shapes[1].has_value());
  EXPECT_EQ(marker->elementwise, (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  EXPECT_FALSE(state.toGenericDict().contains(kShardMarkerKey));
  EXPECT_FALSE(split_shard_marker(state).first.has_value());
}

TEST(ShardedCheckpointTest, AMissingOrForeignShardIsRefusedWithAHint) {
  InMemoryCheckpointIO io;
  const TwoRanks ranks;
  ranks.save(io, "00000000000000aa");
  const ShardIndex index = *read_shard_index(io.load("run/c.ckpt"), "run/c.ckpt");
  io.remove(shard_path("run/c.ckpt", "00000000000000aa", 1));
  try {
    load_shard(io, "run/c.ckpt", index, 1);
    FAIL() << "a missing shard loaded";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("shard for rank 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("HINT"), std::string::npos);
  }
  // Rank 0's file put where rank 1's belongs (a copy mixed the set up).
  const c10::IValue none = make_parameter_pieces({});
  io.save(make_shard({ranks.optimizer(0)}, none, "00000000000000aa", 0, 2),
          shard_path("run/c.ckpt", "00000000000000aa", 1));
  EXPECT_THROW(load_shard(io, "run/c.ckpt", index, 1), CheckpointError);
  // A shard of another save under this save's name.
  io.save(make_shard({ranks.optimizer(1)}, none, "00000000000000bb", 1, 2),
          shard_path("run/c.ckpt", "00000000000000aa", 1));
  EXPECT_THROW(load_shard(io, "run/c.ckpt", index, 1), CheckpointError);
  EXPECT_THROW(load_shard(io, "run/c.ckpt", index, 2), Error);
}

TEST(ShardedCheckpointTest, RemoveShardsKeepsTheCommittedSaveAndOtherFiles) {
  InMemoryCheckpointIO io;
  const TwoRanks ranks;
  ranks.save(io, "00000000000000aa");
  ranks.save(io, "00000000000000bb");
  io.save(dict(), "run/c.ckpt.bak");
  remove_shards(io, "run/c.ckpt", "00000000000000bb");
  EXPECT_EQ(io.paths(), (std::vector<std::string>{"run/c.ckpt", "run/c.ckpt.00000000000000bb.shard0",
                                                  "run/c.ckpt.00000000000000bb.shard1", "run/c.ckpt.bak"}));
  remove_shards(io, "run/c.ckpt", "");
  EXPECT_EQ(io.paths(), (std::vector<std::string>{"run/c.ckpt", "run/c.ckpt.bak"}));
}

TEST(ShardedCheckpointTest, ConsolidationConcatenatesThePiecesIntoWholeStates) {
  InMemoryCheckpointIO io;
  const TwoRanks ranks;
  ranks.save(io, "00000000000000aa");
  const GenericDict whole = consolidate_sharded_checkpoint(io, "run/c.ckpt").toGenericDict();
  EXPECT_FALSE(whole.contains(kShardIndexKey));
  EXPECT_EQ(whole.at("global_step").toInt(), 3);
  const auto& optimizers = whole.at("optimizer_states").toListRef();
  ASSERT_EQ(optimizers.size(), 1U);
  const GenericDict optimizer = optimizers[0].toGenericDict();
  EXPECT_FALSE(optimizer.contains(kShardMarkerKey));
  const GenericDict state = optimizer.at("state").toGenericDict();
  const GenericDict a = state.at(0).toGenericDict();
  EXPECT_TRUE(at::equal(a.at("exp_avg").toTensor(), ranks.a_avg));
  EXPECT_TRUE(at::equal(a.at("exp_avg_sq").toTensor(), ranks.a_sq));
  EXPECT_EQ(a.at("step").toInt(), 7);
  EXPECT_TRUE(at::equal(state.at(2).toGenericDict().at("exp_avg").toTensor(), ranks.b_avg));
  // Written and read back, it is an ordinary one-file checkpoint.
  io.save(whole, "run/whole.ckpt");
  EXPECT_FALSE(read_shard_index(io.load("run/whole.ckpt"), "run/whole.ckpt").has_value());
}

TEST(ShardedCheckpointTest, ConsolidationRefusesPiecesThatDoNotAddUp) {
  InMemoryCheckpointIO io;
  TwoRanks ranks;
  ranks.save(io, "00000000000000aa");
  // Rank 1's shard from a run whose second parameter was larger.
  ranks.b_avg = at::arange(5, at::kFloat);
  ranks.b_sq = ranks.b_avg;
  io.save(make_shard({ranks.optimizer(1)}, make_parameter_pieces({}), "00000000000000aa", 1, 2),
          shard_path("run/c.ckpt", "00000000000000aa", 1));
  try {
    consolidate_sharded_checkpoint(io, "run/c.ckpt");
    FAIL() << "pieces of 5 values consolidated into a parameter of 4";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("hold 5 values"), std::string::npos) << e.what();
  }
}

TEST(ShardedCheckpointTest, ParameterPiecesSurviveTheFileAndMalformedOnesAreRefused) {
  InMemoryCheckpointIO io;
  const TwoRanks ranks;
  io.save(make_parameter_pieces(ranks.parameters(1)), "pieces");
  const ParameterPieces read = read_parameter_pieces(io.load("pieces"), "pieces");
  ASSERT_EQ(read.size(), 2U);
  EXPECT_EQ(read.at("layer.a").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(read.at("layer.a").begin, 5);
  EXPECT_EQ(read.at("layer.a").end, 6);
  EXPECT_TRUE(at::equal(read.at("layer.b").values, ranks.b));
  // Two values claimed for elements [5, 6).
  ParameterPieces wrong = ranks.parameters(1);
  wrong["layer.a"].values = at::zeros({2});
  try {
    read_parameter_pieces(make_parameter_pieces(wrong), "s");
    FAIL() << "a piece whose values do not match its range was read";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("holds 2 values for elements [5, 6)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("HINT"), std::string::npos);
  }
}

TEST(ShardedCheckpointTest, ConsolidationRebuildsShardedParametersIntoTheStateDict) {
  InMemoryCheckpointIO io;
  const TwoRanks ranks;
  ranks.save(io, "00000000000000aa", /*sharded_parameters=*/true);
  const Shard rank0 = load_shard(io, "run/c.ckpt", *read_shard_index(io.load("run/c.ckpt"), "run/c.ckpt"), 0);
  EXPECT_EQ(rank0.parameters.at("layer.a").end, 5);
  const GenericDict whole = consolidate_sharded_checkpoint(io, "run/c.ckpt").toGenericDict();
  EXPECT_FALSE(whole.contains(kShardedParametersKey));
  const GenericDict weights = whole.at("state_dict").toGenericDict();
  ASSERT_EQ(weights.size(), 3U);
  EXPECT_TRUE(at::equal(weights.at("layer.a").toTensor(), ranks.a));
  EXPECT_TRUE(at::equal(weights.at("layer.b").toTensor(), ranks.b));
  EXPECT_TRUE(at::equal(weights.at("head.c").toTensor(), at::ones({3})));
  EXPECT_EQ(whole.at("optimizer_states").toListRef().size(), 1U);
}

TEST(ShardedCheckpointTest, AWeightsOnlySetConsolidatesWithoutOptimizerStates) {
  InMemoryCheckpointIO io;
  const TwoRanks ranks;
  ranks.save(io, "00000000000000aa", /*sharded_parameters=*/true, /*weights_only=*/true);
  EXPECT_FALSE(read_shard_index(io.load("run/c.ckpt"), "run/c.ckpt")->optimizer_states);
  const GenericDict whole = consolidate_sharded_checkpoint(io, "run/c.ckpt").toGenericDict();
  EXPECT_FALSE(whole.contains("optimizer_states"));
  EXPECT_TRUE(at::equal(whole.at("state_dict").toGenericDict().at("layer.a").toTensor(), ranks.a));
}

TEST(ShardedCheckpointTest, ConsolidationRefusesParameterPiecesThatDoNotTile) {
  InMemoryCheckpointIO io;
  const TwoRanks ranks;
  ranks.save(io, "00000000000000aa", /*sharded_parameters=*/true);
  const std::string rank1 = shard_path("run/c.ckpt", "00000000000000aa", 1);
  const auto refused = [&io](const std::string& expected) {
    try {
      consolidate_sharded_checkpoint(io, "run/c.ckpt");
      ADD_FAILURE() << "consolidated; expected: " << expected;
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("HINT"), std::string::npos);
    }
  };
  // Rank 1 wrote rank 0's piece of a (a copy mixed the set up): element 5 is missing.
  ParameterPieces pieces = ranks.parameters(1);
  pieces["layer.a"] = ranks.parameters(0).at("layer.a");
  io.save(make_shard({ranks.optimizer(1)}, make_parameter_pieces(pieces), "00000000000000aa", 1, 2), rank1);
  refused("do not tile parameter 'layer.a'");
  // Rank 1 holds no piece of b.
  pieces = ranks.parameters(1);
  pieces.erase("layer.b");
  io.save(make_shard({ranks.optimizer(1)}, make_parameter_pieces(pieces), "00000000000000aa", 1, 2), rank1);
  refused("shard 1 holds no piece of it");
  // Rank 1's piece of b stops short of its end.
  pieces = ranks.parameters(1);
  pieces["layer.b"] = ParameterPiece{.values = ranks.b.narrow(0, 0, 3).clone(), .shape = {4}, .begin = 0, .end = 3};
  io.save(make_shard({ranks.optimizer(1)}, make_parameter_pieces(pieces), "00000000000000aa", 1, 2), rank1);
  refused("hold elements [0, 3) of parameter 'layer.b', which has 4");
}

TEST(ShardedCheckpointTest, TorchCheckpointIoListsTheFilesThatBeginWithAPrefix) {
  const fs::path dir = fs::temp_directory_path() / ("volt_sharded_list_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const char* name : {"c.ckpt", "c.ckpt.00000000000000aa.shard0", "d.ckpt"}) std::ofstream(dir / name) << "x";
  TorchCheckpointIO io;
  EXPECT_EQ(io.list((dir / "c.ckpt.").string()),
            (std::vector<std::string>{(dir / "c.ckpt.00000000000000aa.shard0").string()}));
  EXPECT_EQ(io.list((dir / "c.ckpt").string()).size(), 2U);
  EXPECT_TRUE(io.list((dir / "missing" / "x").string()).empty());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace volt
