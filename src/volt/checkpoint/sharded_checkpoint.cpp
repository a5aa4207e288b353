#include "volt/checkpoint/sharded_checkpoint.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <random>

#include "volt/checkpoint/checkpoint_io.h"
#include "volt/core/error.h"
#include "volt/core/strings.h"

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

c10::IValue make_shard_index(const std::string& path, const std::string& save_id, int64_t world_size,
                             bool optimizer_states) {
  GenericDict index = new_dict();
  index.insert("volt_shard_version", kShardVersion);
  index.insert("save_id", save_id);
  index.insert("world_size", world_size);
  index.insert("optimizer_states", optimizer_states);
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
  // Absent in indexes written before weights-only checkpoints could be sharded: those held them.
  if (index.contains("optimizer_states")) {
    if (!index.at("optimizer_states").isBool()) throw malformed(path, "optimizer_states is not a bool");
    out.optimizer_states = index.at("optimizer_states").toBool();
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

c10::IValue make_parameter_pieces(const ParameterPieces& pieces) {
  GenericDict out = new_dict();
  for (const auto& [name, piece] : pieces) {
    GenericDict entry = new_dict();
    entry.insert("values", piece.values);
    entry.insert("shape", piece.shape);
    entry.insert("begin", piece.begin);
    entry.insert("end", piece.end);
    out.insert(name, entry);
  }
  return out;
}

ParameterPieces read_parameter_pieces(const c10::IValue& value, const std::string& file) {
  const auto bad = [&file](const std::string& what) {
    return CheckpointError(
        fmt::format("shard file '{}' holds malformed parameter pieces: {}. HINT: it was not written "
                    "by Volt's sharded checkpointing, or was edited; resume from another checkpoint.",
                    file, what));
  };
  ParameterPieces out;
  if (value.isNone()) return out;
  if (!value.isGenericDict()) throw bad("not a dict");
  for (const auto& item : value.toGenericDict()) {
    if (!item.key().isString() || !item.value().isGenericDict()) throw bad("an entry is not name -> dict");
    const std::string& name = item.key().toStringRef();
    const GenericDict entry = item.value().toGenericDict();
    for (const char* key : {"values", "shape", "begin", "end"}) {
      if (!entry.contains(key)) throw bad(fmt::format("'{}' has no '{}'", name, key));
    }
    if (!entry.at("values").isTensor() || !entry.at("shape").isList() || !entry.at("begin").isInt() ||
        !entry.at("end").isInt())
      throw bad(fmt::format("'{}' has a field of the wrong type", name));
    ParameterPiece piece{.values = entry.at("values").toTensor(),
                         .shape = {},
                         .begin = entry.at("begin").toInt(),
                         .end = entry.at("end").toInt()};
    // A loaded list is Any-typed: read it element by element.
    for (const c10::IValue& size : entry.at("shape").toListRef()) {
      if (!size.isInt()) throw bad(fmt::format("'{}' has a shape that is not a list of integers", name));
      piece.shape.push_back(size.toInt());
    }
    if (piece.begin < 0 || piece.end < piece.begin || piece.end > c10::multiply_integers(piece.shape) ||
        piece.values.numel() != piece.end - piece.begin)
      throw bad(fmt::format("'{}' holds {} values for elements [{}, {}) of shape {}", name, piece.values.numel(),
                            piece.begin, piece.end, c10::str(c10::IntArrayRef(piece.shape))));
    out.emplace(name, std::move(piece));
  }
  return out;
}

c10::IValue make_shard(const std::vector<c10::IValue>& optimizer_states, const c10::IValue& parameters,
                       const std::string& save_id, int64_t rank, int64_t world_size) {
  GenericDict shard = new_dict();
  shard.insert("volt_shard_version", kShardVersion);
  shard.insert("save_id", save_id);
  shard.insert("rank", rank);
  shard.insert("world_size", world_size);
  GenericList states(c10::AnyType::get());
  for (const c10::IValue& state : optimizer_states) states.push_back(state);
  shard.insert("optimizer_states", states);
  shard.insert("parameters", parameters);
  return shard;
}

Shard load_shard(CheckpointIO& io, const std::string& path, const ShardIndex& index, int64_t rank) {
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
  Shard shard{.optimizer_states = std::vector<c10::IValue>(list.begin(), list.end()), .parameters = {}};
  // Shards written before full_shard's parameters were sharded hold none.
  if (value.toGenericDict().contains("parameters"))
    shard.parameters = read_parameter_pieces(value.toGenericDict().at("parameters"), file);
  return shard;
}

std::optional<std::string> locate_shard(const CheckpointIO& io, const std::string& path, const ShardIndex& index,
                                        int64_t rank, const std::vector<std::string>& folders) {
  std::vector<std::string> where{directory_of(path)};
  where.insert(where.end(), folders.begin(), folders.end());
  const std::string name = fs::path(path).filename().string();
  for (size_t i = 0; i < where.size(); ++i) {
    if (i > 0 && where[i].empty()) continue;
    const std::string file = in_directory(where[i], index.files[static_cast<size_t>(rank)]);
    std::error_code ec;
    if (io.exists(file) || fs::exists(file, ec)) return in_directory(where[i], name);
  }
  return std::nullopt;
}

void remove_shards(CheckpointIO& io, const std::string& path, const std::string& keep_save_id) {
  // Only this checkpoint's shard files: another checkpoint whose name merely begins with this
  // one's (last.ckpt.bak) is not touched.
  const std::string name = fs::path(path).filename().string();
  for (const std::string& file : io.list(path + ".")) {
    const std::optional<ShardFileName> shard = parse_shard_file_name(fs::path(file).filename().string());
    if (!shard || shard->checkpoint != name || shard->save_id == keep_save_id) continue;
    io.remove(file);
  }
}

namespace {

// Each optimizer's state with every rank's elementwise pieces concatenated back into whole tensors.
GenericList consolidate_optimizer_states(const std::vector<Shard>& shards, const std::string& path) {
  const size_t optimizers = shards.front().optimizer_states.size();
  GenericList whole(c10::AnyType::get());
  for (size_t k = 0; k < optimizers; ++k) {
    // Every rank's state of optimizer k, unmarked, and rank 0's marker.
    std::vector<GenericDict> states;
    std::optional<ShardMarker> marker;
    for (size_t r = 0; r < shards.size(); ++r) {
      VOLT_CHECK(shards[r].optimizer_states.size() == optimizers,
                 "shard {} of checkpoint '{}' holds {} optimizer states, rank 0's {}. HINT: the set is mixed up; "
                 "resume from another checkpoint.",
                 r, path, shards[r].optimizer_states.size(), optimizers);
      auto [rank_marker, state] = split_shard_marker(shards[r].optimizer_states[k]);
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
    GenericDict out = split_shard_marker(shards[0].optimizer_states[k]).second.toGenericDict().copy();
    out.insert_or_assign("state", state);
    whole.push_back(out);
  }
  return whole;
}

// Parameter `name` whole from every rank's piece: the pieces must tile its elements in order.
at::Tensor consolidate_parameter(const std::vector<Shard>& shards, const std::string& name, const std::string& path) {
  std::vector<const ParameterPiece*> pieces;
  for (size_t r = 0; r < shards.size(); ++r) {
    const auto found = shards[r].parameters.find(name);
    if (found == shards[r].parameters.end()) {
      throw CheckpointError(
          fmt::format("checkpoint '{}' lists parameter '{}' as sharded, but shard {} holds no piece of it. HINT: the "
                      "set is incomplete or mixed up; resume from another checkpoint.",
                      path, name, r));
    }
    pieces.push_back(&found->second);
  }
  std::stable_sort(pieces.begin(), pieces.end(), [](const auto* a, const auto* b) { return a->begin < b->begin; });
  const std::vector<int64_t>& shape = pieces.front()->shape;
  std::vector<at::Tensor> values;
  int64_t next = 0;
  for (const ParameterPiece* piece : pieces) {
    if (piece->begin == piece->end) continue;  // a process that holds none of it
    if (piece->shape != shape || piece->begin != next) {
      throw CheckpointError(fmt::format(
          "the shards of checkpoint '{}' do not tile parameter '{}' (shape {}): a piece of shape {} covers elements "
          "[{}, {}) where element {} comes next. HINT: the set is mixed up; resume from another checkpoint.",
          path, name, c10::str(c10::IntArrayRef(shape)), c10::str(c10::IntArrayRef(piece->shape)), piece->begin,
          piece->end, next));
    }
    values.push_back(piece->values.reshape({-1}));
    next = piece->end;
  }
  const int64_t numel = c10::multiply_integers(shape);
  if (next != numel) {
    throw CheckpointError(
        fmt::format("the shards of checkpoint '{}' hold elements [0, {}) of parameter '{}', which has {}. HINT: the "
                    "set is incomplete or mixed up; resume from another checkpoint.",
                    path, next, name, numel));
  }
  return values.empty() ? at::empty(shape, pieces.front()->values.options()) : at::cat(values).view(shape);
}

}  // namespace

c10::IValue consolidate_sharded_checkpoint(CheckpointIO& io, const std::string& path) {
  const c10::IValue checkpoint = io.load(path);
  const std::optional<ShardIndex> index = read_shard_index(checkpoint, path);
  VOLT_CHECK(index.has_value(),
             "checkpoint '{}' is not sharded: it holds its optimizer states itself. HINT: use it as it is.", path);
  std::vector<Shard> shards;
  for (int64_t r = 0; r < index->world_size; ++r) shards.push_back(load_shard(io, path, *index, r));
  GenericDict top = checkpoint.toGenericDict().copy();
  if (top.contains(kShardedParametersKey)) {
    if (!top.contains("state_dict") || !top.at("state_dict").isGenericDict() ||
        !top.at(kShardedParametersKey).isList()) {
      throw CheckpointError(
          fmt::format("checkpoint '{}' lists sharded parameters but holds no state_dict. HINT: it was not written by "
                      "Volt; resume from another checkpoint.",
                      path));
    }
    GenericDict weights = top.at("state_dict").toGenericDict().copy();
    for (const c10::IValue& name : top.at(kShardedParametersKey).toListRef()) {
      weights.insert_or_assign(name.toStringRef(), consolidate_parameter(shards, name.toStringRef(), path));
    }
    top.insert_or_assign("state_dict", weights);
    (void)top.erase(kShardedParametersKey);
  }
  (void)top.erase(kShardIndexKey);
  if (index->optimizer_states) top.insert("optimizer_states", consolidate_optimizer_states(shards, path));
  return top;
}

}  // namespace volt
