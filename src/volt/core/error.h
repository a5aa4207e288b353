// Volt's one small error hierarchy.
//
// Following c10's split: VOLT_CHECK is for user input (options, files, environment) and throws
// volt::Error with a message that says what was given, what was expected and, where possible, a
// `HINT:` that says what to do. VOLT_INTERNAL_ASSERT is for Volt's own bugs. The CLI is the only
// place that catches everything and maps it to an exit code.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace volt {

/// Any error Volt reports about input it was given: bad options, files, environment.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

/// A checkpoint file that cannot be read or does not fit the module.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

/// A violated internal invariant: a bug in Volt, not in the caller's input.
class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& message) : std::logic_error(message) {}
};

namespace internal {
[[noreturn]] void throw_internal(const char* file, int line, const char* condition, const std::string& message);
}  // namespace internal

}  // namespace volt

/// Throws volt::Error with a fmt-formatted message when `cond` is false (user input).
#define VOLT_CHECK(cond, ...)                                   \
  do {                                                          \
    if (!(cond)) throw ::volt::Error(fmt::format(__VA_ARGS__)); \
  } while (false)

/// Throws volt::InternalError naming the file and line when `cond` is false (Volt's bug).
#define VOLT_INTERNAL_ASSERT(cond, ...)                                                                    \
  do {                                                                                                     \
    if (!(cond)) ::volt::internal::throw_internal(__FILE__, __LINE__, #cond, fmt::format("" __VA_ARGS__)); \
  } while (false)
