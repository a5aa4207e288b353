// The collectives a module, a metric or a layer may call without knowing how the run is spread:
// one interface that the process group implements for ddp and LocalCollectives for one process,
// so that volt::metrics and volt::module sync state without linking volt::distributed.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "volt/base/reduce.h"

namespace volt {

/// The handle of a reduction started by Collectives::all_reduce_async, as c10d's Work is of a
/// collective: the caller goes on (a step's stop vote overlaps the next step) and wait() blocks
/// until the result is there, bounded by the group's timeout. Move-only.
class ReduceWork {
 public:
  /// A reduction that already ended with `value` (one process, or one run synchronously).
  explicit ReduceWork(double value);
  /// A reduction whose result `wait` blocks for and returns.
  explicit ReduceWork(std::function<double()> wait);
  ReduceWork(ReduceWork&&) = default;
  ReduceWork& operator=(ReduceWork&&) = default;
  ReduceWork(const ReduceWork&) = delete;
  ReduceWork& operator=(const ReduceWork&) = delete;
  /// The reduced value; throws what the collective threw (a peer that died, the timeout). A
  /// second call returns the same value without waiting again.
  double wait();

 private:
  std::function<double()> wait_;
  double value_ = 0.0;
};

/// A connection between two processes of a run, apart from its collectives, for a background
/// thread to carry bytes while the training thread runs collectives: the newest snapshot's copy
/// to a process on another node. Both ends must be used by one thread each, sends matched by
/// receives in order. Every call is bounded by the run's collective timeout.
class PeerChannel {
 public:
  virtual ~PeerChannel() = default;
  /// Sends `bytes` with `tag` (a number the receiver gets with them) and returns once they are
  /// on their way. Throws volt::Error naming the other process when it is gone or does not
  /// receive within the timeout.
  virtual void send(int64_t tag, const std::vector<char>& bytes) = 0;
  /// The next tag and bytes the other process sends. Throws volt::Error naming it when it is gone
  /// or sends nothing within the timeout.
  virtual std::pair<int64_t, std::vector<char>> receive() = 0;
};

/// Collectives over the processes of a run: the one surface that strategies, metrics, the
/// module's view of the run and the stop agreement use. Every process must call the same
/// collectives in the same order, as with any c10d collective; a peer that never arrives fails
/// the call after the process group's timeout (it never hangs). An implementation provides the
/// four pure calls; the others are built from them and may be overridden by faster ones.
class Collectives {
 public:
  virtual ~Collectives() = default;
  /// How many processes take part.
  virtual int64_t world_size() const = 0;
  /// This process's index among them.
  virtual int64_t rank() const = 0;
  /// Reduces `values` element-wise across processes, in place.
  virtual void all_reduce(torch::Tensor& values, Reduce op) = 0;
  /// Every process's `tensor`, indexed by rank. The first dimension may differ between
  /// processes (each rank's own length comes back, nothing padded); the other dimensions and the
  /// dtype must agree, or every process throws volt::Error naming each rank's shape.
  virtual std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor) = 0;

  /// Reduces one number across processes (a one-element all_reduce).
  virtual double all_reduce(double value, Reduce op);
  /// Starts reducing one number and returns its handle at once; here it runs synchronously, a
  /// process group overrides it with c10d's asynchronous all-reduce.
  virtual ReduceWork all_reduce_async(double value, Reduce op);
  /// Returns once every process called it (an all_reduce of one number: a CPU collective also
  /// where NCCL is the group's default backend, whose barrier has to guess a device).
  virtual void barrier();
  /// Every process's `bytes`, indexed by rank (an all_gather of them as bytes).
  virtual std::vector<std::string> all_gather_bytes(const std::string& bytes);
  /// Rank 0's `value` on every process (short strings: a checkpoint path, a log directory).
  virtual std::string broadcast_string(const std::string& value);
  /// A channel of its own to process `peer`, which calls this with this process's rank at the
  /// same time (the two connect; no other process takes part). nullptr when these collectives
  /// offer none (one process, or a test double).
  virtual std::unique_ptr<PeerChannel> connect_peer(int64_t peer);
};

/// One process: every reduction leaves its values as they are, a gather returns {tensor}.
class LocalCollectives : public Collectives {
 public:
  using Collectives::all_reduce;
  int64_t world_size() const override { return 1; }
  int64_t rank() const override { return 0; }
  void all_reduce(torch::Tensor& values, Reduce op) override {}
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor) override { return {tensor}; }
  double all_reduce(double value, Reduce op) override { return value; }
  void barrier() override {}
  std::vector<std::string> all_gather_bytes(const std::string& bytes) override { return {bytes}; }
};

/// The single-process Collectives, shared (it has no state).
Collectives& local_collectives();

/// Gathers tensors whose first dimension differs per rank from an all-gather of equal shapes,
/// which is all Gloo and NCCL offer: first each rank's shape and dtype (checked to agree beyond
/// the first dimension), then the tensors padded to the longest first dimension, cut back to
/// each rank's length. `gather_equal(t)` must return every rank's `t`, indexed by rank.
std::vector<torch::Tensor> all_gather_uneven(
    const torch::Tensor& tensor, const std::function<std::vector<torch::Tensor>(const torch::Tensor&)>& gather_equal);

}  // namespace volt
