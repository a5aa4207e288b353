#include "volt/checkpoint/dcp_checkpoint.h"

#include <ATen/ATen.h>
#include <fmt/ranges.h>

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
  static const std::map<std::string, at::ScalarType> dtypes = {{"float32", at::kFloat},
                                                               {"float", at::kFloat},
                                                               {"float64", at::kDouble},
                                                               {"double", at::kDouble},
                                                               {"float16", at::kHalf},
                                                               {"half", at::kHalf},
                                                               {"bfloat16", at::kBFloat16},
                                                               {"int64", at::kLong},
                                                               {"long", at::kLong},
                                                               {"int32", at::kInt},
                                                               {"int", at::kInt},
                                                               {"int16", at::kShort},
                                                               {"short", at::kShort},
                                                               {"int8", at::kChar},
                                                               {"uint8", at::kByte},
                                                               {"bool", at::kBool},
                                                               {"complex64", at::kComplexFloat},
                                                               {"complex128", at::kComplexDouble}};
  const auto it = dtypes.find(name);
  if (it == dtypes.end())
    throw CheckpointError(fmt::format("{} has a tensor of dtype torch.{}, which Volt does not read", what, name));
  return it->second;
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

}  // namespace

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
