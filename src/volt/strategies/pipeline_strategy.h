// strategy="pipeline": one process runs the module's volt::Pipe as a pipeline over its devices
// (CUDA devices, or stage threads on the CPU), each batch cut into micro-batches.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "volt/pipeline/pipe.h"
#include "volt/strategies/strategy.h"

namespace volt {

/// Enables the module's one volt::Pipe with PipeOptions at setup; the rest of the module runs as
/// under single_device. No gradient communication: every stage's parameters live in this process.
class PipelineStrategy : public Strategy {
 public:
  /// `topology` is the trivial one (a pipeline is one process); `options` are the Pipe's.
  PipelineStrategy(Topology topology, PipeOptions options);

  std::string name() const override { return "pipeline"; }
  const Topology& topology() const override { return topology_; }
  /// Finds the module's Pipe (exactly one) and enables it; throws volt::Error with a HINT when
  /// the module has none or several.
  void setup_module(LightningModule& module) override;
  void setup_optimizers(LightningModule& module,
                        const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) override;
  /// After the first backward (the pipeline exists by then): moves restored optimizer state onto
  /// the devices the stages' parameters moved to.
  void after_backward(bool synchronize) override;

 private:
  Topology topology_;
  PipeOptions options_;
  std::shared_ptr<PipeImpl> pipe_;
  std::vector<std::shared_ptr<torch::optim::Optimizer>> optimizers_;
  bool placed_state_ = false;
};

}  // namespace volt
