// `volt checkpoint to-safetensors`'s and `to-dcp`'s library half: a checkpoint's state_dict, also a
// sharded one's, as a safetensors file, or as the chunks PyTorch's distributed checkpoint reads.
#include "volt/checkpoint/state_dict_export.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "volt/checkpoint/checkpoint_io.h"
#include "volt/checkpoint/sharded_checkpoint.h"
#include "volt/core/testing.h"

namespace volt {
namespace {

using ExportedDict = c10::impl::GenericDict;

ExportedDict exported_dict() { return ExportedDict(c10::StringType::get(), c10::AnyType::get()); }

// A full_shard checkpoint whose "w" (of `shape`, values 0, 1, 2, ...) lies in the shard files, process
// r holding elements ranges[r], and whose "b" (ones) lies in the checkpoint itself.
std::string write_sharded(const testing::TempDir& dir, const std::vector<int64_t>& shape,
                          const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  const std::string path = dir.file("s.ckpt"), id = "00000000000000cd";
  const at::Tensor w = at::arange(c10::multiply_integers(shape), at::kFloat);
  const auto world = static_cast<int64_t>(ranges.size());
  for (int64_t rank = 0; rank < world; ++rank) {
    const auto [begin, end] = ranges[static_cast<size_t>(rank)];
    ParameterPieces pieces;
    pieces["w"] = ParameterPiece{.values = w.narrow(0, begin, end - begin), .shape = shape, .begin = begin, .end = end};
    save_checkpoint_file(make_shard({}, make_parameter_pieces(pieces), id, rank, world), shard_path(path, id, rank));
  }
  ExportedDict weights = exported_dict();
  weights.insert("b", at::ones({2}));
  c10::impl::GenericList sharded(c10::StringType::get());
  sharded.push_back("w");
  ExportedDict checkpoint = exported_dict();
  checkpoint.insert("state_dict", weights);
  checkpoint.insert(kShardedParametersKey, sharded);
  checkpoint.insert(kShardIndexKey, make_shard_index(path, id, world, /*optimizer_states=*/false));
  save_checkpoint_file(checkpoint, path);
  return path;
}

TEST(StateDictExport, WritesTheStateDictAsStoredWithPtMetadata) {
  testing::TempDir dir;
  ExportedDict weights = exported_dict();
  weights.insert("transformer.wte.weight", at::arange(6, at::kFloat).view({3, 2}));
  weights.insert("transformer.ln_f.bias", at::full({2}, 0.5, at::kBFloat16));
  weights.insert("running_count", at::tensor(int64_t{7}));
  ExportedDict checkpoint = exported_dict();
  checkpoint.insert("epoch", int64_t{1});
  checkpoint.insert("state_dict", weights);
  save_checkpoint_file(checkpoint, dir.file("a.ckpt"));

  EXPECT_EQ(save_state_dict_as_safetensors(dir.file("a.ckpt"), dir.file("a.safetensors")), 3U);
  const SafetensorsFile file = SafetensorsFile::open(dir.file("a.safetensors"));
  EXPECT_EQ(file.names(),
            (std::vector<std::string>{"running_count", "transformer.ln_f.bias", "transformer.wte.weight"}));
  EXPECT_EQ(file.metadata(), (SafetensorsMetadata{{"format", "pt"}}));
  EXPECT_TRUE(at::equal(file.tensor("transformer.wte.weight"), at::arange(6, at::kFloat).view({3, 2})));
  EXPECT_EQ(file.info("transformer.ln_f.bias").dtype_name, "BF16");
  EXPECT_EQ(file.tensor("running_count").item<int64_t>(), 7);
}

TEST(StateDictExport, ConsolidatesASingleShardedCheckpoint) {
  testing::TempDir dir;
  // fsdp full_shard with one process: "w" lies in the shard file, "b" in the checkpoint.
  const std::string path = write_sharded(dir, {2, 2}, {{0, 4}});

  const NamedTensors tensors = load_checkpoint_state_dict(path);
  ASSERT_EQ(tensors.size(), 2U);
  for (const auto& [name, tensor] : tensors) {
    EXPECT_TRUE(at::equal(tensor, name == "w" ? at::arange(4, at::kFloat).view({2, 2}) : at::ones({2}))) << name;
  }
}

TEST(StateDictExport, FlatRangeBoxesTileEveryRangeOfATensor) {
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{7}, {3, 4}, {2, 3, 4}}) {
    const int64_t numel = c10::multiply_integers(shape);
    const at::Tensor whole = at::arange(numel, at::kLong).view(shape);
    for (int64_t begin = 0; begin <= numel; ++begin) {
      for (int64_t end = begin; end <= numel; ++end) {
        const std::vector<TensorBox> boxes = flat_range_boxes(shape, begin, end);
        EXPECT_LE(boxes.size(), 2 * (shape.size() - 1) + 1);
        int64_t next = begin;
        for (const TensorBox& box : boxes) {
          ASSERT_EQ(box.begin, next) << "shape " << shape.size() << "-d [" << begin << ", " << end << ")";
          at::Tensor block = whole;
          for (size_t d = 0; d < shape.size(); ++d) {
            block = block.narrow(static_cast<int64_t>(d), box.offsets[d], box.sizes[d]);
          }
          // The box holds exactly the run of elements it claims, in row-major order.
          ASSERT_TRUE(at::equal(block.reshape({-1}), at::arange(box.begin, box.begin + box.numel(), at::kLong)));
          next += box.numel();
        }
        ASSERT_EQ(next, end) << "[" << begin << ", " << end << ")";
      }
    }
  }
  EXPECT_THROW(flat_range_boxes({3, 4}, 5, 13), Error);
}

TEST(StateDictExport, ADcpFolderHoldsEachProcessPiecesAsBoxesThatRebuildTheWhole) {
  testing::TempDir dir;
  const std::string path = write_sharded(dir, {3, 4}, {{0, 5}, {5, 12}});
  const std::string out = dir.file("dcp");
  // model.safetensors (b); process 0: row 0 and row 1's first element; process 1: the rest of
  // row 1, then row 2.
  EXPECT_EQ(save_checkpoint_as_dcp(path, out, "model."), 5U);
  at::Tensor rebuilt = at::zeros({3, 4});
  int64_t elements = 0;
  for (const char* name : {"shard0-0", "shard0-1", "shard1-0", "shard1-1"}) {
    const SafetensorsFile file = SafetensorsFile::open(out + "/" + name + ".safetensors");
    ASSERT_EQ(file.names(), std::vector<std::string>{"model.w"}) << name;
    const auto offsets = nlohmann::json::parse(file.metadata().at("DCP_SHARDING_INFO"))["model.w"]["saved_offsets"];
    const at::Tensor box = file.tensor("model.w");
    rebuilt.narrow(0, offsets[0], box.size(0)).narrow(1, offsets[1], box.size(1)).copy_(box);
    elements += box.numel();
  }
  EXPECT_EQ(elements, 12);
  EXPECT_TRUE(at::equal(rebuilt, at::arange(12, at::kFloat).view({3, 4})));
  const SafetensorsFile whole = SafetensorsFile::open(out + "/model.safetensors");
  EXPECT_TRUE(at::equal(whole.tensor("model.b"), at::ones({2})));
  EXPECT_EQ(whole.metadata().at("DCP_SHARDING_INFO"), R"({"model.b":{"saved_offsets":[0]}})");
  // A second export into the same folder would mix its files with these.
  const std::string message = testing::error_message<CheckpointError>([&] { save_checkpoint_as_dcp(path, out); });
  EXPECT_NE(message.find("write into an empty folder"), std::string::npos) << message;
}

TEST(StateDictExport, ADcpExportRefusesPiecesWithAGap) {
  testing::TempDir dir;
  const std::string path = write_sharded(dir, {3, 4}, {{0, 5}, {6, 12}});  // element 5 is in no piece
  const std::string message =
      testing::error_message<CheckpointError>([&] { save_checkpoint_as_dcp(path, dir.file("dcp")); });
  EXPECT_NE(message.find("the shards' pieces of 'w' leave out element 5"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT"), std::string::npos) << message;
}

TEST(StateDictExport, RefusesFilesWithoutAStateDictOfTensors) {
  testing::TempDir dir;
  ExportedDict no_weights = exported_dict();
  no_weights.insert("epoch", int64_t{1});
  save_checkpoint_file(no_weights, dir.file("none.ckpt"));
  std::string message =
      testing::error_message<CheckpointError>([&] { load_checkpoint_state_dict(dir.file("none.ckpt")); });
  EXPECT_NE(message.find("none.ckpt has no \"state_dict\" dict: it holds no model weights. HINT:"), std::string::npos)
      << message;

  ExportedDict weights = exported_dict();
  weights.insert("w", at::ones({1}));
  weights.insert("note", std::string("not a tensor"));
  ExportedDict checkpoint = exported_dict();
  checkpoint.insert("state_dict", weights);
  save_checkpoint_file(checkpoint, dir.file("odd.ckpt"));
  message = testing::error_message<CheckpointError>([&] { load_checkpoint_state_dict(dir.file("odd.ckpt")); });
  EXPECT_NE(message.find("state_dict entry 'note' is a String, not a tensor. HINT:"), std::string::npos) << message;
  message = testing::error_message<CheckpointError>([&] { load_checkpoint_state_dict(dir.file("missing.ckpt")); });
  EXPECT_NE(message.find("missing.ckpt"), std::string::npos) << message;
}

}  // namespace
}  // namespace volt
