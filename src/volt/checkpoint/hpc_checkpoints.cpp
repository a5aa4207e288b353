#include "volt/checkpoint/hpc_checkpoints.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string_view>
#include <utility>

#include "volt/checkpoint/checkpoint_io.h"
#include "volt/core/error.h"
#include "volt/core/strings.h"

namespace volt {

namespace fs = std::filesystem;

namespace {

constexpr const char* kHpcPrefix = "hpc_ckpt_";
constexpr const char* kSnapshotPrefix = "snapshot_";
constexpr const char* kSuffix = ".ckpt";

/// N when `name` is <prefix><N>.ckpt, else -1.
long long number_of(const std::string& name, const std::string& prefix) {
  const std::string suffix = kSuffix;
  if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return -1;
  }
  // Temporary files of an interrupted save (hpc_ckpt_3.ckpt.tmp...) do not end in .ckpt.
  const auto n = parse_int(name.substr(prefix.size(), name.size() - prefix.size() - suffix.size()));
  return n && *n >= 0 ? *n : -1;
}

/// (N, path) of every file in `dir` named <prefix><N>.ckpt for one of `prefixes`, highest N first.
std::vector<std::pair<long long, std::string>> numbered(const std::string& dir,
                                                        const std::vector<std::string>& prefixes) {
  std::vector<std::pair<long long, std::string>> found;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    for (const std::string& prefix : prefixes) {
      const long long n = number_of(name, prefix);
      if (n >= 0) found.emplace_back(n, it->path().string());
    }
  }
  // Equal numbers (an HPC checkpoint and a snapshot both N, written by hand): the HPC one first.
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    if (a.first != b.first) return a.first > b.first;
    return is_snapshot_path(b.second) && !is_snapshot_path(a.second);
  });
  return found;
}

std::vector<std::string> paths_of(std::vector<std::pair<long long, std::string>> found) {
  std::vector<std::string> paths;
  for (auto& [n, path] : found) paths.push_back(std::move(path));
  return paths;
}

std::vector<std::string> beyond(std::vector<std::string> all, int64_t keep) {
  if (keep < 1) keep = 1;
  if (static_cast<int64_t>(all.size()) <= keep) return {};
  return std::vector<std::string>(all.begin() + keep, all.end());
}

}  // namespace

std::vector<std::string> list_hpc_checkpoints(const std::string& dir) { return paths_of(numbered(dir, {kHpcPrefix})); }

std::vector<std::string> list_snapshots(const std::string& dir) { return paths_of(numbered(dir, {kSnapshotPrefix})); }

std::vector<std::string> list_resume_checkpoints(const std::string& dir) {
  return paths_of(numbered(dir, {kHpcPrefix, kSnapshotPrefix}));
}

bool is_snapshot_path(const std::string& path) {
  return number_of(fs::path(path).filename().string(), kSnapshotPrefix) >= 0;
}

std::optional<int64_t> resume_checkpoint_number(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  for (const char* prefix : {kHpcPrefix, kSnapshotPrefix}) {
    if (const long long n = number_of(name, prefix); n >= 0) return n;
  }
  return std::nullopt;
}

int64_t next_resume_checkpoint_number(const std::string& dir) {
  const auto found = numbered(dir, {kHpcPrefix, kSnapshotPrefix});
  const int64_t newest = found.empty() ? 0 : found.front().first;
  const std::optional<RunBoundary> boundary = read_run_boundary(dir);
  return std::max(newest, boundary ? boundary->number : 0) + 1;
}

std::string next_hpc_checkpoint_path(const std::string& dir) {
  return (fs::path(dir) / (kHpcPrefix + std::to_string(next_resume_checkpoint_number(dir)) + kSuffix)).string();
}

std::string snapshot_path(const std::string& dir, int64_t n) {
  return (fs::path(dir) / (kSnapshotPrefix + std::to_string(n) + kSuffix)).string();
}

std::vector<std::string> hpc_checkpoints_to_prune(const std::string& dir, int64_t keep) {
  return beyond(list_hpc_checkpoints(dir), keep);
}

std::vector<std::string> snapshots_to_prune(const std::string& dir, int64_t keep) {
  return beyond(list_snapshots(dir), keep);
}

std::pair<std::vector<std::string>, int64_t> remove_interrupted_writes(const std::string& dir) {
  constexpr std::string_view kTmp = ".tmp.";
  const auto digits = [](std::string_view text) {
    return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  // A shard's temporary file counts as its checkpoint's.
  const auto checkpoint_of = [](const std::string& name) {
    const std::optional<ShardFileName> shard = parse_shard_file_name(name);
    return shard ? shard->checkpoint : name;
  };
  std::vector<fs::path> left;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const size_t tmp = name.rfind(kTmp);
    if (tmp == std::string::npos || !digits(std::string_view(name).substr(tmp + kTmp.size()))) continue;
    if (resume_checkpoint_number(checkpoint_of(name.substr(0, tmp)))) left.push_back(it->path());
  }
  std::sort(left.begin(), left.end());
  std::vector<std::string> removed;
  int64_t bytes = 0;
  for (const fs::path& path : left) {
    std::error_code size_ec;
    const auto size = fs::file_size(path, size_ec);
    if (std::error_code remove_ec; fs::remove(path, remove_ec)) {
      removed.push_back(path.string());
      if (!size_ec) bytes += static_cast<int64_t>(size);
    }
  }
  return {removed, bytes};
}

std::string progress_marker_path(const std::string& dir) { return (fs::path(dir) / "volt-progress").string(); }

namespace {

/// The marker's first line: the step, fixed width, so a rewrite replaces the whole line and a
/// reader never sees two steps mixed.
std::string marker_step_line(int64_t step) { return fmt::format("{:020d}\n", step); }

constexpr size_t kTokenLength = 16;

/// A new run's token line.
std::string new_token_line() {
  std::random_device random;
  const uint64_t token = (static_cast<uint64_t>(random()) << 32) ^ random();
  return fmt::format("{:016x}\n", token);
}

/// The third line (after the step's 21 bytes and the token's 17), fixed width too: the boundary.
constexpr off_t kBoundaryOffset = 21 + kTokenLength + 1;
constexpr const char* kFinishedWord = "finished";
constexpr const char* kEarlierWord = "earlier";
std::string boundary_line(const RunBoundary& boundary) {
  return fmt::format("{:<8} {:020d}\n", boundary.finished ? kFinishedWord : kEarlierWord, boundary.number);
}

}  // namespace

ProgressMarker::ProgressMarker(const std::string& path) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  const bool had_token = read_progress_marker_token(path).has_value();
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw CheckpointError(
        fmt::format("cannot open the progress marker {}: {}. HINT: check that the folder (the "
                    "hpc_checkpoint_dir) is writable.",
                    path, std::strerror(errno)));
  }
  if (!had_token) {
    // A new run in this folder (or a marker from before tokens): a token no earlier run had.
    const std::string lines = marker_step_line(0) + new_token_line();
    [[maybe_unused]] const ssize_t written = ::pwrite(fd_, lines.data(), lines.size(), 0);
  }
}

ProgressMarker::~ProgressMarker() {
  if (fd_ >= 0) ::close(fd_);
}

void ProgressMarker::record(int64_t step) {
  const std::string line = marker_step_line(step);
  // A marker that cannot be written costs the restart's message, never the run.
  [[maybe_unused]] const ssize_t written = ::pwrite(fd_, line.data(), line.size(), 0);
}

std::optional<int64_t> read_progress_marker(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line)) return std::nullopt;
  const auto step = parse_int(line);
  if (!step || *step < 0) return std::nullopt;
  return *step;
}

std::optional<RunBoundary> read_run_boundary(const std::string& dir) {
  std::ifstream in(progress_marker_path(dir));
  std::string step, token, line;
  if (!std::getline(in, step) || !std::getline(in, token) || !std::getline(in, line)) return std::nullopt;
  const size_t space = line.find(' ');
  if (space == std::string::npos) return std::nullopt;
  const std::string word = line.substr(0, space);
  const auto number = parse_int(trim(line.substr(space + 1)));
  if (!number || *number < 0 || (word != kFinishedWord && word != kEarlierWord)) return std::nullopt;
  return RunBoundary{.number = *number, .finished = word == kFinishedWord};
}

int64_t resume_numbers_set_aside(const std::optional<RunBoundary>& boundary, int64_t restart_attempt) {
  if (!boundary || (boundary->finished && restart_attempt > 0)) return 0;
  return boundary->number;
}

int64_t mark_run_finished(const std::string& dir) {
  const int64_t number = next_resume_checkpoint_number(dir) - 1;
  if (number == 0) return 0;
  const std::string path = progress_marker_path(dir);
  { ProgressMarker marker(path); }  // the token, if the run had no marker (HPC checkpoints only)
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    throw CheckpointError(
        fmt::format("cannot record in {} that the run finished: {}. HINT: check that the folder (the "
                    "hpc_checkpoint_dir) is writable.",
                    path, std::strerror(errno)));
  }
  const std::string line = boundary_line({.number = number, .finished = true});
  const bool written = ::pwrite(fd, line.data(), line.size(), kBoundaryOffset) == static_cast<ssize_t>(line.size());
  // Durable: a node lost right after the fit must not leave a fresh launch resuming from these.
  const bool synced = written && ::fsync(fd) == 0;
  const int error = errno;
  ::close(fd);
  if (!synced) {
    throw CheckpointError(
        fmt::format("cannot record in {} that the run finished: {}. HINT: check the file system's "
                    "free space.",
                    path, std::strerror(error)));
  }
  return number;
}

void set_aside_finished_run(const std::string& dir, int64_t number) {
  const std::string path = progress_marker_path(dir);
  const std::string lines =
      marker_step_line(0) + new_token_line() + boundary_line({.number = number, .finished = false});
  write_file_atomically(path, [&lines](const ByteSink& sink) { sink(lines.data(), lines.size()); });
}

std::optional<std::string> read_progress_marker_token(const std::string& path) {
  std::ifstream in(path);
  std::string step, token;
  if (!std::getline(in, step) || !std::getline(in, token) || token.size() != kTokenLength) return std::nullopt;
  if (!std::all_of(token.begin(), token.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); }))
    return std::nullopt;
  return token;
}

}  // namespace volt
