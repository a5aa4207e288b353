// A read-only memory map of a byte range of a file, read front to back: the reader of NpyShards
// and TokenWindows. Internal to volt::datasets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace volt::datasets::internal {

/// Bytes a reader reads between two release_before calls: the resident part of a shard.
inline constexpr int64_t kReleaseEvery = 8 << 20;

/// A read-only memory map of bytes [offset, offset + length) of a file (nothing when length is
/// 0); throws volt::Error naming the file when it cannot be opened or mapped.
class MappedBytes {
 public:
  MappedBytes(const std::string& path, int64_t offset, int64_t length);
  ~MappedBytes();
  MappedBytes(const MappedBytes&) = delete;
  MappedBytes& operator=(const MappedBytes&) = delete;

  /// The first mapped byte of the range.
  const uint8_t* data() const { return base_ + skew_; }
  /// Gives back the whole pages before `used` bytes of the range: the process's memory stays a
  /// window of the shard, not the shard.
  void release_before(int64_t used);

 private:
  uint8_t* base_ = nullptr;
  size_t length_ = 0;
  int64_t skew_ = 0;
  int64_t released_ = 0;
};

}  // namespace volt::datasets::internal
