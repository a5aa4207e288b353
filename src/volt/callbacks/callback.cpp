#include "volt/callbacks/callback.h"

#include "volt/core/error.h"
#include "volt/core/strings.h"

namespace volt {

namespace internal {

double monitored_value(const std::map<std::string, double>* metrics, const std::string& monitor,
                       const std::string& who) {
  if (metrics != nullptr) {
    const auto it = metrics->find(monitor);
    if (it != metrics->end()) return it->second;
  }
  std::vector<std::string> names;
  if (metrics != nullptr)
    for (const auto& [name, value] : *metrics) names.push_back("'" + name + "'");
  throw Error(
      fmt::format("{} could not find the monitored metric '{}'; logged metrics are: [{}]. HINT: "
                  "call log(\"{}\", value) in a step, or monitor one of the names above.",
                  who, monitor, join(names, ", "), monitor));
}

}  // namespace internal
}  // namespace volt
