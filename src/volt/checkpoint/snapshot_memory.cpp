#include "volt/checkpoint/snapshot_memory.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>

#include "volt/checkpoint/checkpoint_io.h"
#include "volt/checkpoint/hpc_checkpoints.h"
#include "volt/checkpoint/sharded_checkpoint.h"
#include "volt/core/error.h"

namespace volt {

namespace fs = std::filesystem;

namespace {

/// `volt-snapshots-<uid>-<FNV-1a of the absolute hpc_dir>-`: every memory tier of one folder's runs.
std::string tier_prefix(const std::string& hpc_dir) {
  const std::string dir = fs::absolute(hpc_dir).lexically_normal().string();
  uint64_t hash = 14695981039346656037ULL;
  for (const char c : dir) hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  return fmt::format("volt-snapshots-{}-{:016x}-", static_cast<unsigned long>(::getuid()), hash);
}

}  // namespace

std::string memory_snapshot_dir(const std::string& root, const std::string& hpc_dir) {
  const std::optional<std::string> token = read_progress_marker_token(progress_marker_path(hpc_dir));
  if (!token) return "";
  return (fs::path(root) / (tier_prefix(hpc_dir) + *token)).string();
}

void write_memory_file(const std::string& dir, const std::string& name, const std::vector<char>& bytes) {
  const std::string path = (fs::path(dir) / name).string();
  try {
    write_file_atomically(path, [&bytes](const ByteSink& sink) { sink(bytes.data(), bytes.size()); });
  } catch (const CheckpointError& e) {
    throw CheckpointError(fmt::format(
        "cannot keep {} in shared memory ({} bytes): {} HINT: make room in {} (df -h {}), point "
        "VOLT_SNAPSHOT_MEMORY_DIR at another tmpfs, or set snapshot_in_memory=false (--no-snapshot-in-memory).",
        path, bytes.size(), e.what(), fs::path(dir).parent_path().string(), fs::path(dir).parent_path().string()));
  }
}

void write_memory_snapshot(const std::string& dir, int64_t n, const std::vector<char>& bytes) {
  write_memory_file(dir, fs::path(snapshot_path(dir, n)).filename().string(), bytes);
  for (const std::string& old : snapshots_to_prune(dir, 1)) {
    std::error_code ec;
    fs::remove(old, ec);
  }
}

std::string pending_memory_index_name(int64_t n) {
  return fs::path(snapshot_path("", n)).filename().string() + ".pending";
}

void prune_memory_shards(const std::string& dir, const std::vector<int64_t>& ranks, int64_t n,
                         const std::string& save_id, bool owns_index) {
  std::vector<std::pair<std::string, std::string>> kept;  // (suffix of a rank's shards, its shard of save_id)
  for (const int64_t rank : ranks) {
    kept.emplace_back(fmt::format(".shard{}", rank),
                      fs::path(shard_path(snapshot_path(dir, n), save_id, rank)).filename().string());
  }
  const auto ends_with = [](const std::string& name, const std::string& suffix) {
    return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const bool stale_shard = std::any_of(
        kept.begin(), kept.end(), [&](const auto& rank) { return ends_with(name, rank.first) && name != rank.second; });
    const std::optional<int64_t> number = resume_checkpoint_number(it->path().string());
    const bool older_index = number && *number < n;
    if (stale_shard || (owns_index && (ends_with(name, ".pending") || older_index))) {
      std::error_code ignored;
      fs::remove(it->path(), ignored);
    }
  }
}

std::vector<char> read_memory_file(const std::string& dir, const std::string& name) {
  const std::string path = (fs::path(dir) / name).string();
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes;
  if (in.is_open()) bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (!in.is_open() || in.bad()) {
    throw CheckpointError(fmt::format(
        "cannot read {} in shared memory. HINT: something removed it while the run read it; the resume falls back "
        "to an older checkpoint.",
        path));
  }
  return bytes;
}

int64_t newest_memory_snapshot_number(const std::string& dir) {
  for (const std::string& path : list_snapshots(dir)) {
    if (const std::optional<int64_t> n = resume_checkpoint_number(path)) return *n;
  }
  return 0;
}

void remove_stale_memory_snapshots(const std::string& root, const std::string& hpc_dir, const std::string& keep) {
  const std::string prefix = tier_prefix(hpc_dir);
  const fs::path kept = fs::path(keep).lexically_normal();
  std::error_code ec;
  for (auto it = fs::directory_iterator(root, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    if (it->path().filename().string().rfind(prefix, 0) != 0 || it->path().lexically_normal() == kept) continue;
    std::error_code ignored;
    fs::remove_all(it->path(), ignored);
  }
}

void remove_memory_snapshots(const std::string& dir) {
  if (dir.empty()) return;
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace volt
