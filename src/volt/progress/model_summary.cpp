#include "volt/progress/model_summary.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "volt/core/error.h"

namespace volt {
namespace {

/// `digits` (an optional '-' then digits) with a ',' between groups of three, like Python's ",".
std::string group_thousands(const std::string& digits) {
  const std::size_t begin = !digits.empty() && digits[0] == '-' ? 1 : 0;
  // Appended char by char: GCC 12's -Wstringop-overflow misreads std::string::insert here in C++20.
  std::string out = digits.substr(0, begin);
  for (std::size_t i = begin; i < digits.size(); ++i) {
    if (i > begin && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

/// Python's f"{size:,.3f}", Lightning's get_formatted_model_size.
std::string formatted_model_size(double size_mb) {
  const std::string fixed = fmt::format("{:.3f}", size_mb);
  const std::size_t dot = fixed.find('.');
  return group_thousands(fixed.substr(0, dot)) + fixed.substr(dot);
}

/// "torch::nn::LinearImpl" -> "Linear", "ns::Block<ns::Cfg>" -> "Block<ns::Cfg>".
std::string short_type_name(const std::string& name) {
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i + 1 < name.size(); ++i) {
    if (name[i] == '<') ++depth;
    if (name[i] == '>') --depth;
    if (depth == 0 && name[i] == ':' && name[i + 1] == ':') start = i + 2;
  }
  std::string type = name.substr(start);
  // TORCH_MODULE(Linear) names the implementation LinearImpl; users know it as Linear.
  const std::string impl = "Impl";
  const bool ends_in_impl =
      type.size() > impl.size() && type.compare(type.size() - impl.size(), impl.size(), impl) == 0;
  if (ends_in_impl) type.resize(type.size() - impl.size());
  return type;
}

/// Parameter totals over `params`, each tensor counted once even when registered twice.
struct ParamCount {
  int64_t total = 0;
  int64_t trainable = 0;
  int64_t bytes = 0;
};

ParamCount count_params(const std::vector<torch::Tensor>& params) {
  ParamCount count;
  std::unordered_set<const void*> seen;
  for (const torch::Tensor& p : params) {
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
    count.total += p.numel();
    if (p.requires_grad()) count.trainable += p.numel();
    count.bytes += p.numel() * static_cast<int64_t>(p.element_size());
  }
  return count;
}

int64_t nesting(const std::string& dotted_name) { return std::count(dotted_name.begin(), dotted_name.end(), '.'); }

}  // namespace

std::string human_readable_count(int64_t number) {
  VOLT_INTERNAL_ASSERT(number >= 0, "a parameter count of {}", number);
  static constexpr const char* kLabels[] = {" ", "K", "M", "B", "T"};
  constexpr int64_t kLabelCount = 5;
  const auto num_digits = static_cast<int64_t>(std::to_string(number).size());
  const int64_t num_groups = std::min((num_digits + 2) / 3, kLabelCount);
  const int64_t index = num_groups - 1;
  // Computed as Lightning does (a float times a power of ten) so rounding matches.
  const double scaled = static_cast<double>(number) * std::pow(10.0, -3.0 * static_cast<double>(index));
  if (index < 1 || scaled >= 100) {
    return fmt::format("{} {}", group_thousands(std::to_string(static_cast<int64_t>(scaled))), kLabels[index]);
  }
  return fmt::format("{:.1f} {}", scaled, kLabels[index]);
}

ModelSummary summarize(const torch::nn::Module& module, int max_depth) {
  VOLT_CHECK(max_depth >= -1,
             "summarize got max_depth={}; expected -1 (all levels), 0 (no rows) or more. HINT: "
             "1 lists the direct submodules.",
             max_depth);
  ModelSummary summary;
  for (const auto& item : module.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    if (max_depth >= 0 && nesting(item.key()) >= max_depth) continue;
    const ParamCount count = count_params(item.value()->parameters(/*recurse=*/true));
    summary.rows.push_back(
        ModelSummaryRow{item.key(), short_type_name(item.value()->name()), count.total, count.trainable > 0});
  }
  const ParamCount all = count_params(module.parameters(/*recurse=*/true));
  summary.total_params = all.total;
  summary.trainable_params = all.trainable;
  summary.non_trainable_params = all.total - all.trainable;
  summary.other_params = count_params(module.parameters(/*recurse=*/false)).total;
  summary.size_mb = static_cast<double>(all.bytes) / 1e6;
  return summary;
}

// Lightning's _format_summary_table, column for column, trailing spaces included.
std::string ModelSummary::to_string() const {
  struct Column {
    std::string header;
    std::vector<std::string> cells;
  };
  std::vector<Column> columns = {{" ", {}}, {"Name", {}}, {"Type", {}}, {"Params", {}}};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    columns[0].cells.push_back(std::to_string(i));
    columns[1].cells.push_back(rows[i].name);
    columns[2].cells.push_back(rows[i].type);
    columns[3].cells.push_back(human_readable_count(rows[i].params));
  }
  // Lightning adds parameters outside any listed module as one more row.
  if (!rows.empty() && other_params > 0) {
    columns[0].cells.push_back(" ");
    columns[1].cells.push_back("other params");
    columns[2].cells.push_back("n/a");
    columns[3].cells.push_back(human_readable_count(other_params));
  }

  std::vector<std::size_t> widths;
  std::size_t total_width = 3 * (columns.size() + 1);
  for (const Column& column : columns) {
    std::size_t width = column.header.size();
    for (const std::string& cell : column.cells) width = std::max(width, cell.size());
    widths.push_back(width);
    total_width += width;
  }
  auto table_line = [&](auto cell_of) {
    std::string line;
    for (std::size_t c = 0; c < columns.size(); ++c) {
      if (c > 0) line += " | ";
      line += fmt::format("{:<{}}", cell_of(columns[c]), widths[c]);
    }
    return line;
  };

  const std::string rule(total_width, '-');
  std::string text = table_line([](const Column& c) { return c.header; }) + "\n" + rule;
  for (std::size_t r = 0; r < columns[0].cells.size(); ++r) {
    text += "\n" + table_line([r](const Column& c) { return c.cells[r]; });
  }
  text += "\n" + rule;
  text += fmt::format("\n{:<10}Trainable params", human_readable_count(trainable_params));
  text += fmt::format("\n{:<10}Non-trainable params", human_readable_count(non_trainable_params));
  text += fmt::format("\n{:<10}Total params", human_readable_count(total_params));
  text += fmt::format("\n{:<10}Total estimated model params size (MB)", formatted_model_size(size_mb));
  return text;
}

}  // namespace volt
