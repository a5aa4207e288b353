#include "volt/datasets/idx_file.h"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <vector>

#include "volt/core/error.h"
#include "volt/core/strings.h"

namespace volt::datasets {
namespace {

constexpr uint8_t kUnsignedByte = 0x08;
// A larger buffer than zlib's 8 KiB default: fewer read calls for files of tens of MB.
constexpr unsigned kGzBufferBytes = 1u << 20;
// Beyond any IDX file in use; guards the size computation against a corrupt header.
constexpr int64_t kMaxElements = int64_t{1} << 40;

/// The IDX type codes, for messages about the ones Volt does not read.
const char* type_name(uint8_t code) {
  switch (code) {
    case 0x08:
      return "unsigned byte";
    case 0x09:
      return "signed byte";
    case 0x0B:
      return "short";
    case 0x0C:
      return "int";
    case 0x0D:
      return "float";
    case 0x0E:
      return "double";
    default:
      return "unknown";
  }
}

/// An open gzFile (zlib reads plain files through the same calls), closed when it goes.
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path), file_(gzopen(path.c_str(), "rb")) {
    if (file_ == nullptr) {
      const int error = errno;
      VOLT_CHECK(
          std::filesystem::exists(path),
          "IDX file '{}' does not exist. HINT: check the path, and whether the file is named with or without .gz.",
          path);
      throw Error(fmt::format("cannot open IDX file '{}': {}", path, std::strerror(error)));
    }
    gzbuffer(file_, kGzBufferBytes);
  }
  ~GzReader() { gzclose(file_); }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  /// Reads up to `size` bytes into `data`; returns how many there were.
  size_t read(void* data, size_t size) {
    // gzread takes an unsigned count, so read in chunks far below its limit.
    constexpr size_t kChunk = size_t{1} << 30;
    size_t done = 0;
    while (done < size) {
      const auto wanted = static_cast<unsigned>(std::min(kChunk, size - done));
      const int got = gzread(file_, static_cast<char*>(data) + done, wanted);
      if (got < 0) {
        int code = 0;
        const char* message = gzerror(file_, &code);
        throw Error(fmt::format("cannot read IDX file '{}': {} (a damaged gzip file?)", path_, message));
      }
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    return done;
  }

 private:
  std::string path_;
  gzFile file_;
};

std::string shape_string(const std::vector<int64_t>& dims) {
  std::vector<std::string> parts;
  for (const int64_t dim : dims) parts.push_back(std::to_string(dim));
  return "[" + join(parts, ", ") + "]";
}

}  // namespace

torch::Tensor read_idx_file(const std::string& path) {
  GzReader reader(path);

  std::array<uint8_t, 4> magic{};
  VOLT_CHECK(reader.read(magic.data(), magic.size()) == magic.size(),
             "IDX file '{}' is truncated: it is shorter than the 4-byte magic number. HINT: the file is empty or "
             "damaged; download or install it again.",
             path);
  const uint32_t magic_number =
      (uint32_t{magic[0]} << 24) | (uint32_t{magic[1]} << 16) | (uint32_t{magic[2]} << 8) | uint32_t{magic[3]};
  VOLT_CHECK(magic[0] == 0 && magic[1] == 0 && magic[3] > 0,
             "'{}' is not an IDX file: its magic number is 0x{:08x}; expected two zero bytes, a "
             "type code and a number of dimensions (e.g. 0x00000803 for images, 0x00000801 for "
             "labels). HINT: check that the path names an IDX file (gzip-compressed or plain); download it again if it "
             "is damaged.",
             path, magic_number);
  VOLT_CHECK(
      magic[2] == kUnsignedByte,
      "IDX file '{}' holds data of type 0x{:02x} ({}); expected 0x08 (unsigned byte), the "
      "only type Volt reads. HINT: convert the data to unsigned bytes, or save it as .npy and read it with NpyShards.",
      path, magic[2], type_name(magic[2]));

  const size_t rank = magic[3];
  std::vector<uint8_t> header(4 * rank);
  VOLT_CHECK(reader.read(header.data(), header.size()) == header.size(),
             "IDX file '{}' is truncated: its header declares {} dimensions but ends before "
             "their sizes. HINT: the file is damaged; download or install it again.",
             path, rank);
  std::vector<int64_t> dims;
  int64_t elements = 1;
  for (size_t i = 0; i < rank; ++i) {
    const uint8_t* b = &header[4 * i];
    const int64_t dim = (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) | int64_t{b[3]};
    dims.push_back(dim);
    elements = std::min(elements * dim, kMaxElements + 1);
  }
  VOLT_CHECK(elements <= kMaxElements,
             "IDX file '{}' declares a shape of {}, larger than any IDX data set; the header is "
             "probably damaged. HINT: download or install it again.",
             path, shape_string(dims));

  // One buffer, read straight into the tensor's memory.
  torch::Tensor data = torch::empty(dims, torch::kUInt8);
  const size_t got = reader.read(data.data_ptr<uint8_t>(), static_cast<size_t>(elements));
  VOLT_CHECK(got == static_cast<size_t>(elements),
             "IDX file '{}' is truncated: its header declares shape {} ({} bytes of data) but "
             "the file holds only {} bytes of data. HINT: download or install it again.",
             path, shape_string(dims), elements, got);
  uint8_t extra = 0;
  VOLT_CHECK(reader.read(&extra, 1) == 0,
             "IDX file '{}' holds more data than its header declares (shape {}, {} bytes); it is "
             "damaged or not an IDX file. HINT: download or install it again.",
             path, shape_string(dims), elements);
  return data;
}

}  // namespace volt::datasets
