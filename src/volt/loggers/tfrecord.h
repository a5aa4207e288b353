// TFRecord framing, the container of TensorBoard's event files.
//
// Each record is: the data's length as a little-endian uint64, the masked CRC32C of those 8
// bytes, the data, the masked CRC32C of the data. TensorBoard's reader checks both CRCs and
// drops the rest of a file at the first mismatch, so these must be exact.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace volt::internal {

/// The CRC-32C (Castagnoli) checksum of `data`; crc32c("123456789") is 0xE3069283.
uint32_t crc32c(std::string_view data);

/// crc32c(data) masked as TFRecord stores it: rotated right by 15 bits plus 0xa282ead8, so a
/// CRC of data that itself holds CRCs does not degenerate.
uint32_t masked_crc32c(std::string_view data);

/// `data` framed as one TFRecord: length, masked CRC of the length, data, masked CRC of the data.
std::string frame_tfrecord(std::string_view data);

}  // namespace volt::internal
