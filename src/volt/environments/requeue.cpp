#include "volt/environments/requeue.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <vector>

#include "volt/core/error.h"
#include "volt/core/strings.h"

extern char** environ;

namespace volt {

namespace {

struct NamedSignal {
  const char* name;
  int number;
};

// The signals a job may requeue on (volt::RequeueSignal) and the two that stop it.
constexpr std::array<NamedSignal, 8> kNamedSignals{{{"SIGUSR1", SIGUSR1},
                                                    {"SIGUSR2", SIGUSR2},
                                                    {"SIGHUP", SIGHUP},
                                                    {"SIGALRM", SIGALRM},
                                                    {"SIGQUIT", SIGQUIT},
                                                    {"SIGCONT", SIGCONT},
                                                    {"SIGTERM", SIGTERM},
                                                    {"SIGINT", SIGINT}}};

}  // namespace

std::string signal_name(int signal) {
  for (const auto& s : kNamedSignals)
    if (s.number == signal) return s.name;
  return "signal " + std::to_string(signal);
}

RequeuePolicy resolve_requeue_policy(const Env& env, bool auto_requeue, int signal, bool checkpoint_on_sigterm) {
  RequeuePolicy policy;
  policy.signal = signal;
  const std::string job_name = env.get_or("SLURM_JOB_NAME", "");
  if (!env.has("SLURM_JOB_ID")) {
    policy.disabled_reason = "not a SLURM job";
  } else if (job_name == "bash" || job_name == "interactive") {
    policy.disabled_reason = "interactive SLURM allocation";
  }
  if (!policy.disabled_reason.empty()) return policy;
  // SIGTERM is SLURM's preemption and cancel signal: a checkpoint lets a requeued job resume.
  policy.checkpoint_on_sigterm = checkpoint_on_sigterm;
  const std::string array_job = env.get_or("SLURM_ARRAY_JOB_ID", "");
  const std::string array_task = env.get_or("SLURM_ARRAY_TASK_ID", "");
  // scontrol requeue of the bare SLURM_JOB_ID of an array task works too, but the array form is
  // what squeue shows and what SLURM documents for one task of an array.
  policy.job_id =
      !array_job.empty() && !array_task.empty() ? array_job + "_" + array_task : env.get_or("SLURM_JOB_ID", "");
  if (!auto_requeue) {
    policy.disabled_reason = "auto_requeue=false";
    return policy;
  }
  policy.enabled = true;
  return policy;
}

RequeueOutcome requeue_slurm_job(const std::string& job_id, std::chrono::seconds timeout) {
  RequeueOutcome outcome;
  outcome.command = "scontrol requeue " + job_id;
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) {
    outcome.output = std::string("pipe failed: ") + std::strerror(errno);
    return outcome;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[1]);
  std::string program = "scontrol", verb = "requeue", id = job_id;
  std::vector<char*> argv{program.data(), verb.data(), id.data(), nullptr};
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, "scontrol", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  if (spawned != 0) {
    close(pipe_fds[0]);
    outcome.output = std::string("could not run scontrol: ") + std::strerror(spawned);
    return outcome;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buffer[512];
  bool timed_out = false;
  while (true) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd fd{pipe_fds[0], POLLIN, 0};
    const int ready = poll(&fd, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    const ssize_t n = read(pipe_fds[0], buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    outcome.output.append(buffer, static_cast<size_t>(n));
  }
  close(pipe_fds[0]);
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    outcome.output += fmt::format("(no answer within {} s; scontrol was killed)", timeout.count());
    return outcome;
  }
  outcome.ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  outcome.output = trim(outcome.output);
  return outcome;
}

}  // namespace volt
