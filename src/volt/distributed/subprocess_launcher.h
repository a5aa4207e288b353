// Starts the local processes of a ddp run by re-running this program (Lightning's default).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "volt/core/env.h"
#include "volt/distributed/topology.h"

namespace volt {

/// The variables a launched child reads (ClusterKind::kLocal): Lightning's names.
Env::Vars child_rank_variables(const Topology& topology, int64_t local_rank);

/// A TCP port that was free a moment ago on this host (bind to port 0, read it back).
int find_free_port();

/// The command line of this process, from /proc/self/cmdline.
std::vector<std::string> own_command_line();

/// How SubprocessLauncher starts its children.
struct LaunchOptions {
  /// The first local rank started: 1 when this process is local rank 0 (ddp), 0 when it only
  /// supervises (max_restarts).
  int64_t first_local_rank = 1;
  /// The program run: this one by default (/proc/self/exe, so a relative argv[0] or a PATH lookup
  /// cannot start another binary).
  std::string executable = "/proc/self/exe";
};

/// Local ranks of this node as child processes: 1..N-1 by default, this process being local
/// rank 0.
///
/// Children run the same program with the same arguments and the rank variables added, and die
/// with the launcher (PR_SET_PDEATHSIG). A monitor thread notices a child that exits non-zero
/// or is killed, so the launcher can stop in bounded time and name it. The destructor waits for
/// children that are still finishing, then terminates them.
class SubprocessLauncher {
 public:
  /// Starts the children; throws volt::Error when a process cannot be started.
  SubprocessLauncher(const Topology& topology, const std::vector<std::string>& command, const Env& env,
                     const LaunchOptions& options = {});
  ~SubprocessLauncher();
  SubprocessLauncher(const SubprocessLauncher&) = delete;
  SubprocessLauncher& operator=(const SubprocessLauncher&) = delete;

  /// The first child failure ("local rank 1 (pid 123) was killed by signal 9"), if any.
  std::optional<std::string> failure() const;
  /// The local rank of the first child that failed, if any.
  std::optional<int64_t> failed_local_rank() const;
  /// Sends `signal` to every child still running.
  void signal_all(int signal);
  /// Stops every child: SIGTERM (a clean stop at the next batch), then SIGKILL after `grace`.
  void terminate_all(std::chrono::milliseconds grace);
  /// Waits up to `timeout` for all children; true when all exited with code 0.
  bool wait(std::chrono::milliseconds timeout);

 private:
  void monitor();

  struct Child {
    int64_t local_rank;
    pid_t pid;
    bool running = true;
    int status = 0;
  };
  mutable std::mutex mutex_;
  std::vector<Child> children_;
  std::optional<std::string> failure_;
  std::optional<int64_t> failed_local_rank_;
  std::atomic<bool> stop_{false};
  std::thread monitor_;
};

}  // namespace volt
