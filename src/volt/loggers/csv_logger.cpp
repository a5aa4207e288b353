#include "volt/loggers/csv_logger.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <system_error>

#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/loggers/hparams_yaml.h"

namespace volt {
namespace {

namespace fs = std::filesystem;

constexpr const char* kStepKey = "step";
// Python's csv module (excel dialect), which Lightning writes with, ends lines with "\r\n".
constexpr const char* kLineEnd = "\r\n";

/// A header field quoted as Python's csv.QUOTE_MINIMAL does.
std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  return quoted + "\"";
}

/// A float as Python's repr() writes it, which is what Lightning's csv.DictWriter produces:
/// the shortest round-trip digits, with ".0" on integral values ("3.0") that fmt prints as "3".
std::string python_float(double value) {
  std::string text = fmt::format("{}", value);
  if (text.find_first_not_of("-0123456789") == std::string::npos) text += ".0";
  return text;
}

std::ofstream open_for_writing(const std::string& path, std::ios::openmode mode) {
  std::ofstream file(path, std::ios::binary | mode);
  VOLT_CHECK(file.is_open(),
             "cannot open '{}' for writing: {}. HINT: check that the log "
             "directory is writable.",
             path, std::strerror(errno));
  return file;
}

void check_written(const std::ofstream& file, const std::string& path) {
  VOLT_CHECK(!file.fail(), "cannot write '{}': {}. HINT: check free disk space.", path, std::strerror(errno));
}

}  // namespace

CSVLogger::CSVLogger(const LoggerOptions& options, int flush_logs_every_n_steps)
    : name_(options.name),
      log_dir_(resolve_log_dir(options)),
      append_(options.append),
      flush_logs_every_n_steps_(flush_logs_every_n_steps),
      console_(internal::logger_console(options, "CSVLogger")) {
  VOLT_CHECK(flush_logs_every_n_steps >= 1,
             "CSVLogger flush_logs_every_n_steps is {}; expected at least 1. HINT: use 1 to "
             "write every row at once.",
             flush_logs_every_n_steps);
}

CSVLogger::~CSVLogger() {
  try {
    save();
  } catch (const std::exception& e) {
    console_->warn(fmt::format("CSVLogger lost {} metric rows: {}", pending_.size(), e.what()));
  }
}

std::string CSVLogger::name() const { return name_; }

std::string CSVLogger::log_dir() const { return log_dir_; }

void CSVLogger::log_hyperparams(const nlohmann::json& params) {
  VOLT_CHECK(params.is_object(),
             "log_hyperparams got a JSON {}; expected an object of name: value pairs. HINT: wrap "
             "it, e.g. {{\"value\": ...}}.",
             params.type_name());
  hparams_.update(params);
  create_log_dir();
  save_hparams_to_yaml((fs::path(log_dir_) / kHparamsFileName).string(), hparams_);
}

void CSVLogger::log_metrics(const std::map<std::string, double>& metrics, int64_t step) {
  pending_.push_back(Row{step, metrics});
  if (pending_.size() >= static_cast<std::size_t>(flush_logs_every_n_steps_)) save();
}

void CSVLogger::save() {
  if (pending_.empty()) return;

  // Continuing an earlier run's file: its columns stay, in its order.
  if (header_.empty() && append_) header_ = read_existing_header(metrics_path());
  std::set<std::string> keys(header_.begin(), header_.end());
  keys.insert(kStepKey);
  for (const Row& row : pending_) {
    for (const auto& entry : row.values) keys.insert(entry.first);
  }
  const std::vector<std::string> header(keys.begin(), keys.end());  // std::set keeps them sorted

  const std::string path = metrics_path();
  const bool fresh_file = header_.empty();
  if (fresh_file) {
    create_log_dir();
  } else if (header != header_) {
    rewrite_with_header(header);
  }
  header_ = header;

  // A fresh file truncates whatever an earlier run left in a reused version folder.
  std::ofstream file = open_for_writing(path, fresh_file ? std::ios::trunc : std::ios::app);
  if (fresh_file) {
    std::vector<std::string> fields;
    for (const std::string& key : header_) fields.push_back(csv_field(key));
    file << join(fields, ",") << kLineEnd;
  }
  for (const Row& row : pending_) file << format_row(row);
  file.close();
  check_written(file, path);
  pending_.clear();
}

void CSVLogger::finalize(const std::string& status) { save(); }

std::vector<std::string> CSVLogger::read_existing_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string line;
  if (!in.is_open() || !std::getline(in, line)) return {};
  if (!line.empty() && line.back() == '\r') line.pop_back();
  // The header this logger wrote: fields separated by ',', quoted ("") when they hold one.
  std::vector<std::string> header(1);
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted && c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
      header.back() += '"';
      ++i;
    } else if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      header.emplace_back();
    } else {
      header.back() += c;
    }
  }
  VOLT_CHECK(
      std::is_sorted(header.begin(), header.end()) && std::find(header.begin(), header.end(), kStepKey) != header.end(),
      "cannot continue '{}': its header is not one CSVLogger wrote (sorted names with a 'step' column). "
      "HINT: move the file away, or set LoggerOptions::append=false to start it over.",
      path);
  return header;
}

std::string CSVLogger::metrics_path() const { return (fs::path(log_dir_) / kMetricsFileName).string(); }

void CSVLogger::create_log_dir() const {
  std::error_code ec;
  fs::create_directories(log_dir_, ec);
  VOLT_CHECK(!ec, "cannot create log directory '{}': {}. HINT: check that save_dir is writable.", log_dir_,
             ec.message());
}

std::string CSVLogger::format_row(const Row& row) const {
  std::string line;
  for (std::size_t i = 0; i < header_.size(); ++i) {
    if (i > 0) line += ',';
    if (header_[i] == kStepKey) {
      line += std::to_string(row.step);
      continue;
    }
    const auto it = row.values.find(header_[i]);
    if (it != row.values.end()) line += python_float(it->second);
  }
  return line + kLineEnd;
}

// Rows on disk hold only numbers and empty cells (never a comma), so they split at ','. The
// header is not parsed back: header_ already says what each column is.
void CSVLogger::rewrite_with_header(const std::vector<std::string>& header) const {
  const std::string path = metrics_path();
  std::ifstream in(path, std::ios::binary);
  VOLT_CHECK(in.is_open(),
             "cannot reopen '{}' to add new metric columns: {}. HINT: do not move "
             "or delete the log directory during a run.",
             path, std::strerror(errno));

  std::vector<std::size_t> new_column(header_.size());
  for (std::size_t i = 0; i < header_.size(); ++i) {
    new_column[i] =
        static_cast<std::size_t>(std::lower_bound(header.begin(), header.end(), header_[i]) - header.begin());
  }

  const std::string tmp_path = path + ".tmp";
  std::ofstream out = open_for_writing(tmp_path, std::ios::trunc);
  std::vector<std::string> fields;
  for (const std::string& key : header) fields.push_back(csv_field(key));
  out << join(fields, ",") << kLineEnd;

  std::string line;
  std::getline(in, line);  // the old header
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const std::vector<std::string> old_cells = split(line, ',');
    VOLT_CHECK(old_cells.size() == header_.size(),
               "'{}' has a row of {} cells under a header of {}; expected the file this logger "
               "wrote. HINT: do not edit metrics.csv during a run.",
               path, old_cells.size(), header_.size());
    std::vector<std::string> cells(header.size());
    for (std::size_t i = 0; i < old_cells.size(); ++i) cells[new_column[i]] = old_cells[i];
    out << join(cells, ",") << kLineEnd;
  }
  out.close();
  check_written(out, tmp_path);
  in.close();
  // Replace in one step so a crash mid-rewrite leaves the old file, not half a new one.
  std::error_code ec;
  fs::rename(tmp_path, path, ec);
  VOLT_CHECK(!ec,
             "cannot replace '{}' with '{}': {}. HINT: check the log directory's "
             "permissions.",
             path, tmp_path, ec.message());
}

}  // namespace volt
