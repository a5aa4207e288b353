#include "volt/loggers/logger.h"

#include <algorithm>
#include <filesystem>
#include <string_view>
#include <system_error>

#include "volt/core/error.h"
#include "volt/core/strings.h"

namespace volt {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kVersionPrefix = "version_";

/// N for a folder named `version_<N>` (digits only), or -1 for any other name.
long long version_number(const std::string& folder) {
  if (folder.compare(0, kVersionPrefix.size(), kVersionPrefix) != 0) return -1;
  const std::string_view digits = std::string_view(folder).substr(kVersionPrefix.size());
  const bool all_digits =
      !digits.empty() && std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!all_digits) return -1;
  // Too many digits to be a real version: ignore rather than overflow.
  if (digits.size() > 18) return -1;
  return std::stoll(std::string(digits));
}

long long next_version(const fs::path& versions_root) {
  std::error_code ec;
  if (!fs::is_directory(versions_root, ec)) return 0;
  long long largest = -1;
  for (const auto& entry : fs::directory_iterator(versions_root, ec)) {
    std::error_code entry_ec;  // an unreadable entry is skipped, not fatal
    if (!entry.is_directory(entry_ec)) continue;
    largest = std::max(largest, version_number(entry.path().filename().string()));
  }
  VOLT_CHECK(!ec, "cannot list logger directory '{}': {}. HINT: check that save_dir is readable.",
             versions_root.string(), ec.message());
  return largest + 1;
}

fs::path versions_root(const LoggerOptions& options) {
  fs::path root(options.save_dir);
  if (!options.name.empty()) root /= options.name;
  return root;
}

}  // namespace

std::vector<std::string> checkpoint_files(const std::string& path) {
  const fs::path file(path);
  const std::string name = file.filename().string();
  const fs::path folder = file.has_parent_path() ? file.parent_path() : fs::path(".");
  std::vector<std::pair<long long, std::string>> shards;
  std::error_code ec;
  for (auto it = fs::directory_iterator(folder, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string entry = it->path().filename().string();
    const std::optional<ShardFileName> shard = parse_shard_file_name(entry);
    if (shard && shard->checkpoint == name)
      shards.emplace_back(shard->rank, (file.has_parent_path() ? folder / entry : fs::path(entry)).string());
  }
  std::sort(shards.begin(), shards.end());
  std::vector<std::string> files{path};
  for (auto& [rank, shard] : shards) files.push_back(std::move(shard));
  return files;
}

std::string version_name(long long number) {
  VOLT_CHECK(number >= 0,
             "a logger version number is {}; expected 0 or more. HINT: use a "
             "string version for other folder names.",
             number);
  return fmt::format("{}{}", kVersionPrefix, number);
}

std::string resolve_version(const LoggerOptions& options) {
  VOLT_CHECK(!options.save_dir.empty(),
             "LoggerOptions.save_dir is empty; expected a directory. HINT: use \".\" for the "
             "working directory.");
  VOLT_CHECK(!options.version || !options.version->empty(),
             "LoggerOptions.version is an empty string; expected a folder name such as "
             "\"version_3\". HINT: leave version unset to take the next free version_<N>.");
  if (options.version) return *options.version;
  return version_name(next_version(versions_root(options)));
}

std::string resolve_log_dir(const LoggerOptions& options) {
  const std::string version = resolve_version(options);
  return (versions_root(options) / version).string();
}

namespace internal {

std::shared_ptr<Console> logger_console(const LoggerOptions& options, const char* logger) {
  VOLT_CHECK(options.console != nullptr,
             "{} got LoggerOptions::console = nullptr; expected a console for its warnings. HINT: leave it at its "
             "default (stdout and stderr), or pass volt::make_silent_console() to drop them.",
             logger);
  return options.console;
}

}  // namespace internal

}  // namespace volt
