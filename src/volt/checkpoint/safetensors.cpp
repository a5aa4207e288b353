#include "volt/checkpoint/safetensors.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "volt/checkpoint/checkpoint_io.h"
#include "volt/core/edit_distance.h"
#include "volt/core/error.h"

// The format is little-endian, and tensors are read and written as they lie in memory.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors.cpp assumes a little-endian machine");

namespace volt {

// The file's bytes, mapped private and writable: a tensor viewing them may be written into (the
// page is copied for this process), which a read-only map would answer with SIGSEGV.
struct SafetensorsFile::Mapping {
  void* base = nullptr;
  size_t length = 0;

  Mapping(void* base_in, size_t length_in) : base(base_in), length(length_in) {}
  ~Mapping() {
    if (base != nullptr) ::munmap(base, length);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
};

namespace {

namespace fs = std::filesystem;

// The format's types and LibTorch's; the format's others (F8_*, U16, U32, U64) have no LibTorch
// 1.13 type.
constexpr std::pair<SafetensorsDtype, c10::ScalarType> kTorchDtypes[] = {
    {SafetensorsDtype::kF64, c10::ScalarType::Double}, {SafetensorsDtype::kF32, c10::ScalarType::Float},
    {SafetensorsDtype::kF16, c10::ScalarType::Half},   {SafetensorsDtype::kBF16, c10::ScalarType::BFloat16},
    {SafetensorsDtype::kI64, c10::ScalarType::Long},   {SafetensorsDtype::kI32, c10::ScalarType::Int},
    {SafetensorsDtype::kI16, c10::ScalarType::Short},  {SafetensorsDtype::kI8, c10::ScalarType::Char},
    {SafetensorsDtype::kU8, c10::ScalarType::Byte},    {SafetensorsDtype::kBool, c10::ScalarType::Bool}};

std::optional<c10::ScalarType> torch_dtype(SafetensorsDtype dtype) {
  for (const auto& [ours, torch] : kTorchDtypes) {
    if (ours == dtype) return torch;
  }
  return std::nullopt;
}

std::optional<SafetensorsDtype> format_dtype(c10::ScalarType dtype) {
  for (const auto& [ours, torch] : kTorchDtypes) {
    if (torch == dtype) return ours;
  }
  return std::nullopt;
}

std::string readable_dtypes() {
  std::vector<std::string> names;
  for (const auto& [ours, torch] : kTorchDtypes)
    names.push_back(fmt::format("{} ({})", to_string(ours), c10::toString(torch)));
  return fmt::format("{}", fmt::join(names, ", "));
}

std::string describe(const std::string& path) { return fmt::format("safetensors file '{}'", path); }

// "the closest names: a, b, c" or "it holds no tensor at all".
std::string closest_names(const std::string& wanted, const std::vector<std::string>& names) {
  if (names.empty()) return "it holds no tensor at all";
  std::vector<std::pair<size_t, std::string>> ranked;
  ranked.reserve(names.size());
  for (const std::string& name : names) ranked.emplace_back(edit_distance(wanted, name), name);
  constexpr size_t kShown = 3;
  const size_t shown = std::min(kShown, ranked.size());
  std::partial_sort(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(shown), ranked.end());
  std::vector<std::string> closest;
  for (size_t i = 0; i < shown; ++i) closest.push_back(ranked[i].second);
  return fmt::format("it holds {} tensors; the closest names: {}", names.size(), fmt::join(closest, ", "));
}

SafetensorsTensorInfo info_of(const SafetensorsEntry& entry) {
  SafetensorsTensorInfo info;
  info.dtype_name = to_string(entry.dtype);
  info.dtype = torch_dtype(entry.dtype).value_or(c10::ScalarType::Undefined);
  info.shape = entry.shape;
  info.begin = static_cast<int64_t>(entry.begin);
  info.end = static_cast<int64_t>(entry.end);
  return info;
}

int64_t element_count(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

// What a tensor about to be written is, in the format's terms; checked before anything is written.
struct Outgoing {
  const std::string* name = nullptr;
  const at::Tensor* tensor = nullptr;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  uint64_t bytes = 0;
};

std::vector<Outgoing> check_outgoing(const NamedTensors& tensors, const std::string& what) {
  std::vector<Outgoing> result;
  std::set<std::string> seen;
  for (const auto& [name, tensor] : tensors) {
    VOLT_CHECK(seen.insert(name).second,
               "cannot write {}: the tensor name '{}' is given twice; expected every name once. "
               "HINT: rename one of them",
               what, name);
    VOLT_CHECK(name != "__metadata__",
               "cannot write {}: '__metadata__' is the format's key for metadata, not a tensor "
               "name. HINT: rename the tensor, or pass strings as the metadata argument",
               what);
    VOLT_CHECK(tensor.defined(), "cannot write {}: tensor '{}' is undefined. HINT: leave it out", what, name);
    VOLT_CHECK(tensor.layout() == c10::kStrided && !tensor.is_quantized(),
               "cannot write {}: tensor '{}' has layout {}{}, expected a dense tensor. HINT: "
               "convert it with .to_dense() or .dequantize() first",
               what, name, c10::str(tensor.layout()), tensor.is_quantized() ? " (quantized)" : "");
    const std::optional<SafetensorsDtype> dtype = format_dtype(tensor.scalar_type());
    VOLT_CHECK(dtype.has_value(),
               "cannot write {}: tensor '{}' has dtype {}, which Volt cannot write as "
               "safetensors; expected one of {}. HINT: convert it first, e.g. tensor.to(torch::kFloat32)",
               what, name, c10::toString(tensor.scalar_type()), readable_dtypes());
    result.push_back(
        {&name, &tensor, *dtype, static_cast<uint64_t>(tensor.numel()) * static_cast<uint64_t>(element_size(*dtype))});
  }
  return result;
}

// Writes checked tensors to `path`: the reference writer's layout, atomically.
void write_outgoing(const std::string& path, std::vector<Outgoing> tensors, const SafetensorsMetadata& metadata) {
  // As the reference orders them (by dtype, in its enum's order of alignment, largest first; then by
  // name), so that the bytes are those Python writes and every tensor stays aligned for its type.
  std::sort(tensors.begin(), tensors.end(), [](const Outgoing& a, const Outgoing& b) {
    if (a.dtype != b.dtype) return a.dtype > b.dtype;
    return *a.name < *b.name;
  });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const Outgoing& tensor : tensors) {
    header[*tensor.name] = {{"dtype", to_string(tensor.dtype)},
                            {"shape", tensor.tensor->sizes().vec()},
                            {"data_offsets", {offset, offset + tensor.bytes}}};
    offset += tensor.bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& error) {
    throw Error(fmt::format(
        "cannot write safetensors file '{}': a tensor name or metadata string is not valid UTF-8 ({}); expected "
        "UTF-8 text, as the JSON header must be. HINT: give names and metadata as UTF-8",
        path, error.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  VOLT_CHECK(text.size() <= kMaxSafetensorsHeaderBytes,
             "cannot write safetensors file '{}': its header would take {} bytes, more than the {} readers accept. "
             "HINT: shorten the metadata, or split the tensors over several files (save_safetensors_folder)",
             path, text.size(), kMaxSafetensorsHeaderBytes);

  write_file_atomically(path, [&](const ByteSink& sink) {
    char length[8];
    uint64_t n = text.size();
    for (char& byte : length) {
      byte = static_cast<char>(n & 0xFF);
      n >>= 8;
    }
    sink(length, sizeof(length));
    sink(text.data(), text.size());
    for (const Outgoing& tensor : tensors) {
      // One tensor at a time on the CPU, so a model on a GPU is never all in host memory at once.
      const at::Tensor bytes = tensor.tensor->detach().to(at::kCPU).contiguous();
      sink(static_cast<const char*>(bytes.data_ptr()), tensor.bytes);
    }
  });
}

// A Hugging Face folder's files, each opened once, and which file holds which tensor.
struct OpenFolder {
  std::map<std::string, SafetensorsFile> files;  // by path
  std::map<std::string, std::string> file_of;    // tensor name -> path
};

void check_index_file_name(const std::string& file, const fs::path& index) {
  const fs::path relative(file);
  bool escapes = relative.empty() || relative.is_absolute();
  for (const fs::path& part : relative) escapes = escapes || part == "..";
  if (!escapes) return;
  throw CheckpointError(
      fmt::format("{} maps tensors to the file '{}', expected a file name inside its folder. HINT: the index is "
                  "corrupt or was edited by hand; write the folder again (save_pretrained)",
                  index.string(), file));
}

std::map<std::string, std::string> read_weight_map(const fs::path& index) {
  std::ifstream in(index);
  std::stringstream text;
  text << in.rdbuf();
  const auto malformed = [&](const std::string& found) {
    return CheckpointError(fmt::format(
        "{} is not a safetensors index ({}); expected JSON {{\"metadata\": {{...}}, \"weight_map\": {{\"<tensor>\": "
        "\"<file>\", ...}}}}. HINT: write the folder again (save_pretrained, or volt::save_safetensors_folder)",
        index.string(), found));
  };
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& error) {
    throw malformed(fmt::format("not JSON: {}", error.what()));
  }
  if (!json.is_object() || !json.contains("weight_map") || !json["weight_map"].is_object()) {
    throw malformed("no \"weight_map\" object");
  }
  std::map<std::string, std::string> weight_map;
  for (const auto& [name, file] : json["weight_map"].items()) {
    if (!file.is_string())
      throw malformed(fmt::format("\"weight_map\" maps '{}' to {}, not a file name", name, file.dump()));
    check_index_file_name(file.get<std::string>(), index);
    weight_map.emplace(name, file.get<std::string>());
  }
  return weight_map;
}

OpenFolder open_folder(const std::string& directory) {
  const fs::path folder(directory);
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) {
    throw CheckpointError(fmt::format(
        "safetensors folder '{}' {}; expected a Hugging Face checkpoint folder (model.safetensors, or "
        "model.safetensors.index.json and its shards). HINT: {}",
        directory, fs::exists(folder, ec) ? "is a file" : "is missing (no such directory)",
        fs::exists(folder, ec) ? "open a single file with volt::SafetensorsFile::open or volt::load_safetensors"
                               : "check the path"));
  }
  OpenFolder result;
  const fs::path single = folder / kSafetensorsWeightsName;
  if (fs::exists(single, ec)) {
    SafetensorsFile file = SafetensorsFile::open(single.string());
    for (const std::string& name : file.names()) result.file_of.emplace(name, single.string());
    result.files.emplace(single.string(), std::move(file));
    return result;
  }
  const fs::path index = folder / kSafetensorsIndexName;
  if (!fs::exists(index, ec)) {
    std::vector<std::string> present;
    for (const auto& item : fs::directory_iterator(folder, ec)) {
      if (item.path().extension() == ".safetensors") present.push_back(item.path().filename().string());
    }
    std::sort(present.begin(), present.end());
    // transformers' older default, a pickle: worth naming, since the folder looks complete.
    const bool pickled =
        fs::exists(folder / "pytorch_model.bin", ec) || fs::exists(folder / "pytorch_model.bin.index.json", ec);
    throw CheckpointError(fmt::format(
        "safetensors folder '{}' holds neither {} nor {} (its .safetensors files: [{}]{}); expected one of them. "
        "HINT: {}",
        directory, kSafetensorsWeightsName, kSafetensorsIndexName, fmt::join(present, ", "),
        pickled ? "; it holds pytorch_model.bin, PyTorch's pickle format, which is not read" : "",
        pickled ? "convert it in Python: AutoModelForCausalLM.from_pretrained(folder).save_pretrained(folder, "
                  "safe_serialization=True) writes model.safetensors beside it"
                : "point at the folder save_pretrained wrote, or open one file with volt::SafetensorsFile::open"));
  }
  const std::map<std::string, std::string> weight_map = read_weight_map(index);
  std::map<std::string, size_t> tensors_per_file;
  for (const auto& [name, file] : weight_map) ++tensors_per_file[file];
  for (const auto& [file, count] : tensors_per_file) {
    const fs::path path = folder / file;
    if (!fs::exists(path, ec)) {
      throw CheckpointError(fmt::format(
          "{} maps {} tensors to '{}', which is missing; expected all {} files it names in '{}'. HINT: the folder "
          "is incomplete: download or copy the missing shard too",
          index.string(), count, file, tensors_per_file.size(), directory));
    }
    result.files.emplace(path.string(), SafetensorsFile::open(path.string()));
  }
  for (const auto& [name, file] : weight_map) {
    const std::string path = (folder / file).string();
    const SafetensorsFile& holder = result.files.at(path);
    if (!holder.contains(name)) {
      throw CheckpointError(
          fmt::format("{} maps tensor '{}' to '{}', which holds no such tensor ({}). HINT: the index and its shards "
                      "are from different saves; write the folder again",
                      index.string(), name, file, closest_names(name, holder.names())));
    }
    result.file_of.emplace(name, path);
  }
  return result;
}

bool is_weights_file_name(const std::string& name) {
  static const std::regex kShard(R"(model-\d{5}-of-\d{5}\.safetensors)");
  return name == kSafetensorsWeightsName || name == kSafetensorsIndexName || std::regex_match(name, kShard);
}

}  // namespace

SafetensorsFile::SafetensorsFile(std::string path, std::shared_ptr<const Mapping> mapping, SafetensorsHeader header)
    : path_(std::move(path)), mapping_(std::move(mapping)), metadata_(std::move(header.metadata)) {
  for (SafetensorsEntry& entry : header.entries) {
    std::string name = entry.name;
    entries_.emplace(std::move(name), std::move(entry));
  }
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  const std::string what = describe(path);
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) {
    throw CheckpointError(fmt::format("{} is missing (no such file). HINT: check the path", what));
  }
  if (fs::is_directory(status)) {
    throw CheckpointError(fmt::format(
        "{} is a directory, expected a file. HINT: read a Hugging Face folder with volt::read_safetensors_folder or "
        "volt::load_safetensors",
        what));
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw CheckpointError(
        fmt::format("{} cannot be opened: {}. HINT: check its permissions", what, std::strerror(errno)));
  }
  struct stat stat_buf {};
  if (::fstat(fd, &stat_buf) != 0) {
    const int error = errno;
    ::close(fd);
    throw CheckpointError(fmt::format("{} cannot be read: {}. HINT: check the file", what, std::strerror(error)));
  }
  const auto size = static_cast<size_t>(stat_buf.st_size);
  if (size == 0) {
    ::close(fd);
    parse_safetensors_header({}, what);  // throws: no length
  }
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  const int error = errno;
  ::close(fd);  // the map keeps the file
  if (base == MAP_FAILED) {
    throw CheckpointError(fmt::format("{} cannot be mapped ({} bytes): {}. HINT: check the file and the memory limit",
                                      what, size, std::strerror(error)));
  }
  auto mapping = std::make_shared<const Mapping>(base, size);
  SafetensorsHeader header = parse_safetensors_header(std::string_view(static_cast<const char*>(base), size), what);
  return SafetensorsFile(path, std::move(mapping), std::move(header));
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> result;
  result.reserve(entries_.size());
  for (const auto& [name, unused] : entries_) result.push_back(name);
  return result;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  const auto it = entries_.find(name);
  if (it != entries_.end()) return it->second;
  throw CheckpointError(
      fmt::format("{} holds no tensor named '{}' ({}). HINT: check the name; SafetensorsFile::names() lists them all",
                  describe(path_), name, closest_names(name, names())));
}

SafetensorsTensorInfo SafetensorsFile::info(const std::string& name) const { return info_of(entry(name)); }

at::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsEntry& found = entry(name);
  return view(found, found.begin, found.shape);
}

at::Tensor SafetensorsFile::slice(const std::string& name, int64_t begin, int64_t end) const {
  const SafetensorsEntry& found = entry(name);
  if (found.shape.empty()) {
    throw CheckpointError(fmt::format(
        "{}: tensor '{}' is 0-d, so it has no rows to slice; expected a tensor of one or more dimensions. HINT: read "
        "it whole with tensor()",
        describe(path_), name));
  }
  const int64_t rows = found.shape[0];
  if (begin < 0 || begin > end || end > rows) {
    throw CheckpointError(fmt::format(
        "{}: rows [{}, {}) of tensor '{}' were asked for, but it has {} (shape [{}]); expected 0 <= begin <= end <= "
        "{}. HINT: check the slice bounds",
        describe(path_), begin, end, name, rows, fmt::join(found.shape, ", "), rows));
  }
  std::vector<int64_t> shape = found.shape;
  shape[0] = end - begin;
  const int64_t row_bytes =
      element_count(std::vector<int64_t>(found.shape.begin() + 1, found.shape.end())) * element_size(found.dtype);
  return view(found, found.begin + static_cast<uint64_t>(begin * row_bytes), std::move(shape));
}

at::Tensor SafetensorsFile::view(const SafetensorsEntry& entry, uint64_t offset, std::vector<int64_t> shape) const {
  const std::optional<c10::ScalarType> dtype = torch_dtype(entry.dtype);
  if (!dtype) {
    throw CheckpointError(fmt::format(
        "{}: tensor '{}' has dtype {}, which LibTorch 1.13 (Volt's) has no type for; Volt reads {}. HINT: convert "
        "it in Python and save again, e.g. "
        "safetensors.torch.save_file({{k: v.to(torch.bfloat16) for k, v in tensors.items()}}, path)",
        describe(path_), entry.name, to_string(entry.dtype), readable_dtypes()));
  }
  const auto options = at::TensorOptions().dtype(*dtype).device(at::kCPU);
  if (element_count(shape) == 0) return at::empty(shape, options);
  char* data = static_cast<char*>(mapping_->base) + offset;
  const at::Tensor mapped = at::from_blob(
      data, shape, [mapping = mapping_](void*) {}, options);
  // A misaligned pointer would be undefined behaviour for typed access: such tensors are copied.
  if (reinterpret_cast<uintptr_t>(data) % static_cast<uintptr_t>(element_size(entry.dtype)) != 0) {
    return mapped.clone();
  }
  return mapped;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors, const SafetensorsMetadata& metadata) {
  write_outgoing(path, check_outgoing(tensors, describe(path)), metadata);
}

std::map<std::string, SafetensorsLocation> read_safetensors_folder(const std::string& directory) {
  const OpenFolder folder = open_folder(directory);
  std::map<std::string, SafetensorsLocation> result;
  for (const auto& [name, path] : folder.file_of) {
    result.emplace(name, SafetensorsLocation{path, folder.files.at(path).info(name)});
  }
  return result;
}

NamedTensors load_safetensors(const std::string& path) {
  NamedTensors result;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const OpenFolder folder = open_folder(path);
    for (const auto& [name, file] : folder.file_of) result.emplace_back(name, folder.files.at(file).tensor(name));
    return result;
  }
  const SafetensorsFile file = SafetensorsFile::open(path);
  for (const std::string& name : file.names()) result.emplace_back(name, file.tensor(name));
  return result;
}

std::vector<std::string> save_safetensors_folder(const std::string& directory, const NamedTensors& tensors,
                                                 int64_t max_shard_bytes, const SafetensorsMetadata& metadata) {
  VOLT_CHECK(max_shard_bytes >= 1,
             "cannot write safetensors folder '{}': max_shard_bytes is {}, expected at least 1. HINT: pass the most "
             "bytes one shard file may hold, e.g. 5'000'000'000 (transformers' 5GB)",
             directory, max_shard_bytes);
  const std::vector<Outgoing> outgoing = check_outgoing(tensors, fmt::format("safetensors folder '{}'", directory));

  // transformers' split (huggingface_hub's split_state_dict_into_shards): in the order given, a
  // tensor that would tip the current shard over the limit starts the next one, and a tensor
  // larger than the limit gets a shard of its own.
  const auto limit = static_cast<uint64_t>(max_shard_bytes);
  std::vector<std::vector<Outgoing>> shards;
  std::vector<Outgoing> current;
  uint64_t current_bytes = 0;
  uint64_t total_bytes = 0;
  for (const Outgoing& tensor : outgoing) {
    total_bytes += tensor.bytes;
    if (tensor.bytes > limit) {
      shards.push_back({tensor});
      continue;
    }
    if (!current.empty() && current_bytes + tensor.bytes > limit) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(tensor);
    current_bytes += tensor.bytes;
  }
  if (!current.empty() || shards.empty()) shards.push_back(std::move(current));

  const fs::path folder(directory);
  std::vector<std::string> written;
  if (shards.size() == 1) {
    write_outgoing((folder / kSafetensorsWeightsName).string(), shards[0], metadata);
    written.emplace_back(kSafetensorsWeightsName);
  } else {
    nlohmann::json weight_map = nlohmann::json::object();
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
      write_outgoing((folder / name).string(), shards[i], metadata);
      for (const Outgoing& tensor : shards[i]) weight_map[*tensor.name] = name;
      written.push_back(name);
    }
    // The index last: a reader that finds it finds every shard it names.
    const nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
    const std::string text = index.dump(2) + "\n";
    write_file_atomically((folder / kSafetensorsIndexName).string(),
                          [&](const ByteSink& sink) { sink(text.data(), text.size()); });
    written.emplace_back(kSafetensorsIndexName);
  }

  // An earlier save's weight files that this one did not write would be read instead of (a stale
  // model.safetensors) or beside (shards of another count) the new ones.
  std::error_code ec;
  for (const auto& item : fs::directory_iterator(folder, ec)) {
    const std::string name = item.path().filename().string();
    if (item.is_regular_file(ec) && is_weights_file_name(name) &&
        std::find(written.begin(), written.end(), name) == written.end()) {
      fs::remove(item.path(), ec);
    }
  }
  return written;
}

}  // namespace volt
