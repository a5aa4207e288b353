// strategy="pipeline": a process runs the module's volt::Pipe as a pipeline over its devices
// (CUDA devices, or stage threads on the CPU), each batch cut into micro-batches; over several
// nodes, each node's process is one data-parallel replica of the whole pipeline.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "volt/pipeline/pipe.h"
#include "volt/strategies/ddp_strategy.h"
#include "volt/strategies/strategy.h"

namespace volt {

/// What both pipeline strategies do with the module's Pipe: find it (exactly one), enable it
/// with PipeOptions, and move restored optimizer state onto the stages' devices.
class PipeStages {
 public:
  /// `options` are the Pipe's (stages' devices, balance, chunks).
  explicit PipeStages(PipeOptions options) : options_(std::move(options)) {}
  /// Finds the module's Pipe and enables it; throws volt::Error with a HINT when the module has
  /// none or several.
  void setup_module(LightningModule& module);
  /// Remembers the optimizers whose state after_backward places.
  void setup_optimizers(const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers);
  /// After the first backward (the pipeline exists by then): moves restored optimizer state onto
  /// the devices the stages' parameters moved to.
  void after_backward();

 private:
  PipeOptions options_;
  std::shared_ptr<PipeImpl> pipe_;
  std::vector<std::shared_ptr<torch::optim::Optimizer>> optimizers_;
  bool placed_state_ = false;
};

/// Enables the module's one volt::Pipe at setup; the rest of the module runs as under
/// single_device. No gradient communication: every stage's parameters live in this process.
class PipelineStrategy : public Strategy {
 public:
  /// `topology` is the trivial one (a pipeline is one process); `options` are the Pipe's.
  PipelineStrategy(Topology topology, PipeOptions options);

  std::string name() const override { return "pipeline"; }
  const Topology& topology() const override { return topology_; }
  void setup_module(LightningModule& module) override { stages_.setup_module(module); }
  void setup_optimizers(LightningModule& module,
                        const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) override {
    stages_.setup_optimizers(optimizers);
  }
  void after_backward(bool synchronize) override { stages_.after_backward(); }

 private:
  Topology topology_;
  PipeStages stages_;
};

/// Pipeline x ddp (num_nodes > 1): one process per node runs the whole pipeline over the node's
/// devices, and the processes are ddp's replicas: rank 0's parameters and buffers are broadcast
/// at setup, the loaders are sharded by process, and after the backward that precedes a step
/// the gradients are averaged with one all-reduce per device (no c10d Reducer: the stages'
/// backward runs on their own threads, and all of it is done by then). Every replica must use
/// the same parameters in its loss, as under ddp without find_unused_parameters.
class PipelineDdpStrategy : public DdpStrategy {
 public:
  /// `topology` has one process per node; `ddp.launch_local_processes` is false.
  PipelineDdpStrategy(Topology topology, DdpOptions ddp, Env env, PipeOptions options);

  std::string name() const override { return "pipeline"; }
  void setup_module(LightningModule& module) override;
  void setup_optimizers(LightningModule& module,
                        const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) override {
    stages_.setup_optimizers(optimizers);
  }
  /// Nothing to re-arm: the gradients are averaged by after_backward, whichever train.
  void sync_trainable_parameters(LightningModule& module) override {}
  /// No Reducer to prepare.
  void before_backward(const torch::Tensor& loss, bool synchronize) override {
    if (synchronize) start_sync_clock(loss);
  }
  void after_backward(bool synchronize) override;

 private:
  PipeStages stages_;
  LightningModule* module_ = nullptr;
};

}  // namespace volt
