#include "volt/distributed/subprocess_launcher.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "volt/core/error.h"

namespace volt {

namespace {

std::string describe_exit(int64_t local_rank, pid_t pid, int status) {
  if (WIFSIGNALED(status)) {
    return fmt::format("local rank {} (pid {}) was killed by signal {} ({})", local_rank, pid, WTERMSIG(status),
                       strsignal(WTERMSIG(status)));
  }
  return fmt::format("local rank {} (pid {}) exited with code {}", local_rank, pid, WEXITSTATUS(status));
}

}  // namespace

Env::Vars child_rank_variables(const Topology& topology, int64_t local_rank) {
  return {{"LOCAL_RANK", std::to_string(local_rank)},
          {"NODE_RANK", std::to_string(topology.node_rank)},
          {"GLOBAL_RANK", std::to_string(topology.node_rank * topology.processes_per_node + local_rank)},
          {"WORLD_SIZE", std::to_string(topology.world_size)},
          {"LOCAL_WORLD_SIZE", std::to_string(topology.processes_per_node)},
          {"MASTER_ADDR", topology.main_address},
          {"MASTER_PORT", std::to_string(topology.main_port)}};
}

int find_free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  VOLT_CHECK(fd >= 0,
             "could not open a socket to find a free port: {}. HINT: set MASTER_PORT to a free port so that none is "
             "searched for.",
             std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  close(fd);
  VOLT_CHECK(ok, "could not find a free TCP port on this host. HINT: set MASTER_PORT.");
  return ntohs(address.sin_port);
}

std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  std::string current;
  for (char c : all) {
    if (c == '\0') {
      args.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  return args;
}

SubprocessLauncher::SubprocessLauncher(const Topology& topology, const std::vector<std::string>& command,
                                       const Env& env, const LaunchOptions& options) {
  VOLT_CHECK(!command.empty(),
             "cannot relaunch this program: its command line is empty. HINT: run on Linux with /proc mounted, or start "
             "one process per device yourself (torchrun or srun).");
  const std::string& executable = options.executable;
  const pid_t parent = getpid();
  for (int64_t local_rank = options.first_local_rank; local_rank < topology.processes_per_node; ++local_rank) {
    Env::Vars vars = env.vars();
    for (auto& [key, value] : child_rank_variables(topology, local_rank)) vars[key] = value;
    std::vector<std::string> env_strings;
    for (const auto& [key, value] : vars) env_strings.push_back(key + "=" + value);
    std::vector<char*> argv;
    for (const auto& arg : command) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    const pid_t pid = fork();
    VOLT_CHECK(pid >= 0,
               "could not start local rank {}: fork failed: {}. HINT: the host may be out of processes or memory; "
               "check ulimit -u and free memory.",
               local_rank, std::strerror(errno));
    if (pid == 0) {
      // Child: die with the launcher, whatever killed it.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      execve(executable.c_str(), argv.data(), envp.data());
      _exit(127);
    }
    children_.push_back({local_rank, pid});
  }
  monitor_ = std::thread([this] { monitor(); });
}

SubprocessLauncher::~SubprocessLauncher() {
  if (!wait(std::chrono::seconds(30))) terminate_all(std::chrono::seconds(5));
  stop_ = true;
  if (monitor_.joinable()) monitor_.join();
}

void SubprocessLauncher::monitor() {
  while (!stop_) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& child : children_) {
        if (!child.running) continue;
        int status = 0;
        if (waitpid(child.pid, &status, WNOHANG) == child.pid) {
          child.running = false;
          child.status = status;
          const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
          if (failed && !failure_) {
            failure_ = describe_exit(child.local_rank, child.pid, status);
            failed_local_rank_ = child.local_rank;
          }
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::optional<std::string> SubprocessLauncher::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

std::optional<int64_t> SubprocessLauncher::failed_local_rank() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failed_local_rank_;
}

void SubprocessLauncher::signal_all(int signal) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& child : children_)
    if (child.running) kill(child.pid, signal);
}

void SubprocessLauncher::terminate_all(std::chrono::milliseconds grace) {
  signal_all(SIGTERM);
  if (!wait(grace)) signal_all(SIGKILL);
  wait(std::chrono::seconds(5));
}

bool SubprocessLauncher::wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const bool any_running =
          std::any_of(children_.begin(), children_.end(), [](const Child& c) { return c.running; });
      if (!any_running) return !failure_.has_value();
    }
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace volt
