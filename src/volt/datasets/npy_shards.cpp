#include "volt/datasets/npy_shards.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "volt/core/error.h"
#include "volt/data/data_loader.h"
#include "volt/datasets/mapped_bytes.h"

namespace volt::datasets {

namespace {

namespace fs = std::filesystem;

/// The text after `key` in a .npy header dict, e.g. "'<f4', 'fortran_order': ...".
std::string after_key(const std::string& header, const std::string& key, const std::string& path) {
  const size_t at = header.find("'" + key + "'");
  VOLT_CHECK(at != std::string::npos,
             "{} is not a .npy file Volt can read: its header {} has no '{}'. HINT: write it "
             "with numpy.save.",
             path, header, key);
  size_t colon = header.find(':', at);
  VOLT_CHECK(colon != std::string::npos, "{}: malformed .npy header {}. HINT: write the file again with numpy.save.",
             path, header);
  ++colon;
  while (colon < header.size() && header[colon] == ' ') ++colon;
  return header.substr(colon);
}

torch::ScalarType parse_descr(const std::string& descr, const std::string& path) {
  const std::string kind = descr.size() == 3 ? descr.substr(1) : "";
  const char order = descr.empty() ? '?' : descr[0];
  VOLT_CHECK(order != '>' || kind == "u1" || kind == "i1" || kind == "b1",
             "{} holds big-endian data ('{}'). HINT: save it little-endian: numpy.save(path, "
             "array.astype(array.dtype.newbyteorder('<'))).",
             path, descr);
  if (kind == "u1") return torch::kByte;
  if (kind == "i1") return torch::kChar;
  if (kind == "b1") return torch::kBool;
  if (kind == "i2") return torch::kShort;
  if (kind == "i4") return torch::kInt;
  if (kind == "i8") return torch::kLong;
  if (kind == "f2") return torch::kHalf;
  if (kind == "f4") return torch::kFloat;
  if (kind == "f8") return torch::kDouble;
  throw Error(
      fmt::format("{} holds elements of type '{}', which Volt does not read; expected one of uint8, int8, "
                  "bool, int16, int32, int64, float16, float32, float64. HINT: convert it, e.g. "
                  "numpy.save(path, array.astype('float32')).",
                  path, descr));
}

/// Reads examples [first, first + count) of a data file and its target file.
class NpyReader : public ExampleReader {
 public:
  NpyReader(const std::string& data_path, const NpyHeader& data, const std::string* target_path,
            const NpyHeader* target, int64_t first, int64_t count, int64_t global, const Transform& transform)
      : data_(data_path, data.data_offset + first * data.row_bytes, count * data.row_bytes),
        data_header_(data),
        data_shape_(data.shape.begin() + 1, data.shape.end()),
        count_(count),
        global_(global),
        transform_(transform) {
    if (target_path) {
      target_.emplace(*target_path, target->data_offset + first * target->row_bytes, count * target->row_bytes);
      target_header_ = *target;
      target_shape_.assign(target->shape.begin() + 1, target->shape.end());
    }
  }

  std::optional<Example> next() override {
    if (next_ >= count_) return std::nullopt;
    Example e;
    e.data = row(data_.data(), data_header_, data_shape_, next_);
    if (transform_) {
      at::Generator generator = example_generator(global_ + next_);
      e.data = transform_(e.data, generator);
    }
    if (target_) e.target = row(target_->data(), target_header_, target_shape_, next_);
    ++next_;
    if ((next_ * data_header_.row_bytes) - released_ >= internal::kReleaseEvery) {
      released_ = next_ * data_header_.row_bytes;
      data_.release_before(released_);
      if (target_) target_->release_before(next_ * target_header_.row_bytes);
    }
    return e;
  }

  int64_t skip(int64_t count) override {
    const int64_t skipped = std::min(count, count_ - next_);
    next_ += skipped;
    return skipped;
  }

 private:
  /// Row `i` as a tensor of its own (the map goes away with the reader).
  static torch::Tensor row(const uint8_t* base, const NpyHeader& header, const std::vector<int64_t>& shape, int64_t i) {
    return torch::from_blob(const_cast<uint8_t*>(base + i * header.row_bytes), shape, header.dtype).clone();
  }

  internal::MappedBytes data_;
  NpyHeader data_header_;
  std::vector<int64_t> data_shape_;  // one example's shape: the header's without its first dimension
  std::optional<internal::MappedBytes> target_;
  NpyHeader target_header_;
  std::vector<int64_t> target_shape_;
  int64_t count_;
  int64_t global_;
  const Transform& transform_;
  int64_t next_ = 0;
  int64_t released_ = 0;
};

}  // namespace

NpyHeader read_npy_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  VOLT_CHECK(in.good(), "cannot open {}: {}. HINT: check the path; shards are written with numpy.save.", path,
             std::strerror(errno));
  char start[12] = {};
  in.read(start, 10);
  VOLT_CHECK(in.gcount() == 10 && std::memcmp(start, "\x93NUMPY", 6) == 0,
             "{} is not a .npy file: it does not start with \\x93NUMPY. HINT: write shards with numpy.save (not "
             "numpy.savez or pickle).",
             path);
  const int major = static_cast<uint8_t>(start[6]);
  VOLT_CHECK(major >= 1 && major <= 3,
             "{} is a .npy file of format {}.{}; Volt reads 1.0 to 3.0. HINT: the file is damaged or not from "
             "numpy.save; write it again with numpy.save.",
             path, major, static_cast<int>(static_cast<uint8_t>(start[7])));
  int64_t header_length = 0;
  int64_t prefix = 10;
  if (major == 1) {
    header_length = static_cast<uint8_t>(start[8]) | (static_cast<uint8_t>(start[9]) << 8);
  } else {
    in.read(start + 10, 2);
    prefix = 12;
    for (int i = 3; i >= 0; --i) header_length = (header_length << 8) | static_cast<uint8_t>(start[8 + i]);
  }
  std::string header(static_cast<size_t>(header_length), '\0');
  in.read(header.data(), header_length);
  VOLT_CHECK(in.gcount() == header_length,
             "{} ends inside its .npy header. HINT: the file is cut short; write it again with numpy.save.", path);

  NpyHeader out;
  out.data_offset = prefix + header_length;
  const std::string descr_text = after_key(header, "descr", path);
  const size_t quote = descr_text.find('\'', 1);
  VOLT_CHECK(!descr_text.empty() && descr_text[0] == '\'' && quote != std::string::npos,
             "{} has a structured dtype ({}); Volt reads plain arrays. HINT: save each field as its own array.", path,
             header);
  const std::string descr = descr_text.substr(1, quote - 1);
  out.uint16 = descr == "<u2" || descr == "|u2" || descr == "=u2";
  out.dtype = out.uint16 ? torch::kShort : parse_descr(descr, path);
  VOLT_CHECK(after_key(header, "fortran_order", path).rfind("False", 0) == 0,
             "{} is in Fortran order. HINT: save a C-ordered copy: numpy.save(path, numpy.ascontiguousarray(array)).",
             path);
  const std::string shape_text = after_key(header, "shape", path);
  const size_t close = shape_text.find(')');
  VOLT_CHECK(!shape_text.empty() && shape_text[0] == '(' && close != std::string::npos,
             "{}: malformed shape in {}. HINT: write the file again with numpy.save.", path, header);
  std::string dims = shape_text.substr(1, close - 1);
  std::replace(dims.begin(), dims.end(), ',', ' ');
  std::istringstream parse(dims);
  for (int64_t d = 0; parse >> d;) out.shape.push_back(d);
  VOLT_CHECK(!out.shape.empty(),
             "{} holds a single value (shape ()); expected an array whose first dimension indexes the examples. HINT: "
             "save an array with one row per example, e.g. numpy.save(path, numpy.atleast_1d(value)).",
             path);
  out.row_bytes = static_cast<int64_t>(c10::elementSize(out.dtype));
  for (size_t i = 1; i < out.shape.size(); ++i) out.row_bytes *= out.shape[i];
  std::error_code error;
  const auto bytes = static_cast<int64_t>(fs::file_size(path, error));
  VOLT_CHECK(!error && bytes >= out.data_offset + out.shape[0] * out.row_bytes,
             "{} is cut short: its header promises {} examples of {} bytes after {} header bytes, but the file has {} "
             "bytes. HINT: write the shard again; a copy may have been interrupted.",
             path, out.shape[0], out.row_bytes, out.data_offset, error ? 0 : bytes);
  return out;
}

namespace {

// NpyShards hands out rows as stored; uint16 would come out as int16.
void refuse_uint16(const std::string& path, const NpyHeader& header) {
  VOLT_CHECK(!header.uint16,
             "{} holds uint16 elements, which NpyShards does not read (LibTorch 1.13 has no uint16). HINT: convert "
             "it, e.g. numpy.save(path, array.astype('int32')); token ids in uint16 are read by TokenWindows.",
             path);
}

}  // namespace

NpyShards::NpyShards(std::vector<std::string> data, std::vector<std::string> targets, NpyShardsOptions options)
    : options_(std::move(options)) {
  VOLT_CHECK(!data.empty(), "NpyShards got no data files. HINT: pass the .npy files of the inputs, one per shard.");
  VOLT_CHECK(targets.empty() || targets.size() == data.size(),
             "NpyShards got {} data files but {} target files. HINT: pass one target file per data file, or none.",
             data.size(), targets.size());
  VOLT_CHECK(!options_.examples_per_shard || *options_.examples_per_shard >= 1,
             "NpyShards examples_per_shard={} must be at least 1. HINT: a few thousand examples per shard.",
             options_.examples_per_shard.value_or(0));
  for (size_t f = 0; f < data.size(); ++f) {
    data_.push_back({data[f], read_npy_header(data[f])});
    refuse_uint16(data[f], data_.back().header);
    if (!targets.empty()) {
      targets_.push_back({targets[f], read_npy_header(targets[f])});
      refuse_uint16(targets[f], targets_.back().header);
      VOLT_CHECK(targets_[f].header.shape[0] == data_[f].header.shape[0],
                 "{} has {} examples but its target file {} has {}. HINT: pair each data file with the targets of "
                 "the same examples.",
                 data[f], data_[f].header.shape[0], targets[f], targets_[f].header.shape[0]);
    }
    const int64_t n = data_[f].header.shape[0];
    const int64_t step = options_.examples_per_shard.value_or(std::max<int64_t>(n, 1));
    for (int64_t first = 0; first < n; first += step) {
      shards_.push_back({f, first, std::min(step, n - first), size_ + first});
    }
    size_ += n;
  }
}

NpyShards NpyShards::in_folder(const std::string& folder, NpyShardsOptions options) {
  VOLT_CHECK(fs::is_directory(folder), "{} is not a folder. HINT: pass the folder holding data-*.npy files.", folder);
  std::vector<std::string> data;
  std::vector<std::string> targets;
  for (const auto& entry : fs::directory_iterator(folder)) {
    const std::string name = entry.path().filename().string();
    if (name.size() < 4 || name.substr(name.size() - 4) != ".npy") continue;
    if (name.rfind("data-", 0) == 0) data.push_back(entry.path().string());
    if (name.rfind("target-", 0) == 0) targets.push_back(entry.path().string());
  }
  VOLT_CHECK(!data.empty(),
             "{} holds no data-*.npy files. HINT: write shards with numpy.save('{}/data-00000.npy', inputs) and "
             "numpy.save('{}/target-00000.npy', targets).",
             folder, folder, folder);
  std::sort(data.begin(), data.end());
  std::sort(targets.begin(), targets.end());
  return NpyShards(std::move(data), std::move(targets), std::move(options));
}

std::unique_ptr<ExampleReader> NpyShards::open(int64_t shard) const {
  const Shard& s = shards_[static_cast<size_t>(shard)];
  const File& data = data_[s.file];
  const File* target = targets_.empty() ? nullptr : &targets_[s.file];
  return std::make_unique<NpyReader>(data.path, data.header, target ? &target->path : nullptr,
                                     target ? &target->header : nullptr, s.first, s.count, s.global,
                                     options_.transform);
}

std::string NpyShards::describe(int64_t shard) const {
  const Shard& s = shards_[static_cast<size_t>(shard)];
  if (s.count == data_[s.file].header.shape[0]) return data_[s.file].path;
  return fmt::format("{} (examples {} to {})", data_[s.file].path, s.first, s.first + s.count - 1);
}

}  // namespace volt::datasets
