// Helpers shared by Volt's GoogleTest tests (header-only; tests include it, the library does not).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
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

/// A fresh directory for one test, removed with everything in it when the test ends. Named after
/// the test (`volt_<suite>_<test>_XXXXXX` in the temporary directory) and unique, so tests that
/// CTest runs in parallel never share one.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = info == nullptr ? "volt" : std::string("volt_") + info->test_suite_name() + "_" + info->name();
    for (char& c : name) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') c = '_';  // parameterized names hold '/'
    }
    std::string pattern = (std::filesystem::temp_directory_path() / (name + "_XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  /// The path of `name` inside the directory.
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  /// The directory.
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

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
  std::string path = (directory.path / name).string();
  std::ofstream(path) << text;
  return path;
}

}  // namespace volt::testing
