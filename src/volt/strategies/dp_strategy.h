// Lightning's `dp`: one process, each batch split across its devices (see DataParallel).
#pragma once

#include "volt/strategies/data_parallel.h"
#include "volt/strategies/strategy.h"

namespace volt {

/// One process drives every device of the node: the batch is scattered, a replica per device
/// runs training_step, the losses are gathered on the root and combined by training_step_end.
/// Nothing crosses processes, so every other hook is the single-device no-op.
class DpStrategy : public Strategy {
 public:
  /// `topology` is the trivial one (rank 0 of 1); `options.replicas` is the device count.
  DpStrategy(Topology topology, DataParallelOptions options)
      : topology_(std::move(topology)), parallel_(std::move(options)) {}
  std::string name() const override { return "dp"; }
  const Topology& topology() const override { return topology_; }
  torch::Tensor training_step(LightningModule& module, const Batch& batch, int64_t batch_idx) override {
    return parallel_.training_step(module, batch, batch_idx);
  }

 private:
  Topology topology_;
  DataParallel parallel_;
};

}  // namespace volt
