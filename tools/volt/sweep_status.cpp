#include "sweep_status.h"

#include <fmt/format.h>

#include <algorithm>

#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/slurm/hostlist.h"

namespace volt::tool {
namespace {

/// The ids of one squeue id field: "123_4" as is, "123_[4-7%2]" as 123_4 ... 123_7.
std::vector<std::string> expand_job_ids(const std::string& field) {
  const auto bracket = field.find('[');
  if (bracket == std::string::npos) return {field};
  std::string range = field;
  // The %K parallelism cap is not part of any task's id; the rest is a hostlist-like range.
  const auto percent = range.find('%');
  if (percent != std::string::npos) range.erase(percent, range.find(']') - percent);
  try {
    return slurm::expand_hostlist(range);
  } catch (const Error&) {
    return {field};
  }
}

}  // namespace

std::map<std::string, std::string> parse_squeue(const std::string& output) {
  std::map<std::string, std::string> states;
  for (const auto& line : split(output, '\n')) {
    const auto words = split(trim(line), ' ');
    if (words.size() < 2 || words[0].empty()) continue;
    const std::string state = trim(words.back());
    for (const auto& id : expand_job_ids(words[0])) states[id] = state;
  }
  return states;
}

std::optional<std::string> parse_scontrol_state(const std::string& output) {
  for (const auto& word : split(output, ' ')) {
    const std::string item = trim(word);
    if (item.rfind("JobState=", 0) == 0 && item.size() > 9) return item.substr(9);
  }
  return std::nullopt;
}

std::optional<std::string> parse_sacct_state(const std::string& output) {
  for (const auto& line : split(output, '\n')) {
    const std::string state = trim(split(trim(line), ' ').front());
    if (!state.empty()) return state;
  }
  return std::nullopt;
}

std::string trial_state(const std::optional<std::string>& squeue_state,
                        const std::optional<std::string>& scontrol_state, bool trial_dir_has_files,
                        const std::optional<std::string>& sacct_state) {
  if (squeue_state) return *squeue_state;
  if (scontrol_state) return *scontrol_state;
  if (sacct_state) return *sacct_state;
  return trial_dir_has_files ? "ended?" : "unknown";
}

std::string render_status(const std::vector<TrialStatus>& statuses) {
  std::vector<std::vector<std::string>> cells{{"trial", "job_id", "state", "values"}};
  for (const auto& status : statuses) {
    std::vector<std::string> values;
    for (const auto& [name, value] : status.trial.values) values.push_back(fmt::format("{}={}", name, value));
    cells.push_back({std::to_string(status.trial.index), status.job_id, status.state, join(values, " ")});
  }
  std::vector<std::size_t> widths(cells[0].size(), 0);
  for (const auto& line : cells) {
    for (std::size_t i = 0; i < line.size(); ++i) widths[i] = std::max(widths[i], line[i].size());
  }
  std::string out;
  for (const auto& line : cells) {
    std::string text;
    for (std::size_t i = 0; i < line.size(); ++i) text += fmt::format("{:<{}}  ", line[i], widths[i]);
    while (!text.empty() && text.back() == ' ') text.pop_back();
    out += text + "\n";
  }
  return out;
}

}  // namespace volt::tool
