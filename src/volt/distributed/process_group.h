// The c10d process group of a run: TCPStore rendezvous, Gloo (CPU) or NCCL (CUDA builds), and
// the collectives the trainer needs, with bounded waits and named failures.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "volt/base/collectives.h"
#include "volt/base/reduce.h"
#include "volt/distributed/topology.h"

namespace c10d {
class ProcessGroup;
class Store;
}  // namespace c10d

namespace volt {

/// Options of the process group.
struct ProcessGroupOptions {
  /// "gloo" (CPU) or "nccl" (CUDA builds).
  std::string backend = "gloo";
  /// How long a collective may wait for a peer before failing (Gloo's timeout).
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
  /// How long rank 0 waits for every rank to join, and others wait to reach rank 0.
  std::chrono::milliseconds join_timeout{std::chrono::seconds(60)};
  /// Polled while waiting for ranks to join or to reach rank 0: a message ends the wait at once
  /// with an error that quotes it (a launched local rank that died, a stop signal).
  std::function<std::optional<std::string>()> abort_check;
};

/// A joined process group. Construction is the rendezvous: it returns once every rank joined,
/// or throws volt::Error naming the ranks that never did (and the host each was expected on).
/// While any group lives, SIGPIPE is ignored if the program left it at its default action (see
/// ignore_sigpipe in the source): a peer that dies then fails a collective with an error naming
/// it, instead of silently killing this process in Gloo's next write to it.
class ProcessGroup : public Collectives {
 public:
  /// Joins the group described by `topology`.
  ProcessGroup(const Topology& topology, const ProcessGroupOptions& options);
  ~ProcessGroup() override;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  /// This process's place.
  const Topology& topology() const { return topology_; }
  /// The c10d group (for the gradient reducer and user hooks).
  c10::intrusive_ptr<c10d::ProcessGroup> backend() const;

  /// Broadcasts `tensors` from `root` in place (coalesced into few messages).
  void broadcast(std::vector<torch::Tensor> tensors, int64_t root = 0);
  using Collectives::all_reduce;
  /// The number of ranks.
  int64_t world_size() const override { return topology_.world_size; }
  /// This process's global rank.
  int64_t rank() const override { return topology_.global_rank; }
  /// Reduces `values` element-wise across ranks with `op`, in place (one collective).
  void all_reduce(torch::Tensor& values, Reduce op) override;
  /// Every rank's `tensor` (first dimensions may differ): all_gather_uneven over c10d's allgather.
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor) override;
  /// Starts reducing one number across ranks with c10d's asynchronous all-reduce and returns at
  /// once; the handle's wait() is bounded by the collective timeout. Every rank must start the
  /// same reductions in the same order, like any collective.
  ReduceWork all_reduce_async(double value, Reduce op) override;
  /// Reduces the flat `values` (world_size() equal chunks) across ranks with `op` and returns this
  /// rank's chunk of the result: NCCL's reduce-scatter for CUDA tensors; on CPU, where Gloo lacks
  /// it, an all-reduce of the whole of `values` in place (twice the traffic, same numbers), whose
  /// chunk is returned as a view. `values` is scratch: its contents are undefined afterwards, so
  /// the caller needs no second buffer of its size. Throws volt::Error when numel is not a
  /// multiple of world_size().
  torch::Tensor reduce_scatter(torch::Tensor values, Reduce op);
  /// The concatenation of every rank's `chunk` (equal numels, same dtype), in rank order: one
  /// all-gather, with no shape exchange.
  torch::Tensor all_gather_flat(const torch::Tensor& chunk);
  /// all_gather_flat into `flat` (contiguous, world_size() x chunk.numel() values), so a caller
  /// that keeps its flat buffer (fsdp's parameters) gathers with no second copy. `chunk` may be
  /// this rank's slice of `flat` itself. Throws volt::Error when the sizes do not fit.
  void all_gather_into(const torch::Tensor& chunk, torch::Tensor& flat);
  /// Rank 0's `value` on every rank: two broadcasts through the group, not the store (which
  /// lives in rank 0, and rank 0 may exit as soon as its part is done).
  std::string broadcast_string(const std::string& value) override;
  /// A two-process Gloo group of its own with `peer` (which calls this with this rank at the same
  /// time), for a background thread; its calls are bounded by the collective timeout. Throws
  /// volt::Error naming the peer when it does not connect within that timeout.
  std::unique_ptr<PeerChannel> connect_peer(int64_t peer) override;

  /// Records the first failure of the run in the store (first writer wins), so other ranks can
  /// name it instead of reporting their own secondary errors.
  void report_failure(const std::string& message) noexcept;
  /// The first failure reported by any rank, if the store can still be reached.
  std::optional<std::string> reported_failure() noexcept;
  /// After a collective failed: the ranks that do not also call this with the same `tag` within
  /// `wait`. Each caller marks itself in the store and waits for the others, so when every rank
  /// still running calls it, the ranks returned are those that exited or are stuck elsewhere
  /// (for an error that names them). nullopt when the store, which rank 0 serves, cannot be
  /// reached at all: rank 0 is gone.
  std::optional<std::vector<int64_t>> absent_ranks(const std::string& tag, std::chrono::milliseconds wait) noexcept;

 private:
  // First, so it is taken before the rendezvous and given back after the sockets are closed.
  std::shared_ptr<const void> sigpipe_ignored_;
  Topology topology_;
  ProcessGroupOptions options_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  // connect_peer calls so far, by the other rank.
  std::map<int64_t, int64_t> peer_connections_;
};

}  // namespace volt
