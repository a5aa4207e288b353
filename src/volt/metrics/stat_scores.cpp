#include "volt/metrics/stat_scores.h"

#include <torch/torch.h>

#include <utility>

#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/metrics/classification_inputs.h"

namespace volt {
namespace {

/// a / b element-wise in double, 0 where b is 0 (torchmetrics' _safe_divide).
torch::Tensor safe_divide(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor num = a.to(torch::kDouble);
  const torch::Tensor den = b.to(torch::kDouble);
  return torch::where(den == 0, torch::zeros_like(num), num / torch::where(den == 0, torch::ones_like(den), den));
}

}  // namespace

const char* to_string(Average average) {
  switch (average) {
    case Average::kMicro:
      return "micro";
    case Average::kMacro:
      return "macro";
  }
  return "?";
}

Average parse_average(std::string_view text) {
  const Average all[] = {Average::kMicro, Average::kMacro};
  return parse_enum(text, all, "average");
}

void validate(const ClassificationOptions& options) {
  VOLT_CHECK(options.num_classes >= 2,
             "num_classes is {}; a multiclass metric needs at least 2. HINT: set .num_classes to the number of the "
             "model's outputs (for one score per example use the binary AUROC).",
             options.num_classes);
  VOLT_CHECK(options.top_k >= 1 && options.top_k <= options.num_classes,
             "top_k is {}; expected 1 to num_classes ({}). HINT: top_k 1 is plain accuracy.", options.top_k,
             options.num_classes);
}

MulticlassStatScores::MulticlassStatScores(std::string name, const ClassificationOptions& options)
    : Metric(std::move(name)), options_(options) {
  validate(options_);
  for (const char* count : {"tp", "fp", "fn"}) {
    add_state(count, torch::zeros({options_.num_classes}, torch::kLong), StateReduce::kSum);
  }
}

void MulticlassStatScores::update_state(const torch::Tensor& preds, const torch::Tensor& target) {
  internal::check_class_target(target, options_.num_classes, name());
  const torch::Tensor top = internal::predicted_classes(preds, target, options_.num_classes, options_.top_k, name());
  const auto options = torch::TensorOptions().dtype(torch::kBool).device(top.device());
  const torch::Tensor predicted = torch::zeros({top.size(0), options_.num_classes}, options).scatter_(1, top, true);
  const torch::Tensor actual = torch::zeros({top.size(0), options_.num_classes}, options)
                                   .scatter_(1, target.to(top.device(), torch::kLong).unsqueeze(1), true);
  state("tp") += (predicted & actual).sum(0).to(state("tp").device());
  state("fp") += (predicted & ~actual).sum(0).to(state("fp").device());
  state("fn") += (~predicted & actual).sum(0).to(state("fn").device());
}

torch::Tensor MulticlassStatScores::reduce(const torch::Tensor& numerator, const torch::Tensor& denominator,
                                           const States& states, bool top_k_needs_examples) const {
  if (options_.average == Average::kMicro) return safe_divide(numerator.sum(), denominator.sum());
  const torch::Tensor& tp = states.at("tp");
  const torch::Tensor& fp = states.at("fp");
  const torch::Tensor& fn = states.at("fn");
  // torchmetrics leaves out the classes that nothing was about: in no target and (top-1) no prediction.
  // With top_k > 1 nearly every class is among some example's predictions, so for accuracy,
  // precision and recall it leaves out the classes without examples instead.
  const bool by_examples = top_k_needs_examples && options_.top_k > 1;
  const torch::Tensor present = by_examples ? (tp + fn) > 0 : (tp + fp + fn) > 0;
  const torch::Tensor weights = present.to(torch::kDouble);
  return safe_divide((safe_divide(numerator, denominator) * weights).sum(), weights.sum());
}

}  // namespace volt
