// `volt checkpoint to-safetensors`'s library half: a checkpoint's state_dict, also a sharded one's,
// as a safetensors file.
#include "volt/checkpoint/state_dict_export.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "volt/checkpoint/checkpoint_io.h"
#include "volt/checkpoint/sharded_checkpoint.h"
#include "volt/core/testing.h"

namespace volt {
namespace {

using ExportedDict = c10::impl::GenericDict;

ExportedDict exported_dict() { return ExportedDict(c10::StringType::get(), c10::AnyType::get()); }

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
  const std::string path = dir.file("s.ckpt"), id = "00000000000000ab";
  // fsdp full_shard with one process: "w" lies in the shard file, "b" in the checkpoint.
  ParameterPieces pieces;
  pieces["w"] = ParameterPiece{.values = at::arange(4, at::kFloat), .shape = {2, 2}, .begin = 0, .end = 4};
  save_checkpoint_file(make_shard({}, make_parameter_pieces(pieces), id, 0, 1), shard_path(path, id, 0));
  ExportedDict weights = exported_dict();
  weights.insert("b", at::ones({2}));
  c10::impl::GenericList sharded(c10::StringType::get());
  sharded.push_back("w");
  ExportedDict checkpoint = exported_dict();
  checkpoint.insert("state_dict", weights);
  checkpoint.insert(kShardedParametersKey, sharded);
  checkpoint.insert(kShardIndexKey, make_shard_index(path, id, 1, /*optimizer_states=*/false));
  save_checkpoint_file(checkpoint, path);

  const NamedTensors tensors = load_checkpoint_state_dict(path);
  ASSERT_EQ(tensors.size(), 2U);
  for (const auto& [name, tensor] : tensors) {
    EXPECT_TRUE(at::equal(tensor, name == "w" ? at::arange(4, at::kFloat).view({2, 2}) : at::ones({2}))) << name;
  }
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
