// Distributed data parallel: one model replica per process, gradients averaged by c10d.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "volt/core/env.h"
#include "volt/distributed/gradient_synchronizer.h"
#include "volt/distributed/process_group.h"
#include "volt/strategies/strategy.h"

namespace volt {

class SubprocessLauncher;

/// Options of DdpStrategy beyond the topology.
struct DdpOptions {
  /// How the process group is made and how long collectives may wait.
  ProcessGroupOptions process_group;
  /// Bucketing and unused-parameter detection.
  GradientSyncOptions gradient_sync;
  /// True when this process must start its node's other local ranks (Lightning's default
  /// launcher); false when srun/torchrun/mpirun started them.
  bool launch_local_processes = false;
  /// What DdpStrategy::name() says (ddp2 and pipeline name themselves). make_strategy sets "fsdp"
  /// for fsdp's sharding_strategy no_shard, which shards nothing and so is this strategy: the
  /// summary and the errors then name the strategy the user chose, and nothing else differs (its
  /// state_sharding() is nullptr and its checkpoints are ddp's), so a name is all it takes.
  std::string name = "ddp";
};

/// Lightning's `ddp`: parameters and buffers broadcast from rank 0, gradients all-reduced in
/// buckets during backward (c10d's Reducer), no communication on accumulation steps.
class DdpStrategy : public Strategy {
 public:
  /// `env` is passed to launched children (plus their rank variables).
  DdpStrategy(Topology topology, DdpOptions options, Env env);
  ~DdpStrategy() override;

  /// "ddp", or the name DdpOptions gives it.
  std::string name() const override { return options_.name; }
  const Topology& topology() const override { return topology_; }
  void setup_environment(LightningModule& module) override;
  void setup_module(LightningModule& module) override;
  void sync_trainable_parameters(LightningModule& module) override;
  void before_forward(LightningModule& module) override;
  void before_backward(const torch::Tensor& loss, bool synchronize) override;
  void after_backward(bool synchronize) override;
  double gradient_sync_wait() const override { return sync_wait_; }
  Collectives& collectives() override { return process_group(); }
  std::string on_failure(const std::string& message) override;
  void teardown() override;

  /// The joined group (after setup_environment).
  ProcessGroup& process_group();

 protected:
  /// The names of `module`'s parameters that require grad, after checking that every rank trains
  /// as many tensors and values (a collective: every rank calls it, every epoch). Throws
  /// volt::Error naming this rank when another trains a different set.
  std::vector<std::string> agreed_trainable_parameters(LightningModule& module);
  /// Checks that every rank holds a module of the same shape and broadcasts rank 0's parameters
  /// and buffers; remembers the buffers for before_forward.
  void broadcast_module(LightningModule& module);
  /// The options this strategy was made with.
  const DdpOptions& options() const { return options_; }
  /// Marks when the coming backward pass of `loss` finishes computing: an autograd final
  /// callback queued from a hook on `loss`, so it runs before c10d's Reducer waits for its last
  /// bucket (the Reducer queues its own later, at the first gradient).
  void start_sync_clock(const torch::Tensor& loss);
  /// The synchronization is done: gradient_sync_wait() becomes the time since the computation
  /// ended (0 when start_sync_clock's callback never ran).
  void stop_sync_clock();

 private:
  Topology topology_;
  DdpOptions options_;
  Env env_;
  std::unique_ptr<SubprocessLauncher> launcher_;
  std::shared_ptr<ProcessGroup> group_;
  /// `message` with the ranks named that did not fail in the same collective (a hung or vanished
  /// peer), when it is a communication failure; as given otherwise. Waits up to 3 s.
  std::string name_missing_ranks(const std::string& message);
  /// Builds the gradient synchronizer over `module`'s trainable parameters (its configure_ddp's
  /// or c10d's Reducer) and remembers their names.
  void arm_synchronizer(LightningModule& module);

  std::shared_ptr<GradientSynchronizer> synchronizer_;
  /// The names of the parameters synchronizer_ covers.
  std::vector<std::string> synchronized_;
  std::vector<torch::Tensor> buffers_;
  /// When the armed backward's computation ended (set by its final callback).
  std::shared_ptr<std::optional<std::chrono::steady_clock::time_point>> compute_done_;
  double sync_wait_ = 0;
};

}  // namespace volt
