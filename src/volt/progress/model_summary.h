// Lightning's model summary table for a LibTorch module.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

namespace volt {

/// One submodule in a ModelSummary.
struct ModelSummaryRow {
  /// Dotted path from the summarized module, e.g. "encoder.0".
  std::string name;
  /// The module's type without namespace or `Impl`, e.g. "Linear".
  std::string type;
  /// Parameters of this module and all its descendants.
  int64_t params = 0;
  /// Whether any of those parameters requires grad (a fully frozen module is false).
  bool trainable = false;
};

/// Parameter counts of a module and its submodules, as Lightning's ModelSummary reports them.
struct ModelSummary {
  /// Submodules up to the requested depth, in registration order (parents before children).
  std::vector<ModelSummaryRow> rows;
  /// Parameters that require grad, each shared tensor counted once.
  int64_t trainable_params = 0;
  /// Parameters that do not require grad.
  int64_t non_trainable_params = 0;
  /// All parameters: trainable_params + non_trainable_params.
  int64_t total_params = 0;
  /// Parameters registered on the summarized module itself, outside any submodule.
  int64_t other_params = 0;
  /// Memory of all parameters in MB (10^6 bytes), from their actual element sizes.
  double size_mb = 0;

  /// Lightning's table: a row per submodule (plus "other params" when there are any), then
  /// the totals, counts written as "235 K" / "1.2 M".
  std::string to_string() const;
};

/// Summarizes `module`: rows for submodules with at most `max_depth` levels of nesting
/// (1: direct children only; 0: no rows; -1: all), totals over every parameter.
ModelSummary summarize(const torch::nn::Module& module, int max_depth = 1);

/// Lightning's get_human_readable_count: "123  ", "1.2 K", "235 K", "2.0 M", "5,000 T".
std::string human_readable_count(int64_t number);

}  // namespace volt
