#include "volt/callbacks/callback.h"

#include <ATen/Functions.h>

#include "volt/core/error.h"
#include "volt/core/strings.h"

namespace volt {

namespace internal {

void notify_exception(const std::vector<std::shared_ptr<Callback>>& callbacks, const CallbackContext& context,
                      const std::exception& error, CallbackServices& services) {
  for (const auto& callback : callbacks) {
    try {
      callback->on_exception(context, error, services);
    } catch (...) {
      // The run's own error is the one to report; a second one from a callback adds nothing.
    }
  }
}

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

double score_value(const c10::IValue& value) {
  if (value.isDouble()) return value.toDouble();
  if (value.isInt()) return static_cast<double>(value.toInt());
  VOLT_CHECK(value.isTensor() && value.toTensor().numel() == 1,
             "a callback state holds a score that is a {}; expected a number or a one-element tensor. HINT: "
             "resume from a checkpoint that Volt or Lightning wrote.",
             value.isTensor() ? "tensor of shape " + c10::str(value.toTensor().sizes()) : value.tagKind());
  return value.toTensor().item<double>();
}

at::Tensor score_tensor(double score) { return at::scalar_tensor(score, at::kDouble); }

}  // namespace internal
}  // namespace volt
