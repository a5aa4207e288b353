// Who is who in a distributed run: a pure value computed once from the plan.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace volt {

/// The ranks of this process and the shape of the job (processes laid out node by node).
struct Topology {
  int64_t world_size = 1;                  ///< processes in total
  int64_t global_rank = 0;                 ///< this process
  int64_t local_rank = 0;                  ///< this process on its node
  int64_t node_rank = 0;                   ///< this process's node
  int64_t num_nodes = 1;                   ///< nodes
  int64_t processes_per_node = 1;          ///< processes on each node
  std::string main_address = "127.0.0.1";  ///< rank 0's host, for the rendezvous
  int main_port = 0;                       ///< the rendezvous port
  /// True when the store at main_address:main_port is the launcher's (torchrun's agent store),
  /// which every rank joins as a client; false when rank 0 serves it.
  bool join_launcher_store = false;
  /// The prefix of Volt's keys in a launcher's store.
  std::string store_key_prefix;
  std::string host;                     ///< this process's host name (for messages)
  std::vector<std::string> node_hosts;  ///< host of each node, when the launcher says (SLURM)

  /// True for rank 0, which writes logs and checkpoints.
  bool is_global_zero() const { return global_rank == 0; }
  /// The node a rank runs on (ranks are contiguous per node, as srun and torchrun lay them out).
  int64_t node_of(int64_t rank) const { return rank / processes_per_node; }
  /// Where a rank should run, for messages: its node's host name when known, else "node N".
  std::string expected_host(int64_t rank) const {
    const auto node = static_cast<size_t>(node_of(rank));
    if (node < node_hosts.size()) return node_hosts[node];
    return "node " + std::to_string(node);
  }
};

}  // namespace volt
