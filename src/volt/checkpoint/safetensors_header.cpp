#include "volt/checkpoint/safetensors_header.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "volt/core/error.h"

namespace volt {
namespace {

using Json = nlohmann::json;

// Every dtype of the format with its name and element size, in the enum's order.
struct DtypeInfo {
  SafetensorsDtype dtype;
  const char* name;
  int64_t size;
};
constexpr DtypeInfo kDtypes[] = {{SafetensorsDtype::kBool, "BOOL", 1},      {SafetensorsDtype::kU8, "U8", 1},
                                 {SafetensorsDtype::kI8, "I8", 1},          {SafetensorsDtype::kF8E5M2, "F8_E5M2", 1},
                                 {SafetensorsDtype::kF8E4M3, "F8_E4M3", 1}, {SafetensorsDtype::kI16, "I16", 2},
                                 {SafetensorsDtype::kU16, "U16", 2},        {SafetensorsDtype::kF16, "F16", 2},
                                 {SafetensorsDtype::kBF16, "BF16", 2},      {SafetensorsDtype::kI32, "I32", 4},
                                 {SafetensorsDtype::kU32, "U32", 4},        {SafetensorsDtype::kF32, "F32", 4},
                                 {SafetensorsDtype::kF64, "F64", 8},        {SafetensorsDtype::kI64, "I64", 8},
                                 {SafetensorsDtype::kU64, "U64", 8}};

// The table is indexed by the enum, so its rows must follow the enum's order (checked here); a new
// dtype needs a row.
constexpr bool in_enum_order() {
  for (size_t i = 0; i < std::size(kDtypes); ++i) {
    if (static_cast<size_t>(kDtypes[i].dtype) != i) return false;
  }
  return std::size(kDtypes) == static_cast<size_t>(SafetensorsDtype::kU64) + 1;
}
static_assert(in_enum_order(), "kDtypes must list every SafetensorsDtype, in the enum's order");

constexpr const char* kCorruptHint =
    "HINT: the file is truncated, corrupt or not a safetensors file; write it again (Python: "
    "safetensors.torch.save_file) or download it again.";

// The first line of a nlohmann error, without its "[json.exception.parse_error.101] " tag, cut
// short: it quotes what it last read, which may be a long run of the file's bytes.
std::string json_error_text(const Json::exception& error) {
  std::string text = error.what();
  const size_t tag_end = text.find("] ");
  if (text.rfind("[json.exception", 0) == 0 && tag_end != std::string::npos) text.erase(0, tag_end + 2);
  constexpr size_t kMaxLength = 200;
  if (text.size() > kMaxLength) text = text.substr(0, kMaxLength) + "...";
  return text;
}

// `value` as JSON text for a message, cut short.
std::string shown(const Json& value) {
  std::string text = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  constexpr size_t kMaxLength = 80;
  if (text.size() > kMaxLength) text = text.substr(0, kMaxLength) + "...";
  return text;
}

std::string all_dtype_names() {
  std::vector<std::string> names;
  for (const DtypeInfo& info : kDtypes) names.emplace_back(info.name);
  return fmt::format("{}", fmt::join(names, ", "));
}

// A non-negative JSON integer that fits `limit`, or nullopt.
std::optional<uint64_t> as_count(const Json& value, uint64_t limit) {
  if (!value.is_number_unsigned()) return std::nullopt;
  const auto number = value.get<uint64_t>();
  if (number > limit) return std::nullopt;
  return number;
}

// Parses the JSON text of a header, refusing a tensor name given twice (a JSON object would
// silently keep the last one).
Json parse_json(std::string_view text, const std::string& what) {
  std::set<std::string> top_level_keys;
  std::string duplicate;
  const Json::parser_callback_t check_keys = [&](int depth, Json::parse_event_t event, Json& parsed) {
    // Depth 1 holds the keys of the top-level object: the tensor names and "__metadata__".
    if (event == Json::parse_event_t::key && depth == 1 && !top_level_keys.insert(parsed.get<std::string>()).second &&
        duplicate.empty()) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  Json header;
  try {
    header = Json::parse(text.begin(), text.end(), check_keys);
  } catch (const Json::exception& error) {
    throw CheckpointError(
        fmt::format("{}'s header is not valid JSON ({}); expected a JSON object of tensor entries. {}", what,
                    json_error_text(error), kCorruptHint));
  }
  if (!duplicate.empty()) {
    throw CheckpointError(
        fmt::format("{}'s header names '{}' twice; expected every name once. {}", what, duplicate, kCorruptHint));
  }
  return header;
}

std::map<std::string, std::string> parse_metadata(const Json& value, const std::string& what) {
  std::map<std::string, std::string> metadata;
  if (value.is_null()) return metadata;
  if (!value.is_object()) {
    throw CheckpointError(
        fmt::format("{}'s \"__metadata__\" is {}, expected an object of strings (e.g. {{\"format\": \"pt\"}}). {}",
                    what, shown(value), kCorruptHint));
  }
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) {
      throw CheckpointError(fmt::format(
          "{}'s \"__metadata__\" maps '{}' to {}, expected a string (safetensors metadata is strings only). {}", what,
          key, shown(item), kCorruptHint));
    }
    metadata.emplace(key, item.get<std::string>());
  }
  return metadata;
}

const Json& field(const Json& entry, const char* name, const std::string& tensor, const std::string& what) {
  const auto it = entry.find(name);
  if (it != entry.end()) return *it;
  std::vector<std::string> present;
  for (const auto& [key, unused] : entry.items()) present.push_back(key);
  throw CheckpointError(fmt::format(
      "{}: the header's entry for tensor '{}' lacks \"{}\" (it has [{}]); expected \"dtype\", \"shape\" and "
      "\"data_offsets\". {}",
      what, tensor, name, fmt::join(present, ", "), kCorruptHint));
}

// One tensor's entry, with its offsets relative to the byte buffer (checked against it later).
SafetensorsEntry parse_entry(const std::string& name, const Json& entry, const std::string& what) {
  if (!entry.is_object()) {
    throw CheckpointError(fmt::format(
        "{}: the header's entry for tensor '{}' is {}, expected an object {{\"dtype\", \"shape\", \"data_offsets\"}}. "
        "{}",
        what, name, shown(entry), kCorruptHint));
  }
  SafetensorsEntry result;
  result.name = name;

  const Json& dtype = field(entry, "dtype", name, what);
  const std::optional<SafetensorsDtype> parsed =
      dtype.is_string() ? parse_safetensors_dtype(dtype.get<std::string>()) : std::nullopt;
  if (!parsed) {
    throw CheckpointError(
        fmt::format("{}: tensor '{}' has dtype {}, which the safetensors format does not have; expected one of {}. "
                    "HINT: a newer safetensors may have written a type Volt does not know; convert the tensor to "
                    "one of these in Python (tensor.to(torch.float32)) and save the file again.",
                    what, name, shown(dtype), all_dtype_names()));
  }
  result.dtype = *parsed;

  const Json& shape = field(entry, "shape", name, what);
  const auto bad_shape = [&] {
    return CheckpointError(fmt::format(
        "{}: tensor '{}' has shape {}, expected a list of non-negative integers (e.g. [2, 3]; [] for a 0-d tensor). {}",
        what, name, shown(shape), kCorruptHint));
  };
  if (!shape.is_array()) throw bad_shape();
  for (const Json& size : shape) {
    const std::optional<uint64_t> count = as_count(size, std::numeric_limits<int64_t>::max());
    if (!count) throw bad_shape();
    result.shape.push_back(static_cast<int64_t>(*count));
  }

  const Json& offsets = field(entry, "data_offsets", name, what);
  const std::optional<uint64_t> begin =
      offsets.is_array() && offsets.size() == 2 ? as_count(offsets[0], UINT64_MAX) : std::nullopt;
  const std::optional<uint64_t> end =
      offsets.is_array() && offsets.size() == 2 ? as_count(offsets[1], UINT64_MAX) : std::nullopt;
  if (!begin || !end || *begin > *end) {
    throw CheckpointError(fmt::format(
        "{}: tensor '{}' has data_offsets {}, expected [begin, end] with 0 <= begin <= end (bytes of the byte "
        "buffer). {}",
        what, name, shown(offsets), kCorruptHint));
  }
  result.begin = *begin;
  result.end = *end;

  uint64_t bytes = static_cast<uint64_t>(element_size(result.dtype));
  for (const int64_t size : result.shape) {
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(size), &bytes)) {
      throw CheckpointError(fmt::format("{}: tensor '{}' has shape [{}] of {}, whose byte size overflows 64 bits. {}",
                                        what, name, fmt::join(result.shape, ", "), to_string(result.dtype),
                                        kCorruptHint));
    }
  }
  if (bytes != *end - *begin) {
    throw CheckpointError(fmt::format(
        "{}: tensor '{}' ({} of shape [{}]) takes {} bytes, but its data_offsets [{}, {}] span {}; expected them to "
        "agree. {}",
        what, name, to_string(result.dtype), fmt::join(result.shape, ", "), bytes, *begin, *end, *end - *begin,
        kCorruptHint));
  }
  return result;
}

// The tensors, sorted by their bytes, must cover the byte buffer [0, buffer) exactly.
void check_coverage(const std::vector<SafetensorsEntry>& entries, uint64_t buffer, const std::string& what) {
  uint64_t covered = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& entry : entries) {
    if (entry.end > buffer) {
      throw CheckpointError(
          fmt::format("{}: tensor '{}' has data_offsets [{}, {}], beyond the byte buffer's {} bytes; expected every "
                      "tensor inside it. {}",
                      what, entry.name, entry.begin, entry.end, buffer, kCorruptHint));
    }
    if (entry.begin > covered) {
      throw CheckpointError(
          fmt::format("{}: bytes [{}, {}) of the byte buffer belong to no tensor (a hole before tensor '{}'); "
                      "expected the tensors to cover the buffer without holes. {}",
                      what, covered, entry.begin, entry.name, kCorruptHint));
    }
    if (entry.begin < covered) {
      throw CheckpointError(fmt::format(
          "{}: tensor '{}' at data_offsets [{}, {}] overlaps tensor '{}' at [{}, {}]; expected tensors not to "
          "overlap. {}",
          what, entry.name, entry.begin, entry.end, previous->name, previous->begin, previous->end, kCorruptHint));
    }
    covered = entry.end;
    previous = &entry;
  }
  if (covered != buffer) {
    throw CheckpointError(fmt::format(
        "{}: the byte buffer holds {} bytes, but its tensors cover only the first {}; expected them to cover it "
        "to the file's end. {}",
        what, buffer, covered, kCorruptHint));
  }
}

}  // namespace

const char* to_string(SafetensorsDtype dtype) { return kDtypes[static_cast<size_t>(dtype)].name; }

int64_t element_size(SafetensorsDtype dtype) { return kDtypes[static_cast<size_t>(dtype)].size; }

std::optional<SafetensorsDtype> parse_safetensors_dtype(std::string_view name) {
  for (const DtypeInfo& info : kDtypes) {
    if (name == info.name) return info.dtype;
  }
  return std::nullopt;
}

SafetensorsHeader parse_safetensors_header(std::string_view file, const std::string& what) {
  const uint64_t size = file.size();
  if (size < 8) {
    throw CheckpointError(
        fmt::format("{} is {} bytes long, shorter than the 8-byte header length every safetensors file starts with. {}",
                    what, size, kCorruptHint));
  }
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<unsigned char>(file[static_cast<size_t>(i)]);
  if (length > kMaxSafetensorsHeaderBytes) {
    throw CheckpointError(fmt::format(
        "{} declares a header of {} bytes, more than the {} a safetensors header may take. {}{}", what, length,
        kMaxSafetensorsHeaderBytes, kCorruptHint,
        file.substr(0, 2) == "PK" ? " It starts with 'PK', as a torch.save zip archive does: read those with "
                                    "volt::load_checkpoint_file."
                                  : ""));
  }
  if (length > size - 8) {
    throw CheckpointError(
        fmt::format("{} declares a header of {} bytes, but only {} bytes follow its 8-byte length; expected the "
                    "whole header in the file. {}",
                    what, length, size - 8, kCorruptHint));
  }
  const std::string_view text = file.substr(8, length);
  if (text.empty() || text.front() != '{') {
    throw CheckpointError(
        fmt::format("{}'s header {}; expected a JSON object starting with '{{'. {}", what,
                    text.empty() ? std::string("is empty (N = 0)")
                                 : fmt::format("starts with byte 0x{:02x}", static_cast<unsigned char>(text.front())),
                    kCorruptHint));
  }
  const Json header = parse_json(text, what);
  if (!header.is_object()) {
    throw CheckpointError(fmt::format("{}'s header is {}, expected a JSON object of tensor entries. {}", what,
                                      shown(header), kCorruptHint));
  }

  SafetensorsHeader result;
  result.data_start = 8 + length;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      result.metadata = parse_metadata(entry, what);
      continue;
    }
    result.entries.push_back(parse_entry(name, entry, what));
  }
  std::sort(result.entries.begin(), result.entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return std::pair(a.begin, a.end) < std::pair(b.begin, b.end);
  });
  check_coverage(result.entries, size - result.data_start, what);
  for (SafetensorsEntry& entry : result.entries) {
    entry.begin += result.data_start;
    entry.end += result.data_start;
  }
  return result;
}

}  // namespace volt
