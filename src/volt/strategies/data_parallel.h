// Lightning's dp inside one process: each batch is split across the devices, one replica of
// the module runs training_step per piece, and the pieces' losses are combined on the root.
#pragma once

#include <c10/core/Device.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "volt/data/dataset.h"

namespace volt {

class RunView;

class LightningModule;

/// Options of DataParallel.
///
/// Example: `DataParallel dp({.replicas = 4});` splits every batch into 4 pieces.
struct DataParallelOptions {
  /// Devices, one replica each; on CPU every replica is a thread over the same parameters.
  int64_t replicas = 2;
  /// Run the replicas one after another in replica order, so that random draws (dropout) are
  /// taken in the same order on every run; otherwise they run concurrently when they can.
  bool deterministic = false;
  /// The replicas' devices, root first (CUDA builds: the node's GPUs). Empty: every replica is a
  /// thread over the module's own parameters on the CPU. Given: replica 0 is the module itself
  /// and replica r is a copy on devices[r] (LightningModule::make_replica), refreshed from the
  /// module before every step; devices may repeat (tests copy replicas on the CPU).
  std::vector<c10::Device> devices;
};

/// Splits `batch` along dim 0 into at most `pieces` consecutive pieces, as DataParallel's
/// scatter (torch::chunk) does: ceil(N / pieces) examples each, the last one smaller, and fewer
/// pieces than asked when the batch is small. `pieces` >= 1.
std::vector<Batch> split_batch(const Batch& batch, int64_t pieces);

/// Runs one training step data-parallel: scatter, a replica per piece, gather, reduce.
///
/// With DataParallelOptions::devices (CUDA), replica r > 0 is a copy of the module on its
/// device, as torch::nn::parallel::replicate makes them: before each step the module's
/// parameters and buffers are copied into it, and each copied parameter's backward sends its
/// gradient to the module parameter it came from (Broadcast's backward), so backward of the
/// combined loss sums every replica's gradient into the module's one `.grad`. Buffers
/// (BatchNorm statistics) stay those the root replica computed.
///
/// Without devices (CPU), all replicas share the module's one set of parameters: each piece's forward pass records
/// its own autograd graph over the same parameter tensors (LibTorch's autograd is thread-safe
/// for this), and backward of the combined loss accumulates every replica's gradient into the
/// same `.grad`, so no gradient copy or reduction step exists that could drift. That is what
/// torch::nn::parallel::data_parallel computes on CUDA with copied replicas, whose gradients flow
/// back to the originals through Broadcast's backward.
///
/// What each replica logs is collected apart and combined once per step on the calling thread
/// (means weighted by piece size; sums, maxima and minima as their names say), so log() is
/// safe in training_step. Modules with buffers (BatchNorm's running statistics) are updated in
/// place by forward passes, so their replicas take turns, and afterwards the buffers hold what
/// the root replica computed, as with CUDA dp, where only replica 0's buffers are the module's.
/// training_step must not change the module's own members on other replicas' threads.
class DataParallel {
 public:
  /// `options.replicas` >= 1.
  explicit DataParallel(DataParallelOptions options);
  /// Splits `batch`, runs module.training_step on every piece (replica 0, the root, on this
  /// thread), and returns module.training_step_end of the losses gathered on the root's device.
  /// An exception in any replica is rethrown here, after every replica finished.
  torch::Tensor training_step(LightningModule& module, const Batch& batch, int64_t batch_idx);
  /// The number of replicas (devices).
  int64_t replicas() const { return options_.replicas; }

 private:
  /// The modules that run the pieces: the module itself, then copies refreshed from it (devices
  /// given) or the module again (CPU threads).
  std::vector<LightningModule*> refresh_replicas(LightningModule& module, size_t count);

  DataParallelOptions options_;
  /// Copies for replicas 1.. (devices given), made once by make_replica.
  std::vector<std::shared_ptr<LightningModule>> copies_;
  /// What each copy sees of the run: the module's view with the copy's own device.
  std::vector<std::shared_ptr<RunView>> copy_views_;
  /// The module's view the copies' views wrap.
  const RunView* viewed_ = nullptr;
};

}  // namespace volt
