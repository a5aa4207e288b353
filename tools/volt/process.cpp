#include "process.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "volt/core/error.h"

namespace volt::tool {
namespace {

std::vector<char*> c_argv(const std::vector<std::string>& argv) {
  std::vector<char*> out;
  for (const auto& arg : argv) out.push_back(const_cast<char*>(arg.c_str()));
  out.push_back(nullptr);
  return out;
}

[[noreturn]] void throw_cannot_run(const std::string& program, int error) {
  throw Error(fmt::format("cannot run '{}': {}. HINT: check that it is installed and on PATH (or give its full path).",
                          program, std::strerror(error)));
}

/// Reads `out_fd` and `err_fd` until both close, alternating with poll so neither pipe fills up
/// and blocks the child.
void drain(int out_fd, int err_fd, std::string& out, std::string& err) {
  std::array<pollfd, 2> fds{pollfd{out_fd, POLLIN, 0}, pollfd{err_fd, POLLIN, 0}};
  std::array<std::string*, 2> sinks{&out, &err};
  int open = 2;
  char buffer[4096];
  while (open > 0) {
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = read(fds[i].fd, buffer, sizeof(buffer));
      if (n > 0) {
        sinks[i]->append(buffer, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open;
      }
    }
  }
}

}  // namespace

ProcessResult run_process(const std::vector<std::string>& argv) {
  VOLT_INTERNAL_ASSERT(!argv.empty(), "run_process needs a program");
  int out_pipe[2], err_pipe[2], exec_pipe[2];
  VOLT_CHECK(pipe(out_pipe) == 0 && pipe(err_pipe) == 0 && pipe2(exec_pipe, O_CLOEXEC) == 0,
             "cannot create pipes to run '{}': {}. HINT: the process may be out of file descriptors; check ulimit -n.",
             argv[0], std::strerror(errno));
  const pid_t pid = fork();
  VOLT_CHECK(pid >= 0,
             "cannot start '{}': fork failed: {}. HINT: the host may be out of processes or memory; check ulimit -u "
             "and free memory.",
             argv[0], std::strerror(errno));
  if (pid == 0) {
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    close(out_pipe[0]);
    close(err_pipe[0]);
    close(exec_pipe[0]);
    auto args = c_argv(argv);
    execvp(args[0], args.data());
    // The parent learns why exec failed through the close-on-exec pipe.
    const int error = errno;
    if (write(exec_pipe[1], &error, sizeof(error)) < 0) _exit(127);
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  close(exec_pipe[1]);
  int exec_error = 0;
  const bool exec_failed = read(exec_pipe[0], &exec_error, sizeof(exec_error)) == sizeof(exec_error);
  close(exec_pipe[0]);
  ProcessResult result;
  drain(out_pipe[0], err_pipe[0], result.out, result.err);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (exec_failed) throw_cannot_run(argv[0], exec_error);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

void exec_process(const std::vector<std::string>& argv) {
  VOLT_INTERNAL_ASSERT(!argv.empty(), "exec_process needs a program");
  auto args = c_argv(argv);
  execvp(args[0], args.data());
  throw_cannot_run(argv[0], errno);
}

std::string self_executable(const std::string& fallback) {
  std::error_code error;
  const auto path = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) return path.string();
  return std::filesystem::absolute(fallback, error).string();
}

}  // namespace volt::tool
