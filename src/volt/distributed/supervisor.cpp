#include "volt/distributed/supervisor.h"

#include <fmt/format.h>

#include <optional>

#include "volt/core/console.h"
#include "volt/core/error.h"
#include "volt/distributed/subprocess_launcher.h"

namespace volt {

SupervisedRun supervise_workers(const SupervisorOptions& options, Console& console) {
  VOLT_CHECK(options.max_restarts >= 0, "max_restarts={} must be >= 0. HINT: use 0 for no restarts.",
             options.max_restarts);
  SupervisedRun run;
  for (int64_t attempt = 0;; ++attempt) {
    Topology topology = options.topology;
    if (topology.main_port == 0) topology.main_port = find_free_port();
    Env::Vars vars = options.env.vars();
    for (const auto& [key, value] : options.child_env) vars[key] = value;
    vars["VOLT_RESTART_COUNT"] = std::to_string(attempt);
    std::optional<std::string> failure;
    {
      SubprocessLauncher workers(topology, options.command, Env(vars),
                                 LaunchOptions{.first_local_rank = 0, .executable = options.executable});
      while (true) {
        // Polled: a worker's exit and a stop request both end the wait within 100 ms.
        if (workers.wait(std::chrono::milliseconds(100))) return run;
        if (const int signal = options.stop_requested ? options.stop_requested() : 0) {
          workers.signal_all(signal);
          if (!workers.wait(options.grace)) workers.terminate_all(options.grace);
          run.stopped_by = signal;
          return run;
        }
        failure = workers.failure();
        if (failure) break;
      }
      const std::string host = topology.host.empty() ? "localhost" : topology.host;
      if (attempt < options.max_restarts) {
        // Said as soon as it is noticed (within 100 ms of the failure), before the others end.
        console.warn(
            fmt::format("Restart {} of {}: {} on host {}. Ending the other ranks; the group starts again and resumes "
                        "from the newest snapshot in {}.",
                        attempt + 1, options.max_restarts, *failure, host, options.snapshot_dir));
      }
      // The others may be blocked in a collective with the failed one: end them now rather than
      // after the process group's timeout.
      workers.terminate_all(options.grace);
      VOLT_CHECK(attempt < options.max_restarts,
                 "{} on host {}, and no restart is left (max_restarts={}). HINT: see that rank's error above; the "
                 "newest snapshot in {} is where a new run of the same command resumes.",
                 *failure, host, options.max_restarts, options.snapshot_dir);
    }
    ++run.restarts;
  }
}

}  // namespace volt
