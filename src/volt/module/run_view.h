// What a module can see of the run it is part of: Lightning's self.current_epoch,
// self.global_rank, self.device, self.all_gather... The Trainer installs a RunView while a stage
// runs; the module reads it and never holds the Trainer.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace volt {

class Collectives;
struct Topology;

/// A read-only view of the running stage, with the run's collectives.
class RunView {
 public:
  virtual ~RunView() = default;
  /// The epoch being trained (0-based); after fit, the epoch fit reached.
  virtual int64_t current_epoch() const = 0;
  /// Optimizer steps taken so far (inside training_step: before this step's).
  virtual int64_t global_step() const = 0;
  /// The optimizer steps the running fit will take (LightningModule::estimated_stepping_batches);
  /// unset outside fit or when unbounded.
  virtual std::optional<int64_t> estimated_stepping_batches() const { return std::nullopt; }
  /// This process's place in the run.
  virtual const Topology& topology() const = 0;
  /// The device this process's module runs on.
  virtual torch::Device device() const = 0;
  /// The collectives over the run's processes.
  virtual Collectives& collectives() const = 0;
  /// True when each process's optimizers hold only its shard of the gradients (fsdp), so a
  /// gradient norm sums over every process (a collective: every process must ask together).
  virtual bool shards_gradients() const { return false; }
  /// Writes a line to the run's console on the global-zero process (the progress bar's console).
  virtual void print(const std::string& line) const = 0;
};

}  // namespace volt
