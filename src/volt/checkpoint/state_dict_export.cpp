#include "volt/checkpoint/state_dict_export.h"

#include <ATen/core/ivalue.h>
#include <c10/util/accumulate.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "volt/checkpoint/checkpoint_io.h"
#include "volt/checkpoint/sharded_checkpoint.h"
#include "volt/core/error.h"

namespace volt {

NamedTensors load_checkpoint_state_dict(const std::string& path) {
  c10::IValue checkpoint = load_checkpoint_file(path);
  if (!checkpoint.isGenericDict()) {
    throw CheckpointError(
        fmt::format("{} holds a {}, not a checkpoint (a dict with a \"state_dict\"). HINT: pass a .ckpt file a Volt "
                    "(or Lightning) Trainer wrote.",
                    path, checkpoint.tagKind()));
  }
  if (read_shard_index(checkpoint, path)) {
    TorchCheckpointIO io;
    checkpoint = consolidate_sharded_checkpoint(io, path);
  }
  const c10::Dict<c10::IValue, c10::IValue> dict = checkpoint.toGenericDict();
  const auto state = dict.find("state_dict");
  if (state == dict.end() || !state->value().isGenericDict()) {
    throw CheckpointError(fmt::format(
        "{} has no \"state_dict\" dict: it holds no model weights. HINT: pass a checkpoint the Trainer saved "
        "(ModelCheckpoint, or Trainer::save_checkpoint), not a file of other values.",
        path));
  }
  NamedTensors out;
  for (const auto& item : state->value().toGenericDict()) {
    if (!item.key().isString() || !item.value().isTensor()) {
      throw CheckpointError(fmt::format(
          "{}: state_dict entry {} is a {}, not a tensor. HINT: a state_dict maps parameter and buffer names "
          "to tensors; was this file written by a Volt or Lightning Trainer?",
          path, item.key().isString() ? "'" + item.key().toStringRef() + "'" : item.key().tagKind(),
          item.value().tagKind()));
    }
    out.emplace_back(item.key().toStringRef(), item.value().toTensor());
  }
  return out;
}

size_t save_state_dict_as_safetensors(const std::string& checkpoint, const std::string& out) {
  const NamedTensors tensors = load_checkpoint_state_dict(checkpoint);
  save_safetensors(out, tensors, {{"format", "pt"}});
  return tensors.size();
}

int64_t TensorBox::numel() const { return c10::multiply_integers(sizes); }

std::vector<TensorBox> flat_range_boxes(const std::vector<int64_t>& shape, int64_t begin, int64_t end) {
  const int64_t total = c10::multiply_integers(shape);
  VOLT_CHECK(0 <= begin && begin <= end && end <= total,
             "flat_range_boxes: elements [{}, {}) of a tensor of shape {} ({} elements); expected 0 <= begin <= end "
             "<= {}. HINT: a piece's range lies within its parameter.",
             begin, end, c10::str(c10::IntArrayRef(shape)), total, total);
  std::vector<TensorBox> out;
  if (begin == end) return out;
  if (shape.size() <= 1) {
    out.push_back(shape.empty() ? TensorBox{{}, {}, 0} : TensorBox{{begin}, {end - begin}, begin});
    return out;
  }
  const std::vector<int64_t> inner(shape.begin() + 1, shape.end());
  const int64_t row = total / shape[0];
  // Boxes within row `r`, over its elements [from, to): the row's own boxes, one row high.
  const auto in_row = [&](int64_t r, int64_t from, int64_t to) {
    for (TensorBox box : flat_range_boxes(inner, from, to)) {
      box.offsets.insert(box.offsets.begin(), r);
      box.sizes.insert(box.sizes.begin(), 1);
      box.begin += r * row;
      out.push_back(std::move(box));
    }
  };
  const int64_t first_row = begin / row;
  if (first_row == (end - 1) / row && (begin % row != 0 || end % row != 0)) {
    in_row(first_row, begin % row, end - first_row * row);  // within one row, not all of it
    return out;
  }
  int64_t whole_from = first_row;
  if (begin % row != 0) {
    in_row(first_row, begin % row, row);
    whole_from = first_row + 1;
  }
  const int64_t whole_to = end / row;
  if (whole_to > whole_from) {
    TensorBox box{std::vector<int64_t>(shape.size(), 0), shape, whole_from * row};
    box.offsets[0] = whole_from;
    box.sizes[0] = whole_to - whole_from;
    out.push_back(std::move(box));
  }
  if (end % row != 0) in_row(whole_to, 0, end % row);
  return out;
}

namespace {

// One file of the DCP layout: its tensors and each one's offsets in the whole.
struct DcpFile {
  NamedTensors tensors;
  nlohmann::json sharding = nlohmann::json::object();

  void add(const std::string& name, const at::Tensor& values, const std::vector<int64_t>& offsets) {
    tensors.emplace_back(name, values.contiguous());
    sharding[name] = {{"saved_offsets", offsets}};
  }
  void save(const std::string& path) const {
    save_safetensors(path, tensors, {{"DCP_SHARDING_INFO", sharding.dump()}, {"DCP_VERSION", "1.0"}, {"format", "pt"}});
  }
};

// Refuses a piece set that does not tile [0, numel) exactly.
void check_pieces_tile(const std::string& path, const std::string& name,
                       std::vector<std::pair<int64_t, int64_t>> ranges, int64_t numel) {
  std::sort(ranges.begin(), ranges.end());
  int64_t next = 0;
  for (const auto& [from, to] : ranges) {
    if (from == to) continue;
    if (!(from == next)) {
      throw CheckpointError(fmt::format(
          "{}: the shards' pieces of '{}' {} element {} ({} elements in all). HINT: the shard files come from "
          "different saves or processes; write the checkpoint again.",
          path, name, from > next ? "leave out" : "overlap at", next, numel));
    }
    next = to;
  }
  if (!(next == numel)) {
    throw CheckpointError(fmt::format(
        "{}: the shards' pieces of '{}' end at element {} of {}. HINT: a shard file is missing or from another "
        "save; write the checkpoint again.",
        path, name, next, numel));
  }
}

}  // namespace

void PieceCoverage::add(const std::string& name, int64_t begin, int64_t end, int64_t numel) {
  ranges_[name].emplace_back(begin, end);
  numels_[name] = numel;
}

void PieceCoverage::check(const std::string& path, const std::vector<std::string>& expected) const {
  for (const std::string& name : expected) {
    if (ranges_.count(name) == 0) {
      throw CheckpointError(
          fmt::format("{}: no shard holds a piece of the sharded parameter '{}'. HINT: the shard files "
                      "come from another save; write the checkpoint again.",
                      path, name));
    }
  }
  for (const auto& [name, covered] : ranges_) check_pieces_tile(path, name, covered, numels_.at(name));
}

size_t save_checkpoint_as_dcp(const std::string& path, const std::string& out, const std::string& prefix) {
  namespace fs = std::filesystem;
  if (fs::is_directory(out)) {
    for (const auto& entry : fs::directory_iterator(out)) {
      if (!(entry.path().extension() != ".safetensors")) {
        throw CheckpointError(fmt::format(
            "{} already holds {}, which PyTorch's reader would take as more chunks of the checkpoint. HINT: "
            "write into an empty folder.",
            out, entry.path().filename().string()));
      }
    }
  }
  fs::create_directories(out);
  c10::IValue checkpoint = load_checkpoint_file(path);
  if (!(checkpoint.isGenericDict() && checkpoint.toGenericDict().contains("state_dict"))) {
    throw CheckpointError(
        fmt::format("{} holds no \"state_dict\". HINT: pass a .ckpt file a Volt (or Lightning) Trainer wrote.", path));
  }
  const c10::Dict<c10::IValue, c10::IValue> top = checkpoint.toGenericDict();
  std::set<std::string> sharded;
  if (top.contains(kShardedParametersKey)) {
    for (const c10::IValue& name : top.at(kShardedParametersKey).toListRef()) sharded.insert(name.toStringRef());
  }
  DcpFile whole;
  for (const auto& item : top.at("state_dict").toGenericDict()) {
    const std::string& name = item.key().toStringRef();
    if (sharded.count(name) == 0) {
      const at::Tensor value = item.value().toTensor();
      whole.add(prefix + name, value, std::vector<int64_t>(static_cast<size_t>(value.dim()), 0));
    }
  }
  size_t files = 0;
  whole.save((fs::path(out) / "model.safetensors").string());
  ++files;
  if (sharded.empty()) return files;

  TorchCheckpointIO io;
  const std::optional<ShardIndex> index = read_shard_index(checkpoint, path);
  if (!(index.has_value())) {
    throw CheckpointError(
        fmt::format("{} lists sharded parameters but no shard index. HINT: it was not written by Volt.", path));
  }
  PieceCoverage coverage;
  for (int64_t rank = 0; rank < index->world_size; ++rank) {
    std::vector<DcpFile> boxes;  // box k of every piece of this process
    for (const auto& [name, piece] : load_shard(io, path, *index, rank).parameters) {
      if (sharded.count(name) == 0) continue;
      coverage.add(name, piece.begin, piece.end, c10::multiply_integers(piece.shape));
      const std::vector<TensorBox> cut = flat_range_boxes(piece.shape, piece.begin, piece.end);
      for (size_t k = 0; k < cut.size(); ++k) {
        if (boxes.size() <= k) boxes.emplace_back();
        const TensorBox& box = cut[k];
        boxes[k].add(prefix + name,
                     piece.values.reshape({-1}).narrow(0, box.begin - piece.begin, box.numel()).view(box.sizes),
                     box.offsets);
      }
    }
    for (size_t k = 0; k < boxes.size(); ++k) {
      boxes[k].save((fs::path(out) / fmt::format("shard{}-{}.safetensors", rank, k)).string());
      ++files;
    }
  }
  coverage.check(path, std::vector<std::string>(sharded.begin(), sharded.end()));
  return files;
}

}  // namespace volt
