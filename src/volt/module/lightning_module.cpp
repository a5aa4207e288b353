#include "volt/module/lightning_module.h"

#include "volt/core/error.h"
#include "volt/core/strings.h"

namespace volt {

const char* to_string(Reduce reduce) {
  switch (reduce) {
    case Reduce::kMean: return "mean";
    case Reduce::kSum: return "sum";
    case Reduce::kMax: return "max";
    case Reduce::kMin: return "min";
  }
  return "?";
}

Reduce parse_reduce(const std::string& text) {
  const Reduce all[] = {Reduce::kMean, Reduce::kSum, Reduce::kMax, Reduce::kMin};
  return parse_enum(text, all, "reduce_fx");
}

const char* to_string(Interval interval) {
  switch (interval) {
    case Interval::kEpoch: return "epoch";
    case Interval::kStep: return "step";
  }
  return "?";
}

LightningModule::~LightningModule() = default;

torch::Tensor LightningModule::predict_step(const Batch& batch, int64_t batch_idx) {
  throw Error(fmt::format("{} does not implement predict_step, so Trainer::predict has nothing to run. "
                          "HINT: override `torch::Tensor predict_step(const volt::Batch&, int64_t)`.",
                          name()));
}

void LightningModule::log(const std::string& name, const torch::Tensor& value, const LogOptions& options) {
  VOLT_CHECK(sink_ != nullptr,
             "log('{}') was called outside a Trainer stage. HINT: call log() only from the steps and "
             "hooks the Trainer runs.",
             name);
  sink_->log(name, value, options);
}

void LightningModule::log(const std::string& name, double value, const LogOptions& options) {
  log(name, torch::scalar_tensor(value, torch::kDouble), options);
}

void LightningModule::log_dict(const std::map<std::string, torch::Tensor>& values, const LogOptions& options) {
  for (const auto& [name, value] : values) log(name, value, options);
}

}  // namespace volt
