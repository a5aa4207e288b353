#include "volt/checkpoint/hpc_checkpoints.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "volt/core/strings.h"

namespace volt {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "hpc_ckpt_";
constexpr const char* kSuffix = ".ckpt";

/// (N, path) of every hpc_ckpt_<N>.ckpt, highest N first.
std::vector<std::pair<long long, std::string>> numbered(const std::string& dir) {
  std::vector<std::pair<long long, std::string>> found;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::string prefix = kPrefix, suffix = kSuffix;
    if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    // Temporary files of an interrupted save (hpc_ckpt_3.ckpt.tmp...) do not end in .ckpt.
    const auto n = parse_int(name.substr(prefix.size(), name.size() - prefix.size() - suffix.size()));
    if (n && *n >= 0) found.emplace_back(*n, it->path().string());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return found;
}

}  // namespace

std::vector<std::string> list_hpc_checkpoints(const std::string& dir) {
  std::vector<std::string> paths;
  for (auto& [n, path] : numbered(dir)) paths.push_back(std::move(path));
  return paths;
}

std::string next_hpc_checkpoint_path(const std::string& dir) {
  const auto found = numbered(dir);
  const long long next = found.empty() ? 1 : found.front().first + 1;
  return (fs::path(dir) / (kPrefix + std::to_string(next) + kSuffix)).string();
}

std::vector<std::string> hpc_checkpoints_to_prune(const std::string& dir, int64_t keep) {
  std::vector<std::string> all = list_hpc_checkpoints(dir);
  if (keep < 1) keep = 1;
  if (static_cast<int64_t>(all.size()) <= keep) return {};
  return std::vector<std::string>(all.begin() + keep, all.end());
}

}  // namespace volt
