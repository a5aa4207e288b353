#include "volt/loops/fit_result.h"

#include <fmt/format.h>

namespace volt {

const char* to_string(StopReason reason) {
  switch (reason) {
    case StopReason::kMaxEpochs:
      return "max_epochs";
    case StopReason::kMaxSteps:
      return "max_steps";
    case StopReason::kCallback:
      return "callback";
    case StopReason::kInterrupted:
      return "interrupted";
    case StopReason::kRequeued:
      return "requeued";
  }
  return "?";
}

std::string FitResult::brief_report() const {
  if (supervised) return supervised_report();
  std::string metrics_text;
  for (const auto& [name, value] : metrics) {
    // The brief line shows epoch-level values; step suffixes would repeat them.
    if (name.size() > 5 && name.compare(name.size() - 5, 5, "_step") == 0) continue;
    metrics_text += fmt::format(" {}={:.4g}", name, value);
  }
  return fmt::format("stopped: {} after {} epoch{} ({} steps) in {:.1f} s;{}", to_string(reason), epochs_completed,
                     epochs_completed == 1 ? "" : "s", global_step, seconds, metrics_text);
}

std::string FitResult::supervised_report() const {
  return fmt::format(
      "supervised: the worker processes ran the fit, with {} restart{}, in {:.1f} s; their output "
      "above has their results",
      restarts, restarts == 1 ? "" : "s", seconds);
}

std::string FitResult::full_report() const {
  // A supervisor holds none of the workers' training: zeros would read as a fit that did nothing.
  if (supervised) return "Fit summary\n  " + supervised_report() + "\n";
  std::string out = "Fit summary\n";
  const auto line = [&out](const std::string& key, const std::string& value) {
    out += fmt::format("  {:<22}{}\n", key, value);
  };
  line("stop reason", to_string(reason));
  if (!message.empty()) line("message", message);
  line("epochs completed", std::to_string(epochs_completed));
  line("global step", std::to_string(global_step));
  line("time", fmt::format("{:.2f} s", seconds));
  if (!resumed_from.empty()) line("resumed from", resumed_from);
  if (!hpc_checkpoint_path.empty()) line("HPC checkpoint", hpc_checkpoint_path);
  if (!log_dir.empty()) line("log dir", log_dir);
  if (!best_model_path.empty()) line("best checkpoint", best_model_path);
  if (best_model_score) line("best score", fmt::format("{:.6g}", *best_model_score));
  if (!last_model_path.empty()) line("last checkpoint", last_model_path);
  out += "  metrics\n";
  for (const auto& [name, value] : metrics) out += fmt::format("    {:<24}{:.6g}\n", name, value);
  return out;
}

std::string EvalResult::report() const {
  std::size_t width = 20;
  for (const auto& [name, value] : metrics) width = std::max(width, name.size() + 2);
  const std::string rule(width + 20, '-');
  std::string out =
      rule + "\n" +
      fmt::format("{:<{}}{}\n", stage == "test" ? "Test metric" : "Validate metric", width, "DataLoader 0") + rule +
      "\n";
  for (const auto& [name, value] : metrics) out += fmt::format("{:<{}}{:.6g}\n", name, width, value);
  out += rule + "\n";
  return out;
}

}  // namespace volt
