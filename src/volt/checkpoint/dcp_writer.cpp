#include "volt/checkpoint/dcp_writer.h"

#include <c10/util/accumulate.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <utility>

#include "volt/checkpoint/checkpoint_io.h"
#include "volt/checkpoint/sharded_checkpoint.h"
#include "volt/checkpoint/state_dict_export.h"
#include "volt/core/error.h"

namespace volt {

namespace fs = std::filesystem;

namespace {

constexpr const char* kMetadataModule = "torch.distributed.checkpoint.metadata";

/// A protocol-2 pickle of the few kinds of values a `.metadata` holds, with no memo: what
/// Python's pickle.load reads and what PyTorch's own writer would have said with more opcodes.
class MetadataPickler {
 public:
  MetadataPickler() { bytes_ = {'\x80', '\x02'}; }  // PROTO 2

  void global(const std::string& module, const std::string& name) { raw("c" + module + "\n" + name + "\n"); }
  void string(const std::string& value) {
    op('X');  // BINUNICODE
    uint32_t size = static_cast<uint32_t>(value.size());
    append(&size, 4);
    raw(value);
  }
  void integer(int64_t value) {
    if (value >= INT32_MIN && value <= INT32_MAX) {
      op('J');  // BININT
      const auto small = static_cast<int32_t>(value);
      append(&small, 4);
    } else {
      op('\x8a');  // LONG1, 8 little-endian bytes (two's complement)
      op('\x08');
      append(&value, 8);
    }
  }
  void none() { op('N'); }
  void boolean(bool value) { op(value ? '\x88' : '\x89'); }
  void mark() { op('('); }
  void tuple() { op('t'); }  // since the mark
  void reduce() { op('R'); }
  void build() { op('b'); }
  void empty_dict() { op('}'); }
  void set_items() { op('u'); }  // since the mark
  void empty_list() { op(']'); }
  void appends() { op('e'); }  // since the mark
  /// cls.__new__(cls): a dataclass's object before BUILD fills in its fields.
  void new_object(const std::string& module, const std::string& name) {
    global(module, name);
    op(')');     // EMPTY_TUPLE
    op('\x81');  // NEWOBJ
  }
  std::vector<char> finish() {
    op('.');
    return std::move(bytes_);
  }

  /// torch.Size(values).
  void size(const std::vector<int64_t>& values) {
    global("torch", "Size");
    mark();
    mark();
    for (const int64_t v : values) integer(v);
    tuple();
    tuple();
    reduce();
  }
  /// A plain value of a planner path or a field: a string, an int.
  void plain(const c10::IValue& value) {
    if (value.isString()) {
      string(value.toStringRef());
    } else {
      integer(value.toInt());
    }
  }

 private:
  void op(char c) { bytes_.push_back(c); }
  void raw(const std::string& text) { bytes_.insert(bytes_.end(), text.begin(), text.end()); }
  void append(const void* data, size_t size) {
    const char* p = static_cast<const char*>(data);
    bytes_.insert(bytes_.end(), p, p + size);  // little-endian hosts only, as LibTorch's archives
  }

  std::vector<char> bytes_;
};

/// torch.<name> of a dtype a distributed checkpoint stores (its canonical name).
std::string torch_dtype_name(at::ScalarType dtype) {
  for (const auto& [name, known] : dcp_dtype_names()) {
    if (known == dtype) return name;
  }
  throw CheckpointError(
      fmt::format("a distributed checkpoint cannot describe a tensor of dtype {}. HINT: convert it "
                  "to a floating or integer dtype before saving.",
                  c10::toString(dtype)));
}

/// Emits dataclass `name` of `module` with `fields` (each emitted by its function) as pickle does:
/// NEWOBJ, then BUILD with the fields' dict.
template <typename Fields>
void dataclass(MetadataPickler& p, const std::string& module, const std::string& name, const Fields& fields) {
  p.new_object(module, name);
  p.empty_dict();
  if (!fields.empty()) {
    p.mark();
    for (const auto& [field, emit] : fields) {
      p.string(field);
      emit();
    }
    p.set_items();
  }
  p.build();
}

using Emit = std::function<void()>;
using Fields = std::vector<std::pair<std::string, Emit>>;

void tensor_storage_metadata(MetadataPickler& p, const DcpTensor& tensor) {
  const Emit properties = [&] {
    p.new_object(kMetadataModule, "TensorProperties");
    // __setstate__ takes (dtype, layout, requires_grad, memory format, pin_memory).
    p.mark();
    p.global("torch", torch_dtype_name(tensor.dtype));
    // The layout as PyTorch's writer pickles it: torch.serialization._get_layout("torch.strided").
    p.global("torch.serialization", "_get_layout");
    p.mark();
    p.string("torch.strided");
    p.tuple();
    p.reduce();
    p.boolean(false);
    p.global(kMetadataModule, "_MEM_FORMAT_ENCODING");
    p.mark();
    p.integer(0);  // TORCH_CONTIGUOUS_FORMAT
    p.tuple();
    p.reduce();
    p.boolean(false);
    p.tuple();
    p.build();
  };
  const Emit chunks = [&] {
    p.empty_list();
    if (tensor.chunks.empty()) return;
    p.mark();
    for (const DcpChunk& chunk : tensor.chunks) {
      dataclass(p, kMetadataModule, "ChunkStorageMetadata",
                Fields{{"offsets", [&] { p.size(chunk.offsets); }}, {"sizes", [&] { p.size(chunk.sizes); }}});
    }
    p.appends();
  };
  dataclass(p, kMetadataModule, "TensorStorageMetadata",
            Fields{{"properties", properties}, {"size", [&] { p.size(tensor.size); }}, {"chunks", chunks}});
}

void storage_entry(MetadataPickler& p, const std::string& name, const std::vector<int64_t>* offsets,
                   const DcpChunk& where) {
  dataclass(p, kMetadataModule, "MetadataIndex",
            Fields{{"fqn", [&] { p.string(name); }},
                   {"offset", [&] { offsets != nullptr ? p.size(*offsets) : p.none(); }},
                   {"index", [&] { p.none(); }}});
  dataclass(p, "torch.distributed.checkpoint.filesystem", "_StorageInfo",
            Fields{{"relative_path", [&] { p.string(where.file); }},
                   {"offset", [&] { p.integer(where.offset); }},
                   {"length", [&] { p.integer(where.length); }}});
}

}  // namespace

std::vector<char> dcp_metadata_pickle(const std::vector<DcpEntry>& entries) {
  MetadataPickler p;
  // A dict with the items `item` emits (key, value; any number) for each entry.
  const auto dict_of = [&](const std::function<void(const DcpEntry&)>& item) {
    return [&p, &entries, item] {
      p.empty_dict();
      if (entries.empty()) return;
      p.mark();
      for (const DcpEntry& entry : entries) item(entry);
      p.set_items();
    };
  };
  const Emit state_dict_metadata = dict_of([&](const DcpEntry& entry) {
    p.string(entry.name);
    if (entry.tensor) {
      tensor_storage_metadata(p, *entry.tensor);
    } else {
      dataclass(p, kMetadataModule, "BytesStorageMetadata", Fields{});
    }
  });
  const Emit planner_data = dict_of([&](const DcpEntry& entry) {
    p.string(entry.name);
    p.mark();
    for (const c10::IValue& part : entry.path) p.plain(part);
    p.tuple();
  });
  const Emit storage_data = dict_of([&](const DcpEntry& entry) {
    if (!entry.tensor) return storage_entry(p, entry.name, nullptr, entry.value);
    for (const DcpChunk& chunk : entry.tensor->chunks) storage_entry(p, entry.name, &chunk.offsets, chunk);
  });
  dataclass(p, kMetadataModule, "Metadata",
            Fields{{"state_dict_metadata", state_dict_metadata},
                   {"planner_data", planner_data},
                   {"storage_data", storage_data},
                   {"storage_meta", [&] { p.none(); }},
                   {"version", [&] { p.string("1.0.0"); }}});
  return p.finish();
}

namespace {

using GenericDict = c10::Dict<c10::IValue, c10::IValue>;

/// PyTorch 2.x's param-group fields that LibTorch's optimizers lack, at PyTorch's defaults, by
/// Volt's optimizer kind: dcp.load asks for every field the target optimizer has.
std::vector<std::pair<std::string, c10::IValue>> torch_group_defaults(const std::string& kind) {
  std::vector<std::pair<std::string, c10::IValue>> fields{
      {"maximize", false}, {"foreach", c10::IValue()}, {"differentiable", false}};
  if (kind == "Adam" || kind == "AdamW" || kind == "RMSprop") fields.emplace_back("capturable", false);
  if (kind != "RMSprop") fields.emplace_back("fused", c10::IValue());
  if (kind == "Adam" || kind == "AdamW") fields.emplace_back("decoupled_weight_decay", kind == "AdamW");
  return fields;
}

/// The folder being written: each process's `__<rank>_0.distcp`, written (flush) once that
/// process's entries are in, and the entries that point into them, written last as `.metadata`.
/// One process's bytes are held at a time.
class NativeLayout {
 public:
  explicit NativeLayout(std::string out) : out_(std::move(out)) {}
  /// A tensor box of `value` (its whole `size`) at `offsets`, into `rank`'s file.
  void add_tensor(const std::string& name, std::vector<c10::IValue> path, int64_t rank, const at::Tensor& value,
                  const std::vector<int64_t>& offsets, const std::vector<int64_t>& size) {
    DcpEntry& entry = entry_for(name, std::move(path));
    if (!entry.tensor) entry.tensor = DcpTensor{.size = size, .dtype = value.scalar_type(), .chunks = {}};
    // A clone: a view would carry its whole storage into the archive.
    DcpChunk chunk = append(rank, value.contiguous().clone());
    chunk.offsets = offsets;
    chunk.sizes = value.sizes().vec();
    entry.tensor->chunks.push_back(std::move(chunk));
  }
  /// A non-tensor value, into rank 0's file.
  void add_value(const std::string& name, std::vector<c10::IValue> path, const c10::IValue& value) {
    DcpEntry& entry = entry_for(name, std::move(path));
    entry.value = append(0, value);
  }
  /// Writes `rank`'s file (when it holds anything) and lets its bytes go.
  void flush(int64_t rank) {
    if (rank != file_rank_ || file_.empty()) return;
    const std::string path = (fs::path(out_) / file_name(rank)).string();
    write_file_atomically(path, [this](const ByteSink& sink) { sink(file_.data(), file_.size()); });
    written_.push_back(path);
    file_.clear();
    file_.shrink_to_fit();
  }
  /// Writes `.metadata`, which makes the folder a checkpoint; returns the number of entries.
  size_t finish() const {
    const std::vector<char> metadata = dcp_metadata_pickle(entries_);
    write_file_atomically((fs::path(out_) / ".metadata").string(),
                          [&](const ByteSink& sink) { sink(metadata.data(), metadata.size()); });
    return entries_.size();
  }
  /// Removes the files written: an export that failed leaves nothing behind.
  void remove_written() const {
    for (const std::string& path : written_) {
      std::error_code ec;
      fs::remove(path, ec);
    }
  }

 private:
  static std::string file_name(int64_t rank) { return fmt::format("__{}_0.distcp", rank); }
  DcpEntry& entry_for(const std::string& name, std::vector<c10::IValue> path) {
    const auto [it, inserted] = index_.emplace(name, entries_.size());
    if (inserted) entries_.push_back(DcpEntry{.name = name, .path = std::move(path), .tensor = {}, .value = {}});
    return entries_[it->second];
  }
  /// Appends value's torch.save archive (what the reader's torch.load reads) to `rank`'s file,
  /// the one being filled (processes come in order).
  DcpChunk append(int64_t rank, const c10::IValue& value) {
    VOLT_INTERNAL_ASSERT(file_.empty() || rank == file_rank_, "rank {}'s entry while rank {}'s file is filled", rank,
                         file_rank_);
    file_rank_ = rank;
    const std::vector<char> archive = save_to_bytes(value);
    DcpChunk chunk;
    chunk.file = file_name(rank);
    chunk.offset = static_cast<int64_t>(file_.size());
    chunk.length = static_cast<int64_t>(archive.size());
    file_.insert(file_.end(), archive.begin(), archive.end());
    return chunk;
  }

  std::string out_;
  std::vector<DcpEntry> entries_;
  std::map<std::string, size_t> index_;
  int64_t file_rank_ = 0;
  std::vector<char> file_;
  std::vector<std::string> written_;
};

/// Adds the boxes of `piece` (elements [begin, end) of a tensor of `shape`, flat) to `rank`'s file.
void add_piece(NativeLayout& layout, const std::string& name, const std::vector<c10::IValue>& path, int64_t rank,
               const at::Tensor& piece, const std::vector<int64_t>& shape, int64_t begin, int64_t end) {
  const at::Tensor flat = piece.reshape({-1});
  for (const TensorBox& box : flat_range_boxes(shape, begin, end))
    layout.add_tensor(name, path, rank, flat.narrow(0, box.begin - begin, box.numel()).view(box.sizes), box.offsets,
                      shape);
}

std::vector<c10::IValue> path_of(std::initializer_list<c10::IValue> parts) { return parts; }

/// The parameter names of each optimizer (kOptimizerParameterNamesKey).
std::vector<std::vector<std::string>> optimizer_parameter_names(const GenericDict& top, size_t optimizers,
                                                                const std::string& path) {
  if (!top.contains(kOptimizerParameterNamesKey)) {
    throw CheckpointError(fmt::format(
        "{} holds {} optimizer state(s) but not the names of their parameters ('{}'), which a distributed "
        "checkpoint keys them by. HINT: it was written by an older Volt: export its weights only (--weights-only), "
        "or resume it with this Volt and save again.",
        path, optimizers, kOptimizerParameterNamesKey));
  }
  std::vector<std::vector<std::string>> names;
  for (const c10::IValue& list : top.at(kOptimizerParameterNamesKey).toListRef()) {
    names.emplace_back();
    for (const c10::IValue& name : list.toListRef()) names.back().push_back(name.toStringRef());
  }
  if (names.size() != optimizers) {
    throw CheckpointError(
        fmt::format("{} names the parameters of {} optimizers and holds {} optimizer states. HINT: "
                    "the file is damaged; export another checkpoint.",
                    path, names.size(), optimizers));
  }
  return names;
}

/// The name of parameter `id` of an optimizer whose parameters are `names`.
const std::string& parameter_name_of(const std::vector<std::string>& names, int64_t id, const std::string& path) {
  if (id < 0 || static_cast<size_t>(id) >= names.size()) {
    throw CheckpointError(
        fmt::format("{}: an optimizer's state names parameter {}, and it has {} parameters. HINT: "
                    "the file is damaged; export another checkpoint.",
                    path, id, names.size()));
  }
  return names[static_cast<size_t>(id)];
}

/// Adds one optimizer's param groups from its (rank 0's) `state`, numbered on from `next_group`
/// (several optimizers' groups follow each other), "params" as its parameters' `names`.
void add_param_groups(NativeLayout& layout, const c10::IValue& state, const std::vector<std::string>& names,
                      int64_t& next_group, const std::string& path) {
  const GenericDict plain = split_shard_marker(state).second.toGenericDict();
  const std::string kind = plain.contains("volt_optimizer") ? plain.at("volt_optimizer").toStringRef() : "";
  if (!plain.contains("state") || !plain.contains("param_groups")) {
    throw CheckpointError(fmt::format(
        "{}: the state of optimizer '{}' is LibTorch's own archive, not PyTorch's state_dict layout that a "
        "distributed checkpoint holds. HINT: export the weights only (--weights-only), or train with SGD, Adam, "
        "AdamW, RMSprop or Adagrad.",
        path, kind));
  }
  for (const c10::IValue& group_value : plain.at("param_groups").toListRef()) {
    const GenericDict group = group_value.toGenericDict();
    const int64_t g = next_group++;
    const auto add = [&](const std::string& key, const c10::IValue& value) {
      layout.add_value(fmt::format("optim.param_groups.{}.{}", g, key), path_of({"optim", "param_groups", g, key}),
                       value);
    };
    for (const auto& item : group) {
      const std::string& key = item.key().toStringRef();
      if (key != "params") {
        add(key, item.value());
        continue;
      }
      c10::impl::GenericList fqns(c10::StringType::get());
      for (const c10::IValue& id : item.value().toListRef()) fqns.push_back(parameter_name_of(names, id.toInt(), path));
      add(key, fqns);
    }
    for (const auto& [key, value] : torch_group_defaults(kind)) {
      if (!group.contains(key)) add(key, value);
    }
  }
}

/// Adds process `rank`'s part of one optimizer's per-parameter state (`state`: a whole one, or
/// its marked piece of a sharded checkpoint): elementwise fields as boxes of its pieces, the
/// others (Adam's replicated step, a whole state's) once, from rank 0. `next_begin` places the
/// pieces of shards that do not record theirs, in rank order.
void add_state(NativeLayout& layout, int64_t rank, const c10::IValue& state, const std::vector<std::string>& names,
               PieceCoverage& coverage, std::map<std::pair<int64_t, std::string>, int64_t>& next_begin,
               const std::string& path) {
  const auto [marker, plain] = split_shard_marker(state);
  for (const auto& item : plain.toGenericDict().at("state").toGenericDict()) {
    const int64_t id = item.key().toInt();
    const std::string& fqn = parameter_name_of(names, id, path);
    for (const auto& field : item.value().toGenericDict()) {
      const std::string& key = field.key().toStringRef();
      const std::vector<c10::IValue> where = path_of({"optim", "state", fqn, key});
      const std::string name = fmt::format("optim.state.{}.{}", fqn, key);
      const auto at = static_cast<size_t>(id);
      const bool elementwise =
          marker && field.value().isTensor() && at < marker->shapes.size() && marker->shapes[at] &&
          std::find(marker->elementwise.begin(), marker->elementwise.end(), key) != marker->elementwise.end();
      if (!elementwise) {
        if (rank != 0) continue;
        if (field.value().isTensor()) {
          const at::Tensor value = field.value().toTensor();
          layout.add_tensor(name, where, 0, value, std::vector<int64_t>(static_cast<size_t>(value.dim()), 0),
                            value.sizes().vec());
        } else {
          layout.add_value(name, where, field.value());
        }
        continue;
      }
      const std::vector<int64_t>& shape = *marker->shapes[at];
      const at::Tensor piece = field.value().toTensor();
      const int64_t begin = at < marker->pieces.size() ? marker->pieces[at].first : next_begin[{id, key}];
      const int64_t end = begin + piece.numel();
      next_begin[{id, key}] = end;
      coverage.add(name, begin, end, c10::multiply_integers(shape));
      if (end > begin) add_piece(layout, name, where, rank, piece, shape, begin, end);
    }
  }
}

}  // namespace

size_t save_checkpoint_as_dcp_native(const std::string& path, const std::string& out, bool weights_only) {
  std::error_code ec;
  if (fs::exists(fs::path(out) / ".metadata", ec)) {
    throw CheckpointError(
        fmt::format("{} already holds a distributed checkpoint (.metadata). HINT: write into a new "
                    "folder, or remove that one first.",
                    out));
  }
  const c10::IValue checkpoint = load_checkpoint_file(path);
  if (!(checkpoint.isGenericDict() && checkpoint.toGenericDict().contains("state_dict"))) {
    throw CheckpointError(
        fmt::format("{} holds no \"state_dict\". HINT: pass a .ckpt file a Volt (or Lightning) Trainer wrote.", path));
  }
  const GenericDict top = checkpoint.toGenericDict();
  const std::optional<ShardIndex> index = read_shard_index(checkpoint, path);
  std::vector<std::string> sharded;
  if (top.contains(kShardedParametersKey)) {
    for (const c10::IValue& name : top.at(kShardedParametersKey).toListRef()) sharded.push_back(name.toStringRef());
  }
  fs::create_directories(out);
  NativeLayout layout(out);
  try {
    PieceCoverage coverage;
    std::map<size_t, std::map<std::pair<int64_t, std::string>, int64_t>> next_begin;  // by optimizer
    std::vector<std::vector<std::string>> names;  // each optimizer's parameters', from rank 0 on
    TorchCheckpointIO io;
    // One process at a time: its shard is read, its entries added and its file written.
    for (int64_t rank = 0; rank < (index ? index->world_size : 1); ++rank) {
      std::optional<Shard> shard;
      if (index) shard = load_shard(io, path, *index, rank);
      if (rank == 0) {
        for (const auto& item : top.at("state_dict").toGenericDict()) {
          const at::Tensor value = item.value().toTensor();
          layout.add_tensor("model." + item.key().toStringRef(), path_of({"model", item.key()}), 0, value,
                            std::vector<int64_t>(static_cast<size_t>(value.dim()), 0), value.sizes().vec());
        }
      }
      for (const std::string& name : shard ? sharded : std::vector<std::string>{}) {
        const auto found = shard->parameters.find(name);
        if (found == shard->parameters.end()) continue;  // PieceCoverage::check names the gap
        const ParameterPiece& piece = found->second;
        coverage.add(name, piece.begin, piece.end, c10::multiply_integers(piece.shape));
        if (piece.end > piece.begin)
          add_piece(layout, "model." + name, path_of({"model", name}), rank, piece.values, piece.shape, piece.begin,
                    piece.end);
      }
      // This process's optimizer states: its shard's, or (one process) the file's own whole ones.
      std::vector<c10::IValue> states;
      if (index && index->optimizer_states) {
        states = shard->optimizer_states;
      } else if (!index && top.contains("optimizer_states")) {
        states = top.at("optimizer_states").toListRef().vec();
      }
      if (!weights_only && !states.empty()) {
        if (rank == 0) {
          names = optimizer_parameter_names(top, states.size(), path);
          int64_t next_group = 0;
          for (size_t k = 0; k < states.size(); ++k) add_param_groups(layout, states[k], names[k], next_group, path);
        } else if (states.size() != names.size()) {
          throw CheckpointError(
              fmt::format("{}: rank {}'s shard holds {} optimizer states, rank 0's {}. HINT: the set "
                          "is mixed up; export another checkpoint.",
                          path, rank, states.size(), names.size()));
        }
        for (size_t k = 0; k < states.size(); ++k)
          add_state(layout, rank, states[k], names[k], coverage, next_begin[k], path);
      }
      layout.flush(rank);
    }
    coverage.check(path, sharded);
    return layout.finish();
  } catch (...) {
    layout.remove_written();
    throw;
  }
}

}  // namespace volt
