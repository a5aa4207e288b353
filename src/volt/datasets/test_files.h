// Helpers for the datasets tests: IDX, gzip and other files written into a test's TempDir.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/types.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "volt/core/error.h"
#include "volt/core/testing.h"

namespace volt::datasets::testing {

/// A fresh directory for one test (the helper every test shares).
using volt::testing::TempDir;

/// The bytes of an IDX file: magic (0, 0, `type`, rank), big-endian `dims`, then `data`.
inline std::string idx_bytes(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data, uint8_t type = 0x08) {
  std::string bytes = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (const uint32_t dim : dims) {
    for (const int shift : {24, 16, 8, 0}) bytes.push_back(static_cast<char>((dim >> shift) & 0xFF));
  }
  bytes.append(data.begin(), data.end());
  return bytes;
}

/// Writes `bytes` to `path` as they are.
inline void write_plain(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

/// Writes `bytes` to `path` gzip-compressed.
inline void write_gzip(const std::string& path, const std::string& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr) << path;
  ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(file), Z_OK);
}

/// Writes `array` (contiguous, little-endian) as numpy.save does, format 1.0; `descr` names its
/// type, `fortran` the order flag written (the data is written as given).
inline void write_npy(const std::filesystem::path& path, const torch::Tensor& array, const std::string& descr,
                      bool fortran = false) {
  std::string shape = "(";
  for (const int64_t d : array.sizes()) shape += std::to_string(d) + ", ";
  if (array.dim() > 1) shape.resize(shape.size() - 1);
  if (array.dim() > 1)
    shape.back() = ')';
  else
    shape += ")";
  std::string header =
      fmt::format("{{'descr': '{}', 'fortran_order': {}, 'shape': {}, }}", descr, fortran ? "True" : "False", shape);
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  const auto length = static_cast<uint16_t>(header.size());
  out.put(static_cast<char>(length & 0xff));
  out.put(static_cast<char>(length >> 8));
  out << header;
  const torch::Tensor c = array.contiguous();
  out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
}

/// The message of the volt::Error `f` throws; fails the test if it throws none.
template <typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a volt::Error";
  return "";
}

}  // namespace volt::datasets::testing
