#include "volt/loggers/tfrecord.h"

#include <array>

namespace volt::internal {
namespace {

// The reflected Castagnoli polynomial 0x1EDC6F41.
constexpr uint32_t kCastagnoliReflected = 0x82F63B78u;
constexpr uint32_t kMaskDelta = 0xa282ead8u;

/// The byte-at-a-time lookup table, built at compile time: event files are small, so this is
/// fast enough and needs no library or CPU-specific instructions.
constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t byte = 0; byte < 256; ++byte) {
    uint32_t crc = byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? kCastagnoliReflected : 0u);
    table[byte] = crc;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kTable = make_table();

void append_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((value >> (8 * i)) & 0xffu);
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  uint32_t crc = 0xffffffffu;
  for (unsigned char c : data) crc = kTable[(crc ^ c) & 0xffu] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + kMaskDelta;
}

std::string frame_tfrecord(std::string_view data) {
  std::string length;
  append_le(length, data.size(), 8);
  std::string record = length;
  record.reserve(8 + 4 + data.size() + 4);
  append_le(record, masked_crc32c(length), 4);
  record.append(data);
  append_le(record, masked_crc32c(data), 4);
  return record;
}

}  // namespace volt::internal
