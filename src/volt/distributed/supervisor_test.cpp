#include "volt/distributed/supervisor.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <fstream>
#include <iterator>

#include "volt/core/console.h"
#include "volt/core/error.h"
#include "volt/core/testing.h"

namespace volt {
namespace {

/// Two local ranks running `script` with /bin/sh; each appends "<rank>:<attempt>" to `log`.
SupervisorOptions two_ranks(const std::string& script, const std::string& log, int64_t max_restarts) {
  SupervisorOptions options;
  options.topology.world_size = 2;
  options.topology.processes_per_node = 2;
  options.topology.host = "testhost";
  options.executable = "/bin/sh";
  options.command = {"sh", "-c", "echo $LOCAL_RANK:$VOLT_RESTART_COUNT >> " + log + "; " + script};
  options.env = Env(Env::Vars{{"PATH", "/usr/bin:/bin"}});
  options.max_restarts = max_restarts;
  options.grace = std::chrono::milliseconds(2000);
  options.snapshot_dir = "/runs/x";
  return options;
}

std::vector<std::string> sorted_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::sort(lines.begin(), lines.end());
  return lines;
}

TEST(Supervisor, AKilledRankEndsItsGroupWhichStartsAgainAsTheNextAttempt) {
  const testing::TempDir dir;
  const std::string log = dir.file("attempts");
  // Attempt 0: rank 1 kills itself; rank 0 would wait for it for ever and is ended by the supervisor.
  const std::string script =
      "if [ $VOLT_RESTART_COUNT = 0 ]; then if [ $LOCAL_RANK = 1 ]; then kill -9 $$; else exec sleep 600; fi; fi";
  RecordingConsole console;
  const SupervisedRun run = supervise_workers(two_ranks(script, log, 2), console);
  EXPECT_EQ(run.restarts, 1);
  EXPECT_EQ(run.stopped_by, 0);
  EXPECT_EQ(sorted_lines(log), (std::vector<std::string>{"0:0", "0:1", "1:0", "1:1"}));
  ASSERT_EQ(console.warnings.size(), 1u);
  const std::string& warning = console.warnings[0];
  EXPECT_NE(warning.find("Restart 1 of 2: local rank 1 (pid"), std::string::npos) << warning;
  EXPECT_NE(warning.find("was killed by signal 9"), std::string::npos) << warning;
  EXPECT_NE(warning.find("on host testhost"), std::string::npos) << warning;
  EXPECT_NE(warning.find("Ending the other ranks"), std::string::npos) << warning;
  EXPECT_NE(warning.find("newest snapshot in /runs/x"), std::string::npos) << warning;
}

TEST(Supervisor, WithNoRestartLeftTheLastFailureIsNamed) {
  const testing::TempDir dir;
  const std::string log = dir.file("attempts");
  RecordingConsole console;
  const std::string error = testing::error_message<Error>(
      [&] { supervise_workers(two_ranks("[ $LOCAL_RANK = 0 ] || exit 3", log, 1), console); });
  EXPECT_NE(error.find("local rank 1 (pid"), std::string::npos) << error;
  EXPECT_NE(error.find("exited with code 3 on host testhost, and no restart is left (max_restarts=1)"),
            std::string::npos)
      << error;
  EXPECT_EQ(sorted_lines(log), (std::vector<std::string>{"0:0", "0:1", "1:0", "1:1"}));
  EXPECT_EQ(console.warnings.size(), 1u);
}

TEST(Supervisor, AStopRequestIsPassedOnAndEndsSupervising) {
  const testing::TempDir dir;
  const std::string log = dir.file("attempts");
  // Every rank waits until it is signalled; the request comes once both have started.
  SupervisorOptions options = two_ranks("exec sleep 600", log, 3);
  options.stop_requested = [&log] { return sorted_lines(log).size() == 2 ? SIGTERM : 0; };
  RecordingConsole console;
  const SupervisedRun run = supervise_workers(options, console);
  EXPECT_EQ(run.stopped_by, SIGTERM);
  EXPECT_EQ(run.restarts, 0);
  EXPECT_TRUE(console.warnings.empty());
}

}  // namespace
}  // namespace volt
