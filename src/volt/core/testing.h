// Helpers shared by Volt's GoogleTest tests (header-only; tests include it, the library does not).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "volt/core/error.h"

namespace volt::testing {

/// The message of the `E` that `body` throws; records a test failure when it throws none.
template <typename E = Error>
std::string error_message(const std::function<void()>& body) {
  try {
    body();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

/// Writes `text` to `name` in this test program's scratch directory and returns the file's path.
/// The directory is a fresh one per process (CTest runs tests in parallel: a shared name would
/// let one read a file another is writing) and is removed, with everything in it, at exit.
inline std::string write_scratch_file(const std::string& name, const std::string& text) {
  struct ScratchDirectory {
    std::filesystem::path path;
    ScratchDirectory() {
      std::string pattern = (std::filesystem::temp_directory_path() / "volt_test_XXXXXX").string();
      if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
      path = pattern;
    }
    ~ScratchDirectory() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  };
  static const ScratchDirectory directory;
  const std::string path = (directory.path / name).string();
  std::ofstream(path) << text;
  return path;
}

}  // namespace volt::testing
