#include "volt/cli/run_main.h"

#include <c10/util/Exception.h>

#include "volt/precision/precision.h"

namespace volt {

int run_main(const std::function<int()>& body) {
  return run_main(body, [](const std::exception& error) -> std::optional<std::string> {
    if (const auto* torch_error = dynamic_cast<const c10::Error*>(&error)) {
      std::string described = std::string("(LibTorch) ") + torch_error->what_without_backtrace();
      if (const auto hint = missing_kernel_hint(described)) described += "\n" + *hint;
      return described;
    }
    return std::nullopt;
  });
}

}  // namespace volt
