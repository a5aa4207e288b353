// `volt checkpoint to-dcp`'s native layout: a sharded checkpoint's pieces, model and Adam state,
// written as PyTorch's distributed checkpoint and read back by Volt's reader of PyTorch's folders
// (tests/interop/test_dcp_interop.py reads them with PyTorch itself).
#include "volt/checkpoint/dcp_writer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "volt/checkpoint/checkpoint_io.h"
#include "volt/checkpoint/dcp_checkpoint.h"
#include "volt/checkpoint/sharded_checkpoint.h"
#include "volt/core/testing.h"

namespace volt {
namespace {

using WriterDict = c10::impl::GenericDict;

WriterDict writer_dict() { return WriterDict(c10::StringType::get(), c10::AnyType::get()); }

// The whole values: "w" (3x4) is kept in pieces (rank 0 elements [0, 5), rank 1 [5, 12)), "b" (2)
// in the checkpoint itself; Adam's exp_avg of w is w + 100, of b (ids: w 0, b 1) b + 200.
at::Tensor whole_w() { return at::arange(12, at::kFloat).view({3, 4}); }
at::Tensor whole_b() { return at::tensor({0.5F, 1.5F}); }

// Adam's state of one process under fsdp: its pieces of w's and b's moments, each marked with the
// elements it holds ([0, 5) and [5, 12) of w; [0, 1) and [1, 2) of b), and the replicated step.
c10::IValue adam_piece(int64_t rank) {
  const std::pair<int64_t, int64_t> w = rank == 0 ? std::make_pair(0L, 5L) : std::make_pair(5L, 12L);
  const std::pair<int64_t, int64_t> b = rank == 0 ? std::make_pair(0L, 1L) : std::make_pair(1L, 2L);
  const auto moments = [](const at::Tensor& whole, std::pair<int64_t, int64_t> range) {
    WriterDict entry = writer_dict();
    entry.insert("step", at::tensor(2.0F));
    const at::Tensor piece = whole.reshape({-1}).narrow(0, range.first, range.second - range.first);
    entry.insert("exp_avg", piece.clone());
    entry.insert("exp_avg_sq", (piece * 2).clone());
    return entry;
  };
  c10::impl::GenericDict state(c10::IntType::get(), c10::AnyType::get());
  state.insert(int64_t{0}, moments(whole_w() + 100, w));
  state.insert(int64_t{1}, moments(whole_b() + 200, b));
  WriterDict group = writer_dict();
  group.insert("lr", 0.1);
  group.insert("betas", c10::List<double>({0.9, 0.999}));
  group.insert("eps", 1e-8);
  group.insert("weight_decay", 0.0);
  group.insert("amsgrad", false);
  group.insert("params", c10::List<int64_t>({0, 1}));
  c10::impl::GenericList groups(c10::AnyType::get());
  groups.push_back(group);
  WriterDict adam = writer_dict();
  adam.insert("volt_optimizer", std::string("Adam"));
  adam.insert("state", state);
  adam.insert("param_groups", groups);
  return mark_shard(adam, ShardMarker{.rank = rank,
                                      .world_size = 2,
                                      .shapes = {std::vector<int64_t>{3, 4}, std::vector<int64_t>{2}},
                                      .elementwise = {"exp_avg", "exp_avg_sq"},
                                      .pieces = {w, b}});
}

// A 2-process full_shard checkpoint with Adam's state in its shards; `names`: with the optimizer's
// parameter names (kOptimizerParameterNamesKey); rank 1's piece of w begins at `second` (5: no gap).
std::string write_sharded_with_adam(const testing::TempDir& dir, bool names = true, int64_t second = 5) {
  const std::string path = dir.file("s.ckpt"), id = "00000000000000ab";
  for (int64_t rank = 0; rank < 2; ++rank) {
    ParameterPieces pieces;
    const int64_t begin = rank == 0 ? 0 : second, end = rank == 0 ? 5 : 12;
    pieces["w"] = ParameterPiece{
        .values = whole_w().reshape({-1}).narrow(0, begin, end - begin), .shape = {3, 4}, .begin = begin, .end = end};
    save_checkpoint_file(make_shard({adam_piece(rank)}, make_parameter_pieces(pieces), id, rank, 2),
                         shard_path(path, id, rank));
  }
  WriterDict weights = writer_dict();
  weights.insert("b", whole_b());
  c10::impl::GenericList sharded(c10::StringType::get());
  sharded.push_back("w");
  WriterDict checkpoint = writer_dict();
  checkpoint.insert("state_dict", weights);
  checkpoint.insert(kShardedParametersKey, sharded);
  checkpoint.insert(kShardIndexKey, make_shard_index(path, id, 2, /*optimizer_states=*/true));
  if (names) {
    c10::impl::GenericList all(c10::ListType::ofStrings());
    all.push_back(c10::List<std::string>({"w", "b"}));
    checkpoint.insert(kOptimizerParameterNamesKey, all);
  }
  save_checkpoint_file(checkpoint, path);
  return path;
}

TEST(DcpWriter, EachProcessPiecesOfTheModelAndAdamAreReadBackWhole) {
  testing::TempDir dir;
  const std::string out = dir.file("dcp");
  EXPECT_GT(save_checkpoint_as_dcp_native(write_sharded_with_adam(dir), out), 0U);
  EXPECT_TRUE(std::filesystem::exists(out + "/__0_0.distcp"));
  EXPECT_TRUE(std::filesystem::exists(out + "/__1_0.distcp"));

  const DcpCheckpoint checkpoint = DcpCheckpoint::open(out);
  EXPECT_TRUE(at::equal(checkpoint.read("model.w"), whole_w()));
  EXPECT_TRUE(at::equal(checkpoint.read("model.b"), whole_b()));
  // Rank 1's file holds its boxes of w (the rest of row 1, then row 2): pieces, not the whole.
  EXPECT_EQ(checkpoint.tensor("model.w").chunks.size(), 4U);
  EXPECT_TRUE(at::equal(checkpoint.read("optim.state.w.exp_avg"), whole_w() + 100));
  EXPECT_TRUE(at::equal(checkpoint.read("optim.state.b.exp_avg_sq"), (whole_b() + 200) * 2));
  EXPECT_EQ(checkpoint.read("optim.state.w.step").item<float>(), 2.0F);
  EXPECT_EQ(checkpoint.tensor("optim.state.w.step").chunks.size(), 1U) << "replicated: written once";
  EXPECT_EQ(checkpoint.read_value("optim.param_groups.0.lr").toDouble(), 0.1);
  EXPECT_EQ(checkpoint.read_value("optim.param_groups.0.params").toListRef().size(), 2U);
  EXPECT_EQ(checkpoint.read_value("optim.param_groups.0.params").toListRef()[0].toStringRef(), "w");
  // PyTorch 2.x's fields that LibTorch's Adam lacks, at PyTorch's defaults.
  EXPECT_TRUE(checkpoint.read_value("optim.param_groups.0.foreach").isNone());
  EXPECT_FALSE(checkpoint.read_value("optim.param_groups.0.decoupled_weight_decay").toBool());

  // The optimizer state as Volt resumes it from PyTorch's folders: numbered by the groups' names.
  const WriterDict state = dcp_optimizer_state_dict(checkpoint).toGenericDict().at("state").toGenericDict();
  EXPECT_TRUE(at::equal(state.at(int64_t{0}).toGenericDict().at("exp_avg").toTensor(), whole_w() + 100));
  EXPECT_TRUE(at::equal(state.at(int64_t{1}).toGenericDict().at("exp_avg").toTensor(), whole_b() + 200));

  const std::string message = testing::error_message<CheckpointError>(
      [&] { save_checkpoint_as_dcp_native(write_sharded_with_adam(dir), out); });
  EXPECT_NE(message.find("already holds a distributed checkpoint"), std::string::npos) << message;
}

TEST(DcpWriter, OptimizerStatesWithoutParameterNamesAreRefusedUnlessOnlyTheWeightsAreAskedFor) {
  testing::TempDir dir;
  const std::string path = write_sharded_with_adam(dir, /*names=*/false);
  const std::string message =
      testing::error_message<CheckpointError>([&] { save_checkpoint_as_dcp_native(path, dir.file("a")); });
  EXPECT_NE(message.find("not the names of their parameters ('volt_optimizer_parameter_names')"), std::string::npos)
      << message;
  EXPECT_NE(message.find("HINT: it was written by an older Volt"), std::string::npos) << message;
  EXPECT_FALSE(std::filesystem::exists(dir.file("a") + "/.metadata"));

  EXPECT_EQ(save_checkpoint_as_dcp_native(path, dir.file("b"), /*weights_only=*/true), 2U);
  const DcpCheckpoint checkpoint = DcpCheckpoint::open(dir.file("b"));
  EXPECT_EQ(checkpoint.tensor_names(), (std::vector<std::string>{"model.b", "model.w"}));
  EXPECT_TRUE(checkpoint.value_names().empty());
}

TEST(DcpWriter, AWholeCheckpointsOptimizersAreMergedIntoRankZerosFileAndAnArchivedOneIsRefused) {
  testing::TempDir dir;
  // A full checkpoint (one process, or fsdp's gathered state): Adam's state whole, unmarked.
  WriterDict adam = split_shard_marker(adam_piece(0)).second.toGenericDict().copy();
  c10::impl::GenericDict state(c10::IntType::get(), c10::AnyType::get());
  WriterDict w = writer_dict();
  w.insert("step", at::tensor(3.0F));
  w.insert("exp_avg", whole_w() + 100);
  state.insert(int64_t{0}, w);
  adam.insert_or_assign("state", state);
  WriterDict adam_group = adam.at("param_groups").toListRef()[0].toGenericDict().copy();
  adam_group.insert_or_assign("params", c10::List<int64_t>({0}));
  c10::impl::GenericList adam_groups(c10::AnyType::get());
  adam_groups.push_back(adam_group);
  adam.insert_or_assign("param_groups", adam_groups);
  // A second optimizer (a GAN's), SGD over b: merged as get_optimizer_state_dict merges several.
  WriterDict sgd = writer_dict();
  sgd.insert("volt_optimizer", std::string("SGD"));
  c10::impl::GenericDict sgd_state(c10::IntType::get(), c10::AnyType::get());
  WriterDict momentum = writer_dict();
  momentum.insert("momentum_buffer", whole_b() * 3);
  sgd_state.insert(int64_t{0}, momentum);
  sgd.insert("state", sgd_state);
  WriterDict sgd_group = writer_dict();
  sgd_group.insert("lr", 0.5);
  sgd_group.insert("momentum", 0.9);
  sgd_group.insert("params", c10::List<int64_t>({0}));
  c10::impl::GenericList sgd_groups(c10::AnyType::get());
  sgd_groups.push_back(sgd_group);
  sgd.insert("param_groups", sgd_groups);
  c10::impl::GenericList optimizers(c10::AnyType::get());
  optimizers.push_back(adam);
  optimizers.push_back(sgd);
  WriterDict weights = writer_dict();
  weights.insert("w", whole_w());
  weights.insert("b", whole_b());
  c10::impl::GenericList names(c10::ListType::ofStrings());
  names.push_back(c10::List<std::string>({"w"}));
  names.push_back(c10::List<std::string>({"b"}));
  WriterDict checkpoint = writer_dict();
  checkpoint.insert("state_dict", weights);
  checkpoint.insert("optimizer_states", optimizers);
  checkpoint.insert(kOptimizerParameterNamesKey, names);
  save_checkpoint_file(checkpoint, dir.file("full.ckpt"));

  save_checkpoint_as_dcp_native(dir.file("full.ckpt"), dir.file("dcp"));
  EXPECT_FALSE(std::filesystem::exists(dir.file("dcp") + "/__1_0.distcp"));
  const DcpCheckpoint exported = DcpCheckpoint::open(dir.file("dcp"));
  EXPECT_TRUE(at::equal(exported.read("optim.state.w.exp_avg"), whole_w() + 100));
  EXPECT_EQ(exported.read("optim.state.w.step").item<float>(), 3.0F);
  EXPECT_TRUE(at::equal(exported.read("model.b"), whole_b()));
  EXPECT_TRUE(at::equal(exported.read("optim.state.b.momentum_buffer"), whole_b() * 3));
  EXPECT_EQ(exported.read_value("optim.param_groups.1.lr").toDouble(), 0.5);
  EXPECT_EQ(exported.read_value("optim.param_groups.1.params").toListRef()[0].toStringRef(), "b");
  const std::vector<std::string> values = exported.value_names();
  EXPECT_EQ(std::count(values.begin(), values.end(), "optim.param_groups.1.decoupled_weight_decay"), 0)
      << "an Adam field, not SGD's";
  EXPECT_EQ(std::count(values.begin(), values.end(), "optim.param_groups.1.fused"), 1);

  // LibTorch's own archive of an optimizer Volt has no PyTorch layout for (LBFGS): no state to key.
  WriterDict archived = writer_dict();
  archived.insert("volt_optimizer", std::string("torch::optim::LBFGS"));
  archived.insert("volt_libtorch_archive", at::zeros({4}, at::kByte));
  archived.insert("param_groups", adam.at("param_groups"));
  optimizers.set(0, archived);
  optimizers.pop_back();
  names.pop_back();
  checkpoint.insert_or_assign("optimizer_states", optimizers);
  save_checkpoint_file(checkpoint, dir.file("lbfgs.ckpt"));
  const std::string message = testing::error_message<CheckpointError>(
      [&] { save_checkpoint_as_dcp_native(dir.file("lbfgs.ckpt"), dir.file("lbfgs")); });
  EXPECT_NE(message.find("the state of optimizer 'torch::optim::LBFGS' is LibTorch's own archive"), std::string::npos)
      << message;
}

TEST(DcpWriter, PiecesWithAGapAreRefusedAndTheFilesWrittenBeforeAreRemoved) {
  testing::TempDir dir;
  const std::string out = dir.file("dcp");
  const std::string message = testing::error_message<CheckpointError>(
      [&] { save_checkpoint_as_dcp_native(write_sharded_with_adam(dir, true, /*second=*/6), out); });
  EXPECT_NE(message.find("the shards' pieces of 'w' leave out element 5"), std::string::npos) << message;
  EXPECT_TRUE(std::filesystem::is_empty(out)) << "no .distcp file of the failed export is left";
}

}  // namespace
}  // namespace volt
