// The collectives a module, a metric or a layer may call without knowing how the run is spread:
// one interface that the process group implements for ddp and LocalCollectives for one process,
// so that volt::metrics and volt::module sync state without linking volt::distributed.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "volt/base/reduce.h"

namespace volt {

/// Collectives over the processes of a run. Every process must call the same collectives in the
/// same order, as with any c10d collective; a peer that never arrives fails the call after the
/// process group's timeout (it never hangs).
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
};

/// One process: all_reduce leaves values as they are, all_gather returns {tensor}.
class LocalCollectives : public Collectives {
 public:
  int64_t world_size() const override { return 1; }
  int64_t rank() const override { return 0; }
  void all_reduce(torch::Tensor& values, Reduce op) override {}
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor) override { return {tensor}; }
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
