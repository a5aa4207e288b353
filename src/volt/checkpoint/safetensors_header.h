// The header of a safetensors file (Hugging Face's weights format), parsed and checked.
//
// The format: 8 bytes N (a little-endian u64), then N bytes of UTF-8 JSON, then the byte
// buffer. The JSON is an object mapping each tensor's name to {"dtype": "F32", "shape": [2, 3],
// "data_offsets": [begin, end]}, offsets relative to the start of the byte buffer, plus an
// optional "__metadata__" object of strings; the tensors' ranges cover the buffer exactly (no
// holes, no overlaps) and the header may end in spaces. Elements are little-endian, in C order.
//
// Torch-free, so that the fuzz target (fuzz/safetensors_fuzz.cpp) builds in seconds with clang's
// sanitizers and exercises the very code SafetensorsFile::open runs on every file.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace volt {

/// The element types of the safetensors format, in the reference implementation's order (by
/// alignment), which its writer sorts tensors by.
enum class SafetensorsDtype {
  kBool,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64
};

/// The name a header gives `dtype`: "BOOL", "U8", "F8_E5M2", "BF16", "F32", ...
const char* to_string(SafetensorsDtype dtype);

/// How many bytes one element of `dtype` takes.
int64_t element_size(SafetensorsDtype dtype);

/// The dtype a header names `name` (case-sensitive, as in the format), or nullopt for a name the
/// format does not have.
std::optional<SafetensorsDtype> parse_safetensors_dtype(std::string_view name);

/// The most bytes a header may take, as in the reference implementation: a larger N means a
/// file that is not safetensors, or whose first bytes are corrupt.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

/// One tensor's entry in a safetensors header, checked against the file.
struct SafetensorsEntry {
  /// The tensor's name (the header's key).
  std::string name;
  /// Its element type.
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  /// Its sizes; empty for a 0-d tensor.
  std::vector<int64_t> shape;
  /// Its bytes are [begin, end) of the file, counted from the file's first byte (the header's
  /// data_offsets plus 8 + N).
  uint64_t begin = 0;
  uint64_t end = 0;
};

/// What a safetensors file's header says, once every rule of the format has been checked.
struct SafetensorsHeader {
  /// The tensors, in the order of their bytes in the file.
  std::vector<SafetensorsEntry> entries;
  /// The header's "__metadata__" (strings to strings); empty when it has none.
  std::map<std::string, std::string> metadata;
  /// Where the byte buffer starts in the file: 8 + N.
  uint64_t data_start = 0;
};

/// Parses and checks the header of the safetensors file whose bytes are `file` (all of it: the
/// tensors must cover the byte buffer up to the file's end). `what` names the file in errors.
///
/// Throws volt::CheckpointError, naming `what`, what was found and what was expected, with a
/// HINT: a file shorter than 8 bytes; N beyond the file or beyond kMaxSafetensorsHeaderBytes; a
/// header that is not JSON, not an object, or has a name twice; an entry that is not an object or
/// lacks dtype, shape or data_offsets; an unknown dtype; a shape whose byte size disagrees with
/// its offsets (or overflows); offsets outside the buffer, holes or overlaps; "__metadata__" that
/// is not an object of strings.
SafetensorsHeader parse_safetensors_header(std::string_view file, const std::string& what);

}  // namespace volt
