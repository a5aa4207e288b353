#include "metrics_csv.h"

#include <cmath>
#include <cstdlib>

#include "volt/core/error.h"

namespace volt::tool {
namespace {

/// Splits one CSV record starting at `pos`; advances `pos` past its line end. Quoted fields may
/// hold commas, quotes ("") and line breaks.
std::vector<std::string> next_record(const std::string& text, std::size_t& pos) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (; pos < text.size(); ++pos) {
    const char c = text[pos];
    if (quoted) {
      if (c == '"' && pos + 1 < text.size() && text[pos + 1] == '"') {
        fields.back() += '"';
        ++pos;
      } else if (c == '"') {
        quoted = false;
      } else {
        fields.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      fields.emplace_back();
    } else if (c == '\n') {
      ++pos;
      break;
    } else if (c != '\r') {
      fields.back() += c;
    }
  }
  return fields;
}

std::optional<double> to_number(const std::string& cell) {
  if (cell.empty()) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(cell.c_str(), &end);
  if (end != cell.c_str() + cell.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

}  // namespace

std::optional<std::size_t> MetricsTable::column(const std::string& name) const {
  for (std::size_t i = 0; i < columns.size(); ++i) {
    if (columns[i] == name) return i;
  }
  return std::nullopt;
}

bool MetricsTable::has_numbers(std::size_t index) const {
  for (const auto& row : rows) {
    if (row[index]) return true;
  }
  return false;
}

MetricsTable parse_metrics_csv(const std::string& text, const std::string& path) {
  MetricsTable table;
  std::size_t pos = 0;
  // A blank first line is no header: only the file's own first record names columns.
  if (text.find_first_not_of("\r\n") == std::string::npos) {
    throw Error(
        fmt::format("'{}' is empty; expected a header line such as 'epoch,step,train/loss_step'. HINT: "
                    "the run may not have logged yet (the CSV logger flushes every 100 steps by default).",
                    path));
  }
  table.columns = next_record(text, pos);
  for (int64_t line = 2; pos < text.size(); ++line) {
    const std::vector<std::string> fields = next_record(text, pos);
    if (fields.size() == 1 && fields[0].empty()) continue;  // blank line
    VOLT_CHECK(fields.size() == table.columns.size(),
               "'{}' line {} has {} cells but the header has {} columns. HINT: the file was cut off or "
               "edited; metrics.csv rows must match its header line.",
               path, line, fields.size(), table.columns.size());
    std::vector<std::optional<double>> row;
    row.reserve(fields.size());
    for (const auto& field : fields) row.push_back(to_number(field));
    table.rows.push_back(std::move(row));
  }
  return table;
}

}  // namespace volt::tool
