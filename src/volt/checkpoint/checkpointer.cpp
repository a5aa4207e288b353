#include "volt/checkpoint/checkpointer.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <set>

#include "volt/base/collectives.h"
#include "volt/checkpoint/dcp_checkpoint.h"
#include "volt/checkpoint/hpc_checkpoints.h"
#include "volt/checkpoint/sharded_checkpoint.h"
#include "volt/checkpoint/snapshot_memory.h"
#include "volt/core/console.h"
#include "volt/core/error.h"

namespace volt {

namespace fs = std::filesystem;

namespace {

/// The checkpoint a folder offers for "last", or "" (no recursion).
std::string last_in(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "";
  if (fs::is_regular_file(dir / "last.ckpt", ec)) return (dir / "last.ckpt").string();
  std::string newest_last, newest;
  fs::file_time_type newest_last_time, newest_time;
  for (const auto& entry : fs::directory_iterator(dir, fs::directory_options::skip_permission_denied, ec)) {
    if (!entry.is_regular_file(ec) || entry.path().extension() != ".ckpt") continue;
    const auto time = entry.last_write_time(ec);
    if (newest.empty() || time > newest_time) {
      newest = entry.path().string();
      newest_time = time;
    }
    if (entry.path().filename().string().find("last") == std::string::npos) continue;
    if (newest_last.empty() || time > newest_last_time) {
      newest_last = entry.path().string();
      newest_last_time = time;
    }
  }
  return newest_last.empty() ? newest : newest_last;
}

/// N of a folder named version_<N>, or nullopt.
std::optional<int64_t> version_number(const std::string& name) {
  const std::string prefix = "version_";
  if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size()) return std::nullopt;
  const std::string digits = name.substr(prefix.size());
  if (!std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c) != 0; })) {
    return std::nullopt;
  }
  return std::stoll(digits);
}

}  // namespace

std::string find_last_checkpoint(const LastCheckpointSearch& search) {
  if (!search.checkpoint_dir.empty()) return last_in(search.checkpoint_dir);
  const fs::path logs =
      search.logs_dir.empty() ? fs::path(search.root_dir) / "lightning_logs" : fs::path(search.logs_dir);
  if (!search.version.empty()) {
    if (std::string found = last_in(logs / search.version / "checkpoints"); !found.empty()) return found;
  }
  std::vector<std::pair<int64_t, fs::path>> versions;
  std::error_code ec;
  if (fs::is_directory(logs, ec)) {
    for (const auto& entry : fs::directory_iterator(logs, fs::directory_options::skip_permission_denied, ec)) {
      if (const auto n = version_number(entry.path().filename().string())) versions.emplace_back(*n, entry.path());
    }
  }
  std::sort(versions.begin(), versions.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [n, dir] : versions) {
    if (std::string found = last_in(dir / "checkpoints"); !found.empty()) return found;
  }
  return last_in(fs::path(search.root_dir) / "checkpoints");
}

Checkpointer::Checkpointer(std::shared_ptr<CheckpointIO> io) { set_io(std::move(io)); }

void Checkpointer::set_io(std::shared_ptr<CheckpointIO> io) {
  VOLT_CHECK(io != nullptr,
             "set_checkpoint_io got a null CheckpointIO. HINT: pass an object, e.g. "
             "std::make_shared<volt::TorchCheckpointIO>().");
  io_ = std::move(io);
}

void Checkpointer::save(const TrainingParts& parts, const FitProgress& progress, const std::string& path,
                        CheckpointContents contents) {
  io_->save(make_checkpoint(parts, progress, contents), path);
}

c10::IValue Checkpointer::load(const std::string& path) {
  if (is_dcp_checkpoint(path)) return dcp_training_checkpoint(DcpCheckpoint::open(path));
  return io_->load(path);
}

void Checkpointer::remove(const std::string& path) {
  // The checkpoint first: once it is gone its shards are never read, whatever happens next.
  if (io_->exists(path)) io_->remove(path);
  remove_shards(*io_, path, "");
}

void Checkpointer::remember(std::string best, std::string last) {
  best_ = std::move(best);
  last_ = std::move(last);
}

std::string Checkpointer::resolve(const std::string& requested, const LastCheckpointSearch& search,
                                  Console& console) const {
  if (requested.empty()) return "";
  if (requested == "best") {
    VOLT_CHECK(!best_.empty(),
               "ckpt_path=\"best\" but this Trainer has no best checkpoint yet. HINT: call fit() with a "
               "ModelCheckpoint first, or pass the checkpoint's path.");
    return best_;
  }
  if (requested == "last") {
    if (!last_.empty()) return last_;
    std::string found = find_last_checkpoint(search);
    if (found.empty()) {
      console.warn(fmt::format("ckpt_path=\"last\": no checkpoint in {}; starting from scratch.",
                               search.checkpoint_dir.empty() ? search.root_dir : search.checkpoint_dir));
    }
    return found;
  }
  VOLT_CHECK(io_->exists(requested) || is_dcp_checkpoint(requested),
             "ckpt_path='{}' does not exist. HINT: pass an existing .ckpt file, a folder dcp.save wrote, \"last\" or "
             "\"best\".",
             requested);
  return requested;
}

namespace {

/// Collective: the newest checkpoint any process reads in `dir` or its memory tier, numbers in
/// `refused` and up to `set_aside` left out, with its number; every process gets it (see
/// newest_resume_checkpoint).
std::optional<std::pair<int64_t, LoadedCheckpoint>> resume_agree_on_checkpoint(
    CheckpointIO& io, const std::string& dir, const std::string& memory_dir, const std::set<int64_t>& refused,
    int64_t set_aside, Collectives& collectives, Console& console) {
  struct Candidate {
    int64_t number;
    std::string path;
    bool in_memory;
  };
  std::vector<Candidate> candidates;
  for (const std::string& path : list_resume_checkpoints(dir))
    candidates.push_back({resume_checkpoint_number(path).value_or(0), path, false});
  if (!memory_dir.empty()) {
    for (const std::string& path : list_snapshots(memory_dir))
      candidates.push_back({resume_checkpoint_number(path).value_or(0), path, true});
  }
  std::erase_if(candidates, [&](const Candidate& c) { return c.number <= set_aside || refused.count(c.number) > 0; });
  // Newest first; of one number, an HPC checkpoint (saved after the snapshot it outnumbers), then
  // the memory tier's copy of a snapshot, then the snapshot's file.
  const auto order = [](const Candidate& c) { return !is_snapshot_path(c.path) ? 0 : c.in_memory ? 1 : 2; };
  std::stable_sort(candidates.begin(), candidates.end(), [&](const Candidate& a, const Candidate& b) {
    return a.number != b.number ? a.number > b.number : order(a) < order(b);
  });
  std::optional<LoadedCheckpoint> found;
  int64_t number = 0;
  bool found_in_memory = false;
  for (const Candidate& candidate : candidates) {
    // Saves are atomic, so a job killed while saving leaves at worst a temporary file; a file can
    // still be cut short by a full disk or a copy: fall back to the previous one.
    try {
      found = candidate.in_memory
                  ? LoadedCheckpoint{candidate.path, load_checkpoint_file(candidate.path), "node-local shared memory"}
                  : LoadedCheckpoint{candidate.path, io.load(candidate.path), ""};
      number = candidate.number;
      found_in_memory = candidate.in_memory;
      break;
    } catch (const std::exception& e) {
      console.warn(fmt::format("{} {} is unreadable; trying the previous one. ({})",
                               !is_snapshot_path(candidate.path) ? "HPC checkpoint"
                               : candidate.in_memory             ? "The memory tier's snapshot"
                                                                 : "Snapshot",
                               candidate.path, e.what()));
    }
  }
  if (collectives.world_size() == 1) {
    if (!found) return std::nullopt;
    return std::make_pair(number, std::move(*found));
  }
  // Every process must resume from the same step. One gather tells each what the others found (a
  // number, whether in memory, and its path); a process on a node whose shared memory lacks the
  // newest snapshot (its file cut short, or the folder not shared) then takes the copy of the
  // lowest rank that has it.
  const std::vector<std::string> all = collectives.all_gather_bytes(
      found ? fmt::format("{}\n{}\n{}", number, found_in_memory ? 1 : 0, found->path) : std::string("0\n0\n"));
  std::vector<int64_t> numbers;
  for (const std::string& entry : all) numbers.push_back(std::stoll(entry.substr(0, entry.find('\n'))));
  const int64_t newest = *std::max_element(numbers.begin(), numbers.end());
  if (newest == 0) return std::nullopt;
  if (std::all_of(numbers.begin(), numbers.end(), [&](int64_t n) { return n == newest; }))
    return std::make_pair(newest, std::move(*found));
  const auto sender = static_cast<size_t>(std::find(numbers.begin(), numbers.end(), newest) - numbers.begin());
  std::string bytes;
  if (static_cast<size_t>(collectives.rank()) == sender) {
    const std::vector<char> serialized = save_to_bytes(found->value);
    bytes.assign(serialized.begin(), serialized.end());
  }
  const std::vector<std::string> sent = collectives.all_gather_bytes(bytes);
  if (number == newest) return std::make_pair(newest, std::move(*found));
  const std::string& entry = all[sender];
  const size_t flag = entry.find('\n') + 1;
  std::string path = entry.substr(flag + 2);
  // A memory tier's folder has the same name on every node: read as this node's, where this
  // process's own shard of a sharded snapshot is to be found (or fetched to).
  if (entry[flag] == '1' && !memory_dir.empty()) path = (fs::path(memory_dir) / fs::path(path).filename()).string();
  const std::string& received = sent[sender];
  return std::make_pair(
      newest, LoadedCheckpoint{path, load_from_bytes(std::vector<char>(received.begin(), received.end()), path),
                               fmt::format("received from rank {}", sender)});
}

/// Collective, when some process lacks its shard of the sharded checkpoint `index` describes:
/// each process that lacks it receives it from the nearest following rank whose node's memory
/// tier `memory_dir` holds a copy (snapshot_peer_copy), and keeps it in its own node's tier.
/// Returns, on every process alike, whether every process has its shard now.
bool fetch_missing_shards(const ShardIndex& index, const std::string& path, const std::string& memory_dir, bool mine,
                          Collectives& collectives, Console& console) {
  const int64_t world = collectives.world_size();
  const int64_t me = collectives.rank();
  if (index.world_size != world) return false;
  // Entry r: how many ranks after r the nearest one is whose node's tier holds r's shard (world:
  // none); entry world + r: 0 when rank r lacks its shard. One reduction tells every process both.
  torch::Tensor said = torch::full({2 * world}, world, torch::kLong);
  for (int64_t r = 0; r < world && !memory_dir.empty(); ++r) {
    std::error_code ec;
    if (r != me && fs::exists(fs::path(memory_dir) / index.files[static_cast<size_t>(r)], ec))
      said[r] = (me - r + world) % world;
  }
  if (!mine) said[world + me] = 0;
  collectives.all_reduce(said, Reduce::kMin);
  std::vector<std::pair<int64_t, int64_t>> transfers;  // (from, to), in the same order on every process
  for (int64_t r = 0; r < world; ++r) {
    if (said[world + r].item<int64_t>() != 0) continue;
    const int64_t distance = said[r].item<int64_t>();
    if (distance == world) return false;  // no node holds it: the checkpoint is not whole
    transfers.emplace_back((r + distance) % world, r);
  }
  // Pairwise, each pair in the one order every process follows: the first transfer not done yet
  // always has both its ends ready, so none waits in a circle.
  bool received = true;
  for (const auto& [from, to] : transfers) {
    if (me != from && me != to) continue;
    const std::string& name = index.files[static_cast<size_t>(to)];
    try {
      std::unique_ptr<PeerChannel> channel = collectives.connect_peer(me == from ? to : from);
      if (!channel) throw Error("these collectives offer no channel between two processes");
      if (me == from) {
        channel->send(0, read_memory_file(memory_dir, name));
      } else {
        write_memory_file(memory_dir, name, channel->receive().second);
        console.info(fmt::format("Rank {}'s shard of {} came from the copy in rank {}'s node's memory.", me,
                                 fs::path(path).filename().string(), from));
      }
    } catch (const std::exception& e) {
      if (me == to) received = false;
      console.warn(fmt::format("Rank {} could not {} rank {}'s shard of {}: {}", me, me == from ? "send" : "receive",
                               to, path, e.what()));
    }
  }
  return collectives.all_reduce(received ? 1.0 : 0.0, Reduce::kMin) > 0.5;
}

}  // namespace

std::optional<LoadedCheckpoint> Checkpointer::newest_resume_checkpoint(const std::string& dir,
                                                                       const std::string& memory_dir,
                                                                       Collectives& collectives, Console& console,
                                                                       int64_t set_aside) const {
  // Numbers of sharded checkpoints some process cannot read its shard of: passed over.
  std::set<int64_t> refused;
  while (true) {
    std::optional<std::pair<int64_t, LoadedCheckpoint>> chosen =
        resume_agree_on_checkpoint(*io_, dir, memory_dir, refused, set_aside, collectives, console);
    if (!chosen) return std::nullopt;
    // A sharded checkpoint is whole only with every process's shard: each looks for its own. (Every
    // process holds the same number, so all know alike whether it is sharded.)
    const std::optional<ShardIndex> index = read_shard_index(chosen->second.value, chosen->second.path);
    const int64_t rank = collectives.rank();
    // A checkpoint of another number of processes is refused by name when it is restored.
    if (!index || rank >= index->world_size) return std::move(chosen->second);
    const bool mine = locate_shard(*io_, chosen->second.path, *index, rank, {dir, memory_dir}).has_value();
    bool all = collectives.world_size() == 1 || collectives.all_reduce(mine ? 1.0 : 0.0, Reduce::kMin) > 0.5;
    // A node that lost its memory (or a new node in its place) gets its processes' shards from the
    // copies on the next node.
    if (!all && collectives.world_size() > 1)
      all = fetch_missing_shards(*index, chosen->second.path, memory_dir, mine, collectives, console);
    if (all) return std::move(chosen->second);
    if (!mine) {
      console.warn(fmt::format("{} lacks rank {}'s shard in this node's memory and in {}; trying the one before it.",
                               chosen->second.path, collectives.rank(), dir));
    }
    refused.insert(chosen->first);
  }
}

std::string Checkpointer::save_hpc_checkpoint(const TrainingParts& parts, const FitProgress& progress,
                                              const std::string& dir, int64_t keep) {
  fs::create_directories(dir);
  const std::string path = next_hpc_checkpoint_path(dir);
  save(parts, progress, path);
  prune_hpc_checkpoints(dir, keep);
  return path;
}

void Checkpointer::prune_hpc_checkpoints(const std::string& dir, int64_t keep) {
  for (const std::string& old : hpc_checkpoints_to_prune(dir, keep)) remove(old);
}

}  // namespace volt
