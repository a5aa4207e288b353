#include "volt/checkpoint/sharded_checkpoint.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <filesystem>
#include <random>
#include <regex>

#include "volt/checkpoint/checkpoint_io.h"
#include "volt/core/error.h"

namespace volt {

namespace {

namespace fs = std::filesystem;
using GenericDict = c10::impl::GenericDict;
using GenericList = c10::impl::GenericList;

GenericDict new_dict() { return GenericDict(c10::StringType::get(), c10::AnyType::get()); }

constexpr int64_t kShardVersion = 1;

std::string directory_of(const std::string& path) {
  const fs::path p(path);
  return p.has_parent_path() ? p.parent_path().string() : "";
}

std::string in_directory(const std::string& dir, const std::string& name) {
  return dir.empty() ? name : (fs::path(dir) / name).string();
}

CheckpointError malformed(const std::string& path, const std::string& what) {
  return CheckpointError(
      fmt::format("checkpoint '{}' has a malformed shard index: {}. HINT: the file was not "
                  "written by Volt's sharded checkpointing, or was edited; resume from another "
                  "checkpoint.",
                  path, what));
}

}  // namespace

std::string shard_path(const std::string& path, const std::string& save_id, int64_t rank) {
  return fmt::format("{}.{}.shard{}", path, save_id, rank);
}

std::string new_save_id() {
  std::random_device device;
  const uint64_t id = (static_cast<uint64_t>(device()) << 32U) ^ device();
  return fmt::format("{:016x}", id);
}

c10::IValue make_shard_index(const std::string& path, const std::string& save_id, int64_t world_size) {
  GenericDict index = new_dict();
  index.insert("volt_shard_version", kShardVersion);
  index.insert("save_id", save_id);
  index.insert("world_size", world_size);
  GenericList files(c10::StringType::get());
  for (int64_t r = 0; r < world_size; ++r) files.push_back(fs::path(shard_path(path, save_id, r)).filename().string());
  index.insert("files", files);
  return index;
}

std::optional<ShardIndex> read_shard_index(const c10::IValue& checkpoint, const std::string& path) {
  if (!checkpoint.isGenericDict()) return std::nullopt;
  const GenericDict top = checkpoint.toGenericDict();
  if (!top.contains(kShardIndexKey)) return std::nullopt;
  const c10::IValue value = top.at(kShardIndexKey);
  if (!value.isGenericDict()) throw malformed(path, "it is not a dict");
  const GenericDict index = value.toGenericDict();
  for (const char* key : {"volt_shard_version", "save_id", "world_size", "files"}) {
    if (!index.contains(key)) throw malformed(path, fmt::format("no '{}'", key));
  }
  if (!index.at("volt_shard_version").isInt() || index.at("volt_shard_version").toInt() > kShardVersion) {
    throw CheckpointError(
        fmt::format("checkpoint '{}' has sharded optimizer states of a newer format than this Volt "
                    "reads ({}). HINT: resume with the Volt that wrote it, or upgrade Volt.",
                    path, kShardVersion));
  }
  ShardIndex out;
  if (!index.at("save_id").isString() || !index.at("world_size").isInt() || !index.at("files").isList())
    throw malformed(path, "save_id, world_size or files has the wrong type");
  out.save_id = index.at("save_id").toStringRef();
  out.world_size = index.at("world_size").toInt();
  for (const c10::IValue& file : index.at("files").toListRef()) {
    if (!file.isString()) throw malformed(path, "a file name is not a string");
    out.files.push_back(file.toStringRef());
  }
  if (out.world_size < 1 || static_cast<int64_t>(out.files.size()) != out.world_size)
    throw malformed(path, fmt::format("{} files for world_size {}", out.files.size(), out.world_size));
  return out;
}

c10::IValue mark_shard(const c10::IValue& optimizer_state, const ShardMarker& marker) {
  GenericList shapes(c10::AnyType::get());
  for (const auto& shape : marker.shapes) shapes.push_back(shape ? c10::IValue(*shape) : c10::IValue());
  GenericList keys(c10::StringType::get());
  for (const std::string& key : marker.elementwise) keys.push_back(key);
  GenericDict dict = new_dict();
  dict.insert("rank", marker.rank);
  dict.insert("world_size", marker.world_size);
  dict.insert("shapes", shapes);
  dict.insert("elementwise", keys);
  std::vector<int64_t> pieces;
  for (const auto& [begin, end] : marker.pieces) {
    pieces.push_back(begin);
    pieces.push_back(end);
  }
  dict.insert("pieces", pieces);
  GenericDict marked = optimizer_state.toGenericDict().copy();
  marked.insert_or_assign(kShardMarkerKey, dict);
  return marked;
}

std::pair<std::optional<ShardMarker>, c10::IValue> split_shard_marker(const c10::IValue& optimizer_state) {
  if (!optimizer_state.isGenericDict() || !optimizer_state.toGenericDict().contains(kShardMarkerKey))
    return {std::nullopt, optimizer_state};
  GenericDict state = optimizer_state.toGenericDict().copy();
  const GenericDict dict = state.at(kShardMarkerKey).toGenericDict();
  (void)state.erase(kShardMarkerKey);
  ShardMarker marker{.rank = dict.at("rank").toInt(), .world_size = dict.at("world_size").toInt()};
  // A loaded list is Any-typed: read it element by element.
  for (const c10::IValue& shape : dict.at("shapes").toListRef()) {
    if (shape.isNone()) {
      marker.shapes.emplace_back();
      continue;
    }
    std::vector<int64_t> sizes;
    for (const c10::IValue& size : shape.toListRef()) sizes.push_back(size.toInt());
    marker.shapes.emplace_back(std::move(sizes));
  }
  for (const c10::IValue& key : dict.at("elementwise").toListRef()) marker.elementwise.push_back(key.toStringRef());
  if (dict.contains("pieces")) {
    const auto& pieces = dict.at("pieces").toListRef();
    for (size_t i = 0; i + 1 < pieces.size(); i += 2)
      marker.pieces.emplace_back(pieces[i].toInt(), pieces[i + 1].toInt());
  }
  return {std::move(marker), state};
}

c10::IValue make_shard(const std::vector<c10::IValue>& optimizer_states, const std::string& save_id, int64_t rank,
                       int64_t world_size) {
  GenericDict shard = new_dict();
  shard.insert("volt_shard_version", kShardVersion);
  shard.insert("save_id", save_id);
  shard.insert("rank", rank);
  shard.insert("world_size", world_size);
  GenericList states(c10::AnyType::get());
  for (const c10::IValue& state : optimizer_states) states.push_back(state);
  shard.insert("optimizer_states", states);
  return shard;
}

std::vector<c10::IValue> load_shard(CheckpointIO& io, const std::string& path, const ShardIndex& index, int64_t rank) {
  VOLT_CHECK(rank >= 0 && rank < index.world_size,
             "rank {} has no shard in checkpoint '{}', which {} processes wrote. HINT: resume with {} processes, or "
             "consolidate it into one file (volt::consolidate_sharded_checkpoint).",
             rank, path, index.world_size, index.world_size);
  const std::string file = in_directory(directory_of(path), index.files[rank]);
  if (!io.exists(file)) {
    throw CheckpointError(fmt::format(
        "checkpoint '{}' is sharded, but its shard for rank {} ('{}') is missing. HINT: copy a sharded checkpoint "
        "with all its '{}.*.shard<N>' files beside it, or resume from another checkpoint.",
        path, rank, file, fs::path(path).filename().string()));
  }
  const c10::IValue value = io.load(file);
  const auto field = [&](const char* key) -> c10::IValue {
    if (!value.isGenericDict() || !value.toGenericDict().contains(key)) {
      throw CheckpointError(
          fmt::format("shard file '{}' of checkpoint '{}' has no '{}'. HINT: it was not written "
                      "by Volt's sharded checkpointing; resume from another checkpoint.",
                      file, path, key));
    }
    return value.toGenericDict().at(key);
  };
  const c10::IValue save_id = field("save_id");
  const c10::IValue shard_rank = field("rank");
  const c10::IValue world_size = field("world_size");
  if (!save_id.isString() || save_id.toStringRef() != index.save_id || !shard_rank.isInt() ||
      shard_rank.toInt() != rank || !world_size.isInt() || world_size.toInt() != index.world_size) {
    throw CheckpointError(fmt::format(
        "shard file '{}' belongs to another save than checkpoint '{}' (save {}, rank {}, {} processes; the index "
        "names save {}, rank {}, {} processes). HINT: the set was mixed up by a copy; resume from another "
        "checkpoint.",
        file, path, save_id.isString() ? save_id.toStringRef() : "?", shard_rank.isInt() ? shard_rank.toInt() : -1,
        world_size.isInt() ? world_size.toInt() : -1, index.save_id, rank, index.world_size));
  }
  const c10::IValue states = field("optimizer_states");
  if (!states.isList()) {
    throw CheckpointError(
        fmt::format("shard file '{}' holds no list of optimizer states. HINT: resume from another "
                    "checkpoint.",
                    file));
  }
  const auto list = states.toListRef();
  return std::vector<c10::IValue>(list.begin(), list.end());
}

void remove_shards(CheckpointIO& io, const std::string& path, const std::string& keep_save_id) {
  // Only names of the form <path>.<16 hex digits>.shard<N>: another checkpoint whose name merely
  // begins with this one's (last.ckpt.bak) is not touched.
  static const std::regex kShardName(R"(\.([0-9a-f]{16})\.shard[0-9]+)");
  for (const std::string& file : io.list(path + ".")) {
    std::smatch match;
    const std::string rest = file.substr(path.size());
    if (!std::regex_match(rest, match, kShardName) || match[1].str() == keep_save_id) continue;
    io.remove(file);
  }
}

c10::IValue consolidate_sharded_checkpoint(CheckpointIO& io, const std::string& path) {
  const c10::IValue checkpoint = io.load(path);
  const std::optional<ShardIndex> index = read_shard_index(checkpoint, path);
  VOLT_CHECK(index.has_value(),
             "checkpoint '{}' is not sharded: it holds its optimizer states itself. HINT: use it as it is.", path);
  std::vector<std::vector<c10::IValue>> shards;
  for (int64_t r = 0; r < index->world_size; ++r) shards.push_back(load_shard(io, path, *index, r));
  const size_t optimizers = shards.front().size();
  GenericList whole(c10::AnyType::get());
  for (size_t k = 0; k < optimizers; ++k) {
    // Every rank's state of optimizer k, unmarked, and rank 0's marker.
    std::vector<GenericDict> states;
    std::optional<ShardMarker> marker;
    for (int64_t r = 0; r < index->world_size; ++r) {
      VOLT_CHECK(shards[r].size() == optimizers,
                 "shard {} of checkpoint '{}' holds {} optimizer states, rank 0's {}. HINT: the set is mixed up; "
                 "resume from another checkpoint.",
                 r, path, shards[r].size(), optimizers);
      auto [rank_marker, state] = split_shard_marker(shards[r][k]);
      VOLT_CHECK(rank_marker.has_value(),
                 "shard {} of checkpoint '{}' holds optimizer {}'s state without Volt's shard marker. HINT: resume "
                 "from another checkpoint.",
                 r, path, k);
      if (r == 0) marker = std::move(rank_marker);
      states.push_back(state.toGenericDict().at("state").toGenericDict());
    }
    GenericDict state = states.front().copy();
    for (size_t id = 0; id < marker->shapes.size(); ++id) {
      if (!marker->shapes[id]) continue;
      const std::vector<int64_t>& shape = *marker->shapes[id];
      const c10::IValue key_id(static_cast<int64_t>(id));
      if (!state.contains(key_id)) continue;  // no step took this parameter yet
      GenericDict param_state = state.at(key_id).toGenericDict().copy();
      for (const std::string& key : marker->elementwise) {
        if (!param_state.contains(key)) continue;
        std::vector<at::Tensor> pieces;
        for (const GenericDict& rank_state : states) {
          if (!rank_state.contains(key_id)) continue;
          const GenericDict entry = rank_state.at(key_id).toGenericDict();
          if (entry.contains(key)) pieces.push_back(entry.at(key).toTensor().reshape({-1}));
        }
        const at::Tensor flat = at::cat(pieces);
        const int64_t numel = c10::multiply_integers(shape);
        if (flat.numel() != numel) {
          throw CheckpointError(fmt::format(
              "the shards of checkpoint '{}' hold {} values of optimizer {}'s '{}' for parameter {}, which has {}. "
              "HINT: the set is incomplete or mixed up; resume from another checkpoint.",
              path, flat.numel(), k, key, id, numel));
        }
        param_state.insert_or_assign(key, flat.view(shape));
      }
      state.insert_or_assign(key_id, param_state);
    }
    GenericDict out = split_shard_marker(shards[0][k]).second.toGenericDict().copy();
    out.insert_or_assign("state", state);
    whole.push_back(out);
  }
  GenericDict top = checkpoint.toGenericDict().copy();
  (void)top.erase(kShardIndexKey);
  top.insert("optimizer_states", whole);
  return top;
}

}  // namespace volt
