#include "volt/core/error.h"

namespace volt::internal {

void throw_internal(const char* file, int line, const char* condition, const std::string& message) {
  throw InternalError(
      fmt::format("internal error at {}:{}: `{}` failed{}{} (this is a bug in Volt; "
                  "please report it)",
                  file, line, condition, message.empty() ? "" : ": ", message));
}

}  // namespace volt::internal
