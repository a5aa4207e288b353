// How a run spreads over processes and devices.
//
// A strategy has a topology, a process group and a gradient synchronizer, and decides who
// writes files; the trainer's loops call it at a few points and know nothing else about
// distribution. SingleDeviceStrategy does nothing at those points; dp and ddp2 also run each
// training step themselves (training_step), over one replica of the module per device.
#pragma once

#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "volt/base/collectives.h"
#include "volt/data/dataset.h"
#include "volt/distributed/topology.h"
#include "volt/module/log_options.h"

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace volt {

class LightningModule;
class StateSharding;

/// The interface the trainer drives.
class Strategy {
 public:
  virtual ~Strategy() = default;
  /// "single_device", "ddp", "dp", "ddp2", "fsdp" or "pipeline".
  virtual std::string name() const = 0;
  /// This process's place.
  virtual const Topology& topology() const = 0;
  /// Starts or joins the other processes; idempotent (later stages reuse the group). The
  /// module's init_ddp_connection hook may supply the group.
  virtual void setup_environment(LightningModule& module) {}
  /// Makes every replica start equal and arms gradient synchronization for `module`.
  virtual void setup_module(LightningModule& module) {}
  /// After configure_optimizers and setup_module: fsdp replaces each optimizer's parameters by
  /// this process's pieces of them, so the optimizers' state covers only this process's shard.
  virtual void setup_optimizers(LightningModule& module,
                                const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) {}
  /// At each training epoch's start, after its hooks: ddp re-arms gradient synchronization when
  /// the parameters that train changed since setup_module (a callback unfroze a backbone), since
  /// c10d's Reducer covers only the parameters that trained when it was built. Every process must
  /// change the same parameters at the same epoch (hooks that depend on the epoch alone do).
  virtual void sync_trainable_parameters(LightningModule& module) {}
  /// Before each training forward pass (ddp broadcasts buffers such as BatchNorm statistics; fsdp's
  /// full_shard frees the units a checkpoint made whole).
  virtual void before_forward(LightningModule& module) {}
  /// Runs one training step and returns the loss to back-propagate. The default calls
  /// module.training_step on the whole batch and passes its loss through training_step_end;
  /// dp and ddp2 split the batch across their devices' replicas instead.
  virtual torch::Tensor training_step(LightningModule& module, const Batch& batch, int64_t batch_idx);
  /// Before backward; `synchronize` is false on steps that only accumulate gradients.
  virtual void before_backward(const torch::Tensor& loss, bool synchronize) {}
  /// After backward; `synchronize` as in before_backward. fsdp reduce-scatters the gradients here
  /// into the optimizers' pieces and frees the module's whole gradients.
  virtual void after_backward(bool synchronize) {}
  /// Seconds the latest synchronizing backward pass, through after_backward, waited for its
  /// gradients' synchronization with the other processes once its own computation was done
  /// (the profiler's gradient_sync_wait, the straggler report's wait). 0 where nothing
  /// synchronizes.
  virtual double gradient_sync_wait() const { return 0.0; }
  /// After the optimizers stepped (or skipped a step): fsdp all-gathers the updated pieces into
  /// the module's parameters, so every process holds the whole model again.
  virtual void after_optimizer_step() {}
  /// After the fit loop; `completed` is false when it threw. fsdp's full_shard makes the
  /// module's parameters whole again (a collective, only when completed) and detaches its hooks,
  /// so the module is whole for evaluation, saving or another fit.
  virtual void finish_fit(LightningModule& module, bool completed) {}
  /// The checkpoint side of a strategy that shards the optimizers' state and gradients over the
  /// processes (fsdp): clipping by norm then sums over every process, and a checkpoint needs the
  /// state gathered or each process's piece. nullptr (the default): each process holds it whole.
  virtual StateSharding* state_sharding() { return nullptr; }
  /// The collectives over this run's processes (reductions, the asynchronous stop vote,
  /// barriers, gathered bytes, rank 0's strings), for the loops, modules, metrics and layers;
  /// one process: the local ones, which change nothing. Valid after setup_environment.
  virtual Collectives& collectives() { return local_collectives(); }
  /// Records this process's failure for the others and returns the message to print: the
  /// first failure of the run (possibly another rank's), once.
  virtual std::string on_failure(const std::string& message) { return message; }
  /// Waits for the processes this one started (if any) to finish.
  virtual void teardown() {}

  /// True for the process that writes logs and checkpoints.
  bool is_global_zero() const { return topology().is_global_zero(); }
};

/// One process, one device: every hook is a no-op.
class SingleDeviceStrategy : public Strategy {
 public:
  /// `topology` is the trivial one (rank 0 of 1).
  explicit SingleDeviceStrategy(Topology topology = {}) : topology_(std::move(topology)) {}
  std::string name() const override { return "single_device"; }
  const Topology& topology() const override { return topology_; }

 private:
  Topology topology_;
};

}  // namespace volt
