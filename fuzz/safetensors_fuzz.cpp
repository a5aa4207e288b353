// libFuzzer target for the safetensors header parser that SafetensorsFile::open runs on every
// file: any bytes must either parse into a header that keeps the format's promises or throw
// volt::Error; a crash, a hang, another exception or a broken promise is a bug.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "volt/checkpoint/safetensors_header.h"
#include "volt/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view file(reinterpret_cast<const char*>(data), size);
  try {
    const volt::SafetensorsHeader header = volt::parse_safetensors_header(file, "fuzz input");
    // What the reader relies on: the tensors tile the byte buffer, in order, up to the file's end,
    // and each one's bytes are its elements.
    uint64_t covered = header.data_start;
    if (header.data_start < 8 || header.data_start > size) std::abort();
    for (const volt::SafetensorsEntry& entry : header.entries) {
      if (entry.begin != covered || entry.end < entry.begin || entry.end > size) std::abort();
      uint64_t bytes = static_cast<uint64_t>(volt::element_size(entry.dtype));
      for (const int64_t dim : entry.shape) {
        if (dim < 0) std::abort();
        bytes *= static_cast<uint64_t>(dim);
      }
      if (bytes != entry.end - entry.begin) std::abort();
      covered = entry.end;
    }
    if (covered != size) std::abort();
  } catch (const volt::Error&) {
    // Malformed input is reported, as it must be.
  }
  return 0;
}
