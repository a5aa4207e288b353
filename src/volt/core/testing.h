// Helpers shared by Volt's GoogleTest tests (header-only; tests include it, the library does not).
#pragma once

#include <gtest/gtest.h>

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

}  // namespace volt::testing
