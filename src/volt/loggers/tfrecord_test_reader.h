// Test-only: a small TFRecord reader that checks both CRCs, as TensorBoard's reader does.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "volt/loggers/tfrecord.h"

namespace volt::testing {

inline uint64_t read_le(std::string_view bytes) {
  uint64_t value = 0;
  for (std::size_t i = bytes.size(); i-- > 0;) {
    value = (value << 8) | static_cast<unsigned char>(bytes[i]);
  }
  return value;
}

/// The records framed in `file`; throws std::runtime_error at a short record or a CRC mismatch.
inline std::vector<std::string> read_tfrecords(std::string_view file) {
  std::vector<std::string> records;
  std::size_t at = 0;
  while (at < file.size()) {
    if (file.size() - at < 12) throw std::runtime_error("truncated record header");
    const std::string_view length_bytes = file.substr(at, 8);
    if (read_le(file.substr(at + 8, 4)) != internal::masked_crc32c(length_bytes)) {
      throw std::runtime_error("length CRC mismatch");
    }
    const uint64_t length = read_le(length_bytes);
    at += 12;
    if (file.size() - at < length + 4) throw std::runtime_error("truncated record data");
    const std::string_view data = file.substr(at, length);
    if (read_le(file.substr(at + length, 4)) != internal::masked_crc32c(data)) {
      throw std::runtime_error("data CRC mismatch");
    }
    records.emplace_back(data);
    at += length + 4;
  }
  return records;
}

}  // namespace volt::testing
