// Lightning's `ddp2`: ddp across nodes, dp across each node's devices.
#pragma once

#include <memory>

#include "volt/strategies/data_parallel.h"
#include "volt/strategies/ddp_strategy.h"

namespace volt {

/// One process per node. Inside the node, DataParallel splits each batch across the node's
/// devices; across nodes, a DdpStrategy over the node-level topology (world size = nodes,
/// rank = node rank) broadcasts the start state and all-reduces the gradients that the node's
/// replicas accumulated. The node's loaders are sharded by node, so a node's batch is what its
/// devices share. Composed from the two strategies, so neither changes for the other.
class Ddp2Strategy : public Strategy {
 public:
  /// `node_topology` has one process per node; `ddp.launch_local_processes` must be false.
  Ddp2Strategy(Topology node_topology, DdpOptions ddp, DataParallelOptions dp, Env env);

  std::string name() const override { return "ddp2"; }
  const Topology& topology() const override { return ddp_.topology(); }
  void setup_environment(LightningModule& module) override { ddp_.setup_environment(module); }
  void setup_module(LightningModule& module) override { ddp_.setup_module(module); }
  void sync_trainable_parameters(LightningModule& module) override { ddp_.sync_trainable_parameters(module); }
  void before_forward(LightningModule& module) override { ddp_.before_forward(module); }
  torch::Tensor training_step(LightningModule& module, const Batch& batch, int64_t batch_idx) override {
    return parallel_.training_step(module, batch, batch_idx);
  }
  void before_backward(const torch::Tensor& loss, bool synchronize) override {
    ddp_.before_backward(loss, synchronize);
  }
  void after_backward(bool synchronize) override { ddp_.after_backward(synchronize); }
  double gradient_sync_wait() const override { return ddp_.gradient_sync_wait(); }
  Collectives& collectives() override { return ddp_.collectives(); }
  std::string on_failure(const std::string& message) override { return ddp_.on_failure(message); }
  void teardown() override { ddp_.teardown(); }

 private:
  DdpStrategy ddp_;
  DataParallel parallel_;
};

}  // namespace volt
