// Safetensors files, Hugging Face's weights format, both ways: read through a memory map (the
// whole of a tensor, or only some rows of it), written atomically, and sharded into folders as
// transformers' save_pretrained writes them (model-00001-of-00003.safetensors plus
// model.safetensors.index.json).
//
// Python reads what Volt writes with safetensors.torch.load_file, and Volt reads what
// safetensors.torch.save_file or save_pretrained wrote. The format itself, and the checks every
// file passes before a tensor is read, are in safetensors_header.h. F8_E5M2, F8_E4M3, U16, U32
// and U64 tensors are listed but not read: LibTorch 1.13 has no such types.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "volt/checkpoint/safetensors_header.h"

namespace volt {

/// Named tensors in order: what save_safetensors writes and load_safetensors returns.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

/// A safetensors file's metadata ("__metadata__"): strings to strings, e.g. {"format": "pt"}.
using SafetensorsMetadata = std::map<std::string, std::string>;

/// The file a single-file Hugging Face checkpoint folder holds its weights in.
inline constexpr const char* kSafetensorsWeightsName = "model.safetensors";
/// The index of a sharded Hugging Face checkpoint folder: {"metadata": {...}, "weight_map": {name: file}}.
inline constexpr const char* kSafetensorsIndexName = "model.safetensors.index.json";

/// One tensor of a safetensors file, as its header describes it.
struct SafetensorsTensorInfo {
  /// The element type as the header names it: "F32", "BF16", "F8_E4M3", ...
  std::string dtype_name;
  /// LibTorch's element type; c10::ScalarType::Undefined for the format's types LibTorch 1.13
  /// lacks (F8_E5M2, F8_E4M3, U16, U32, U64), which tensor() and slice() refuse.
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  /// The sizes; empty for a 0-d tensor.
  std::vector<int64_t> shape;
  /// The tensor's bytes are [begin, end) of the file, counted from its first byte.
  int64_t begin = 0;
  int64_t end = 0;
};

/// A safetensors file opened for reading: its header parsed and checked, its bytes memory-mapped.
///
/// Tensors are views of the map, not copies: reading one touches only its own pages, so a
/// process that needs some tensors (or some rows, see slice) of a large file reads only those.
/// The map is private and copy-on-write: writing into a returned tensor changes this process's
/// copy, never the file. Every tensor keeps the map alive after the SafetensorsFile is gone.
/// Like every memory map, it assumes the file is not truncated in place while mapped (Volt's
/// own writers replace files by rename, which leaves an open map on the old file). Examples, compiled
/// by the test suite, are in docs/checkpoint-format.md.
class SafetensorsFile {
 public:
  /// Opens, maps and checks the file at `path`.
  ///
  /// Throws volt::CheckpointError naming `path` when it is missing, unreadable or breaks a rule of
  /// the format (see parse_safetensors_header), with a HINT.
  static SafetensorsFile open(const std::string& path);

  /// The path the file was opened from.
  const std::string& path() const { return path_; }

  /// The tensors' names, sorted (as Python's safe_open(...).keys()).
  std::vector<std::string> names() const;

  /// Whether the file holds a tensor named `name`.
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }

  /// What the header says of tensor `name`. Throws volt::CheckpointError naming the closest names
  /// when the file holds no such tensor.
  SafetensorsTensorInfo info(const std::string& name) const;

  /// The header's "__metadata__"; empty when it has none.
  const SafetensorsMetadata& metadata() const { return metadata_; }

  /// Tensor `name` on the CPU: a view of the map (copy-on-write), or a copy when its bytes are not
  /// aligned to its element size (files Volt and the reference write always are).
  ///
  /// Throws volt::CheckpointError for a missing name (naming the closest) or a dtype LibTorch lacks.
  at::Tensor tensor(const std::string& name) const;

  /// Rows [begin, end) of tensor `name`'s first dimension, a view of the map as tensor() is: only
  /// those rows' bytes are read. How a process reads just the piece of each parameter it keeps.
  ///
  /// Throws volt::CheckpointError for a 0-d tensor or when not 0 <= begin <= end <= rows.
  at::Tensor slice(const std::string& name, int64_t begin, int64_t end) const;

 private:
  struct Mapping;

  SafetensorsFile(std::string path, std::shared_ptr<const Mapping> mapping, SafetensorsHeader header);
  const SafetensorsEntry& entry(const std::string& name) const;
  at::Tensor view(const SafetensorsEntry& entry, uint64_t offset, std::vector<int64_t> shape) const;

  std::string path_;
  std::shared_ptr<const Mapping> mapping_;
  std::map<std::string, SafetensorsEntry> entries_;
  SafetensorsMetadata metadata_;
};

/// Writes `tensors` to the safetensors file `path` with `metadata`, atomically (a temporary file
/// in the same directory, fsync, rename: the file is complete or absent, never half-written).
///
/// Each tensor is written detached, from the CPU, in C order (a non-contiguous one is copied; two
/// that share memory are written twice). The layout is the reference writer's: tensors sorted by
/// element size, largest first, then by name, and the header padded with spaces so the data
/// starts 8-byte aligned, which keeps every tensor aligned for its type.
///
/// Throws volt::Error before anything is written for a name given twice, an undefined, sparse or
/// quantized tensor, or a dtype the format lacks (complex, ...); volt::CheckpointError when the
/// file cannot be written.
void save_safetensors(const std::string& path, const NamedTensors& tensors, const SafetensorsMetadata& metadata = {});

/// Where one tensor of a Hugging Face checkpoint folder lies.
struct SafetensorsLocation {
  /// The safetensors file holding it (the folder joined with the file's name).
  std::string file;
  /// What that file's header says of it.
  SafetensorsTensorInfo info;
};

/// Every tensor of the Hugging Face checkpoint folder `directory`, by name: the tensors of
/// `model.safetensors` when the folder has it (as transformers prefers it), else those that
/// `model.safetensors.index.json` maps to its shard files, each file opened and checked.
///
/// Throws volt::CheckpointError when the folder has neither, the index is malformed, names a
/// file that is missing or outside the folder, or a tensor its file does not hold.
std::map<std::string, SafetensorsLocation> read_safetensors_folder(const std::string& directory);

/// Every tensor of `path`, sorted by name: a safetensors file, or a Hugging Face checkpoint folder
/// (see read_safetensors_folder). Tensors are views of the files' maps, as SafetensorsFile::tensor.
NamedTensors load_safetensors(const std::string& path);

/// Writes `tensors` into the folder `directory` as transformers' save_pretrained does: one
/// `model.safetensors` when they fit `max_shard_bytes`, else shards
/// `model-00001-of-0000N.safetensors` of at most `max_shard_bytes` each (a larger tensor gets a
/// shard of its own; tensors fill shards in the order given) and `model.safetensors.index.json`
/// ({"metadata": {"total_size": bytes}, "weight_map": {name: file}}). Every file carries
/// `metadata`; transformers' from_pretrained wants {"format": "pt"}. Every file is written
/// atomically, the index last; weight files of an earlier save that this one did not write
/// (other shard counts, a stale index) are removed afterwards. Returns the files' names.
///
/// Throws what save_safetensors throws, and volt::Error when `max_shard_bytes` < 1.
std::vector<std::string> save_safetensors_folder(const std::string& directory, const NamedTensors& tensors,
                                                 int64_t max_shard_bytes = 5'000'000'000,
                                                 const SafetensorsMetadata& metadata = {{"format", "pt"}});

}  // namespace volt
