// Test helper: the ranks of one real Gloo process group as threads of the test process (one
// TCPStore rendezvous on a free local port), so collectives and what is built on them are checked
// without launching processes. For the unit tests of distributed and strategies; not installed.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "volt/distributed/process_group.h"
#include "volt/distributed/subprocess_launcher.h"

namespace volt::testing {

/// Runs `body(group)` on `world` threads, each rank of one group; rethrows the first failure.
inline void on_ranks(int64_t world, const std::function<void(ProcessGroup&)>& body) {
  const int port = find_free_port();
  std::mutex mutex;
  std::exception_ptr failure;
  std::vector<std::thread> threads;
  for (int64_t rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        Topology topology;
        topology.world_size = world;
        topology.global_rank = rank;
        topology.local_rank = rank;
        topology.processes_per_node = world;
        topology.main_port = port;
        topology.host = "localhost";
        ProcessGroupOptions options;
        options.timeout = std::chrono::seconds(30);
        options.join_timeout = std::chrono::seconds(30);
        ProcessGroup group(topology, options);
        body(group);
        group.barrier();  // rank 0 serves the store: it leaves last
      } catch (...) {
        const std::lock_guard<std::mutex> lock(mutex);
        if (!failure) failure = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace volt::testing
