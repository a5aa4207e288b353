#include "volt/checkpoint/dcp_checkpoint.h"

#include <ATen/ATen.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>

#include "volt/checkpoint/checkpoint_io.h"
#include "volt/checkpoint/plain_unpickler.h"
#include "volt/core/error.h"

namespace volt {

namespace fs = std::filesystem;

namespace {

using GenericDict = c10::impl::GenericDict;

at::ScalarType dcp_dtype(const std::string& name, const std::string& what) {
  for (const auto& [known, dtype] : dcp_dtype_names()) {
    if (known == name) return dtype;
  }
  throw CheckpointError(fmt::format("{} has a tensor of dtype torch.{}, which Volt does not read", what, name));
}

[[noreturn]] void dcp_malformed(const std::string& what, const std::string& detail) {
  throw CheckpointError(
      fmt::format("{} is not a distributed checkpoint's metadata Volt understands ({}). HINT: it should come from "
                  "torch.distributed.checkpoint's dcp.save with the default FileSystemWriter (PyTorch 2.x).",
                  what, detail));
}

const c10::IValue& dcp_field(const GenericDict& record, const std::string& name, const std::string& what) {
  const auto it = record.find(name);
  if (it == record.end()) {
    dcp_malformed(what,
                  fmt::format("a {} without `{}`",
                              record.contains("__class__") ? record.at("__class__").toStringRef() : "record", name));
  }
  return it->value();
}

GenericDict dcp_record(const c10::IValue& value, const std::string& cls, const std::string& what) {
  if (!value.isGenericDict() || !value.toGenericDict().contains("__class__") ||
      value.toGenericDict().at("__class__").toStringRef() != cls) {
    dcp_malformed(what, fmt::format("expected a {}", cls));
  }
  return value.toGenericDict();
}

std::vector<int64_t> dcp_ints(const c10::IValue& value, const std::string& what) {
  std::vector<int64_t> out;
  if (value.isTuple()) {
    for (const c10::IValue& v : value.toTupleRef().elements()) {
      if (!v.isInt()) dcp_malformed(what, "a size that is not integers");
      out.push_back(v.toInt());
    }
  } else if (value.isList()) {
    for (const c10::IValue& v : value.toListRef()) {
      if (!v.isInt()) dcp_malformed(what, "a size that is not integers");
      out.push_back(v.toInt());
    }
  } else {
    dcp_malformed(what, "a size that is not a torch.Size");
  }
  return out;
}

std::string dcp_key(const std::string& name, const std::vector<int64_t>& offsets, bool tensor) {
  std::string key = name + "@";
  if (!tensor) return key;
  for (size_t i = 0; i < offsets.size(); ++i) key += (i == 0 ? "" : ",") + std::to_string(offsets[i]);
  return key;
}

DcpChunk dcp_storage(const GenericDict& storage_data, const std::string& key, const std::string& what) {
  const auto it = storage_data.find(key);
  if (it == storage_data.end()) dcp_malformed(what, fmt::format("no storage entry for {}", key));
  const GenericDict info = dcp_record(it->value(), "_StorageInfo", what);
  if (info.contains("transform_descriptors") && !info.at("transform_descriptors").isNone() &&
      !(info.at("transform_descriptors").isList() && info.at("transform_descriptors").toListRef().empty())) {
    throw CheckpointError(fmt::format(
        "{} stores {} through storage transforms (compression or other extensions), which Volt does not read. "
        "HINT: save the checkpoint with dcp.save's default FileSystemWriter, without extensions.",
        what, key));
  }
  DcpChunk chunk;
  chunk.file = dcp_field(info, "relative_path", what).toStringRef();
  chunk.offset = dcp_field(info, "offset", what).toInt();
  chunk.length = dcp_field(info, "length", what).toInt();
  return chunk;
}

std::vector<char> dcp_read_bytes(const std::string& dir, const DcpChunk& chunk, const std::string& name) {
  const fs::path path = fs::path(dir) / chunk.file;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw CheckpointError(
        fmt::format("{} is missing: the distributed checkpoint {} keeps {} there. HINT: copy the "
                    "whole folder, every .distcp file with its .metadata.",
                    path.string(), dir, name));
  }
  std::vector<char> bytes(static_cast<size_t>(chunk.length));
  in.seekg(chunk.offset);
  in.read(bytes.data(), chunk.length);
  if (in.gcount() != chunk.length) {
    throw CheckpointError(
        fmt::format("{} is cut short: {} needs bytes [{}, {}), the file has fewer. HINT: copy it "
                    "again from where the checkpoint was saved.",
                    path.string(), name, chunk.offset, chunk.offset + chunk.length));
  }
  return bytes;
}

constexpr const char* kDcpOptimizerHint =
    "HINT: save the optimizer as PyTorch's distributed helpers lay it out: dcp.save({\"model\": "
    "get_model_state_dict(model), \"optim\": get_optimizer_state_dict(model, optimizer)}) "
    "(torch.distributed.checkpoint.state_dict), or fine-tune from the weights alone (volt::DcpWeights).";

[[noreturn]] void dcp_optimizer_error(const std::string& what, const std::string& detail) {
  throw CheckpointError(fmt::format("{}: {}. {}", what, detail, kDcpOptimizerHint));
}

GenericDict dcp_string_dict() { return GenericDict(c10::StringType::get(), c10::AnyType::get()); }

bool dcp_is_index(const std::string& text) {
  return !text.empty() && text.size() < 10 &&
         std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

/// The number of steps a parameter's optimizer state records (PyTorch's `step`: a 0-d tensor, or
/// a number); 0 without one.
int64_t dcp_step_of(const c10::IValue& state) {
  if (!state.isGenericDict() || !state.toGenericDict().contains("step")) return 0;
  const c10::IValue step = state.toGenericDict().at("step");
  if (step.isTensor() && step.toTensor().numel() == 1) return static_cast<int64_t>(step.toTensor().item<double>());
  if (step.isInt()) return step.toInt();
  if (step.isDouble()) return static_cast<int64_t>(step.toDouble());
  return 0;
}

}  // namespace

const std::vector<std::pair<std::string, at::ScalarType>>& dcp_dtype_names() {
  static const auto* names = new std::vector<std::pair<std::string, at::ScalarType>>{{"float32", at::kFloat},
                                                                                     {"float64", at::kDouble},
                                                                                     {"float16", at::kHalf},
                                                                                     {"bfloat16", at::kBFloat16},
                                                                                     {"int64", at::kLong},
                                                                                     {"int32", at::kInt},
                                                                                     {"int16", at::kShort},
                                                                                     {"int8", at::kChar},
                                                                                     {"uint8", at::kByte},
                                                                                     {"bool", at::kBool},
                                                                                     {"complex64", at::kComplexFloat},
                                                                                     {"complex128", at::kComplexDouble},
                                                                                     {"float", at::kFloat},
                                                                                     {"double", at::kDouble},
                                                                                     {"half", at::kHalf},
                                                                                     {"long", at::kLong},
                                                                                     {"int", at::kInt},
                                                                                     {"short", at::kShort}};
  return *names;
}

bool is_dcp_checkpoint(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(fs::path(path) / ".metadata", ec);
}

c10::IValue internal::dcp_unflatten_optimizer_state(const std::map<std::string, c10::IValue>& items,
                                                    const std::string& what) {
  // PyTorch's flattening joins the path with dots; a parameter's name has dots of its own, but a
  // state field and a group's field do not.
  std::map<int64_t, GenericDict> groups;
  std::map<std::string, std::map<std::string, c10::IValue>> states;
  for (const auto& [key, value] : items) {
    const std::string groups_prefix = "param_groups.";
    const std::string state_prefix = "state.";
    if (key.rfind(groups_prefix, 0) == 0) {
      const std::string rest = key.substr(groups_prefix.size());
      const size_t dot = rest.find('.');
      if (dot == std::string::npos || !dcp_is_index(rest.substr(0, dot))) {
        dcp_optimizer_error(what, fmt::format("its entry param_groups.{} is not param_groups.<index>.<field>", rest));
      }
      auto [it, added] = groups.try_emplace(std::stoll(rest.substr(0, dot)), dcp_string_dict());
      it->second.insert(rest.substr(dot + 1), value);
    } else if (key.rfind(state_prefix, 0) == 0) {
      const std::string rest = key.substr(state_prefix.size());
      const size_t dot = rest.rfind('.');
      if (dot == std::string::npos || dot == 0) {
        dcp_optimizer_error(what, fmt::format("its entry state.{} is not state.<parameter>.<field>", rest));
      }
      states[rest.substr(0, dot)][rest.substr(dot + 1)] = value;
    } else {
      dcp_optimizer_error(what, fmt::format("its optimizer entry '{}' is neither state.* nor param_groups.*", key));
    }
  }
  if (groups.empty()) {
    dcp_optimizer_error(what, states.empty() ? std::string("it holds no optimizer state")
                                             : fmt::format("it holds the optimizer state of {} parameter(s) ({}, ...) "
                                                           "but no param_groups, which say how they are numbered",
                                                           states.size(), states.begin()->first));
  }
  if (groups.rbegin()->first != static_cast<int64_t>(groups.size()) - 1) {
    std::vector<int64_t> held;
    for (const auto& [index, group] : groups) held.push_back(index);
    dcp_optimizer_error(what, fmt::format("its param_groups are numbered [{}]; expected 0 to {}", fmt::join(held, ", "),
                                          groups.size() - 1));
  }

  // Parameters are numbered across the groups in the order of their "params" lists, as PyTorch's
  // optimizer.state_dict() numbers them. get_optimizer_state_dict lists names; a plain
  // optimizer.state_dict() saved as it is lists the numbers themselves.
  std::map<std::string, int64_t> ids;
  c10::impl::GenericList param_groups(c10::AnyType::get());
  int64_t next = 0;
  for (auto& [index, group] : groups) {
    if (!group.contains("params") || !group.at("params").isList()) {
      dcp_optimizer_error(what, fmt::format("param_groups.{} has {} 'params' list of its parameters", index,
                                            group.contains("params") ? "a non-list as its" : "no"));
    }
    c10::List<int64_t> numbers;
    for (const c10::IValue& param : group.at("params").toListRef()) {
      if (!param.isString() && !param.isInt()) {
        dcp_optimizer_error(
            what, fmt::format("param_groups.{}.params holds a {}; expected parameter names", index, param.tagKind()));
      }
      const std::string name = param.isString() ? param.toStringRef() : std::to_string(param.toInt());
      if (!ids.emplace(name, next).second) {
        dcp_optimizer_error(what, fmt::format("parameter {} is listed in more than one param group", name));
      }
      numbers.push_back(next++);
    }
    group.insert_or_assign("params", numbers);
    param_groups.push_back(group);
  }
  GenericDict state(c10::IntType::get(), c10::AnyType::get());
  for (const auto& [name, fields] : states) {
    const auto id = ids.find(name);
    if (id == ids.end()) {
      std::vector<std::string> listed;
      for (const auto& [param, number] : ids) listed.push_back(param);
      dcp_optimizer_error(what, fmt::format("it holds optimizer state of parameter {}, which no param group lists "
                                            "(they list [{}])",
                                            name, fmt::join(listed, ", ")));
    }
    GenericDict param_state = dcp_string_dict();
    for (const auto& [field, value] : fields) param_state.insert(field, value);
    state.insert(id->second, param_state);
  }
  GenericDict result = dcp_string_dict();
  result.insert("state", state);
  result.insert("param_groups", param_groups);
  return result;
}

c10::IValue dcp_optimizer_state_dict(const DcpCheckpoint& checkpoint, const std::string& prefix) {
  std::map<std::string, c10::IValue> items;
  for (const std::string& name : checkpoint.tensor_names())
    if (name.rfind(prefix, 0) == 0) items.emplace(name.substr(prefix.size()), checkpoint.read(name));
  for (const std::string& name : checkpoint.value_names())
    if (name.rfind(prefix, 0) == 0) items.emplace(name.substr(prefix.size()), checkpoint.read_value(name));
  const std::string what = fmt::format("the distributed checkpoint {} (its entries {}*)", checkpoint.dir(), prefix);
  return internal::dcp_unflatten_optimizer_state(items, what);
}

c10::IValue dcp_training_checkpoint(const DcpCheckpoint& checkpoint) {
  const std::string model_prefix = "model.";
  const std::string optim_prefix = "optim.";
  GenericDict state_dict = dcp_string_dict();
  bool has_optimizer = false;
  for (const std::string& name : checkpoint.tensor_names()) {
    if (name.rfind(model_prefix, 0) == 0) state_dict.insert(name.substr(model_prefix.size()), checkpoint.read(name));
    has_optimizer = has_optimizer || name.rfind(optim_prefix, 0) == 0;
  }
  for (const std::string& name : checkpoint.value_names())
    has_optimizer = has_optimizer || name.rfind(optim_prefix, 0) == 0;
  if (state_dict.empty()) {
    const std::vector<std::string> names = checkpoint.tensor_names();
    throw CheckpointError(fmt::format(
        "the distributed checkpoint {} holds no model weights: no tensor is named model.* ({} tensors{}). HINT: save "
        "it as dcp.save({{\"model\": model_state_dict, \"optim\": optimizer_state_dict}}) to give it as ckpt_path; "
        "a checkpoint of other names loads through volt::DcpWeights with its prefix.",
        checkpoint.dir(), names.size(), names.empty() ? "" : fmt::format(", e.g. {}", names.front())));
  }
  GenericDict top = dcp_string_dict();
  top.insert(kConvertedFromKey, fmt::format("torch.distributed.checkpoint {}", checkpoint.dir()));
  top.insert("state_dict", state_dict);
  int64_t step = 0;
  if (has_optimizer) {
    const c10::IValue optimizer = dcp_optimizer_state_dict(checkpoint, optim_prefix);
    for (const auto& entry : optimizer.toGenericDict().at("state").toGenericDict())
      step = std::max(step, dcp_step_of(entry.value()));
    c10::impl::GenericList optimizer_states(c10::AnyType::get());
    optimizer_states.push_back(optimizer);
    top.insert("optimizer_states", optimizer_states);
  }
  top.insert("epoch", int64_t{0});
  top.insert("global_step", step);
  return top;
}

DcpCheckpoint DcpCheckpoint::open(const std::string& dir) {
  const fs::path metadata_path = fs::path(dir) / ".metadata";
  const std::string what = metadata_path.string();
  std::ifstream in(metadata_path, std::ios::binary);
  if (!in) {
    std::string hint = "give the folder dcp.save wrote (checkpoint_id)";
    std::error_code ec;
    for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
      if (it->path().extension() == ".safetensors") {
        hint =
            "this folder holds .safetensors files: read them with volt::load_safetensors (or `volt checkpoint` "
            "tools), not as a .metadata/.distcp checkpoint";
        break;
      }
    }
    throw CheckpointError(
        fmt::format("{} has no .metadata: it is not a distributed checkpoint of torch.distributed.checkpoint's "
                    "default writer. HINT: {}.",
                    dir, hint));
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const c10::IValue metadata_value = internal::unpickle_dcp_metadata(text.data(), text.size(), what);
  const GenericDict metadata = dcp_record(metadata_value, "Metadata", what);
  const c10::IValue& state = dcp_field(metadata, "state_dict_metadata", what);
  const c10::IValue& storage = dcp_field(metadata, "storage_data", what);
  if (!state.isGenericDict() || !storage.isGenericDict())
    dcp_malformed(what, "its state_dict_metadata or storage_data is not a dict");
  const GenericDict storage_data = storage.toGenericDict();

  DcpCheckpoint checkpoint;
  checkpoint.dir_ = dir;
  for (const auto& entry : state.toGenericDict()) {
    const std::string name = entry.key().toStringRef();
    if (!entry.value().isGenericDict() || !entry.value().toGenericDict().contains("__class__"))
      dcp_malformed(what, fmt::format("{} has no storage metadata", name));
    const GenericDict item = entry.value().toGenericDict();
    const std::string cls = item.at("__class__").toStringRef();
    if (cls == "BytesStorageMetadata") {
      checkpoint.values_[name] = dcp_storage(storage_data, dcp_key(name, {}, false), what);
      continue;
    }
    if (cls != "TensorStorageMetadata") dcp_malformed(what, fmt::format("{} is a {}", name, cls));
    DcpTensor tensor;
    tensor.size = dcp_ints(dcp_field(item, "size", what), what);
    const GenericDict properties = dcp_record(dcp_field(item, "properties", what), "TensorProperties", what);
    c10::IValue dtype;
    if (properties.contains("__state__") && properties.at("__state__").isTuple() &&
        !properties.at("__state__").toTupleRef().elements().empty()) {
      dtype = properties.at("__state__").toTupleRef().elements()[0];
    } else if (properties.contains("dtype")) {
      dtype = properties.at("dtype");
    }
    if (!dtype.isString()) dcp_malformed(what, fmt::format("{} has no dtype", name));
    tensor.dtype = dcp_dtype(dtype.toStringRef(), what);
    const c10::IValue& chunks = dcp_field(item, "chunks", what);
    if (!chunks.isList()) dcp_malformed(what, fmt::format("{}'s chunks are not a list", name));
    int64_t covered = 0;
    for (const c10::IValue& chunk_value : chunks.toListRef()) {
      const GenericDict chunk_record = dcp_record(chunk_value, "ChunkStorageMetadata", what);
      DcpChunk chunk = dcp_storage(storage_data,
                                   dcp_key(name, dcp_ints(dcp_field(chunk_record, "offsets", what), what), true), what);
      chunk.offsets = dcp_ints(dcp_field(chunk_record, "offsets", what), what);
      chunk.sizes = dcp_ints(dcp_field(chunk_record, "sizes", what), what);
      if (chunk.offsets.size() != tensor.size.size() || chunk.sizes.size() != tensor.size.size())
        dcp_malformed(what, fmt::format("a piece of {} has another number of dimensions than the tensor", name));
      int64_t numel = 1;
      for (size_t d = 0; d < tensor.size.size(); ++d) {
        if (chunk.offsets[d] < 0 || chunk.sizes[d] < 0 || chunk.offsets[d] + chunk.sizes[d] > tensor.size[d])
          dcp_malformed(what, fmt::format("a piece of {} lies outside its size", name));
        numel *= chunk.sizes[d];
      }
      covered += numel;
      tensor.chunks.push_back(std::move(chunk));
    }
    int64_t numel = 1;
    for (const int64_t s : tensor.size) numel *= s;
    // DCP's pieces never overlap; elements that no piece covers would keep whatever the target held.
    if (covered != numel) {
      throw CheckpointError(fmt::format(
          "{}: the pieces of {} hold {} of its {} elements; loading it would leave the rest undefined. HINT: the "
          "checkpoint is incomplete; save it again from every process.",
          what, name, covered, numel));
    }
    checkpoint.tensors_[name] = std::move(tensor);
  }
  return checkpoint;
}

std::vector<std::string> DcpCheckpoint::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, tensor] : tensors_) names.push_back(name);
  return names;
}

std::vector<std::string> DcpCheckpoint::value_names() const {
  std::vector<std::string> names;
  for (const auto& [name, chunk] : values_) names.push_back(name);
  return names;
}

const DcpTensor& DcpCheckpoint::tensor(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it != tensors_.end()) return it->second;
  std::string some;
  size_t shown = 0;
  for (const auto& [held, tensor] : tensors_) {
    if (shown++ == 5) break;
    some += (some.empty() ? "" : ", ") + held;
  }
  throw CheckpointError(
      fmt::format("the distributed checkpoint {} has no tensor {} ({} tensors, e.g. {}). HINT: its "
                  "names are dcp.save's flattened keys; check the prefix (\"model.\" for "
                  "dcp.save({{\"model\": model.state_dict()}})).",
                  dir_, name, tensors_.size(), some));
}

at::Tensor DcpCheckpoint::read(const std::string& name) const {
  const DcpTensor& info = tensor(name);
  at::Tensor whole = at::empty(info.size, at::TensorOptions().dtype(info.dtype));
  for (const DcpChunk& chunk : info.chunks) {
    const std::vector<char> bytes = dcp_read_bytes(dir_, chunk, name);
    const c10::IValue loaded =
        load_from_bytes(bytes, fmt::format("{} (a piece of {})", (fs::path(dir_) / chunk.file).string(), name));
    if (!loaded.isTensor() || loaded.toTensor().sizes().vec() != chunk.sizes ||
        loaded.toTensor().scalar_type() != info.dtype) {
      throw CheckpointError(fmt::format(
          "{}: the piece of {} at {} is not a {} tensor of its box's shape. HINT: the "
          "checkpoint's files do not belong to its .metadata; copy the folder again.",
          (fs::path(dir_) / chunk.file).string(), name, dcp_key(name, chunk.offsets, true), c10::toString(info.dtype)));
    }
    at::Tensor box = whole;
    for (size_t d = 0; d < chunk.offsets.size(); ++d)
      box = box.narrow(static_cast<int64_t>(d), chunk.offsets[d], chunk.sizes[d]);
    box.copy_(loaded.toTensor());
  }
  return whole;
}

c10::IValue DcpCheckpoint::read_value(const std::string& name) const {
  const auto it = values_.find(name);
  if (it == values_.end()) {
    throw CheckpointError(fmt::format("the distributed checkpoint {} has no value {}", dir_, name));
  }
  return load_from_bytes(dcp_read_bytes(dir_, it->second, name),
                         fmt::format("{} ({})", (fs::path(dir_) / it->second.file).string(), name));
}

DcpWeights::DcpWeights(DcpCheckpoint checkpoint, std::string prefix)
    : checkpoint_(std::move(checkpoint)), prefix_(std::move(prefix)) {}

std::string DcpWeights::describe() const { return "the distributed checkpoint " + checkpoint_.dir(); }

at::Tensor DcpWeights::read(const std::string& name, const std::vector<int64_t>& shape, int64_t begin, int64_t end) {
  const std::string key = prefix_ + name;
  if (key != cached_name_) {
    const DcpTensor& info = checkpoint_.tensor(key);
    if (info.size != shape) {
      throw CheckpointError(
          fmt::format("{}: {} has shape [{}], but the model's parameter {} has shape [{}]. HINT: build "
                      "the model with the configuration the checkpoint was trained with.",
                      describe(), key, fmt::join(info.size, ", "), name, fmt::join(shape, ", ")));
    }
    cached_ = checkpoint_.read(key).reshape({-1});
    cached_name_ = key;
  }
  return cached_.slice(0, begin, end);
}

}  // namespace volt
