// Lightning's metrics.csv (written by volt::CSVLogger and Lightning's CSVLogger), read back for
// `volt plot`.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace volt::tool {

/// A metrics.csv as columns of optional numbers: a row logs only some metrics, and the other
/// cells are empty.
struct MetricsTable {
  /// The header's names, in file order (e.g. "epoch", "step", "train/loss_step", "val/acc").
  std::vector<std::string> columns;
  /// One entry per data row; each holds one cell per column, empty when the cell is empty or not
  /// a number.
  std::vector<std::vector<std::optional<double>>> rows;

  /// The index of `name` in columns, or nullopt.
  std::optional<std::size_t> column(const std::string& name) const;
  /// Whether column `index` holds at least one finite number.
  bool has_numbers(std::size_t index) const;
};

/// Parses CSV text in Python's excel dialect (quoted fields with "" escapes, "\r\n" or "\n" line
/// ends). `path` only names the file in errors. Throws volt::Error for an empty file, or a row whose
/// cell count differs from the header's, naming the line.
MetricsTable parse_metrics_csv(const std::string& text, const std::string& path);

}  // namespace volt::tool
