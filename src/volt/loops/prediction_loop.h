// predict_step over a loader, with every process's outputs gathered in order on global rank 0.
#pragma once

#include <c10/core/Device.h>
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace volt {

class CallbackDispatcher;
class DataLoader;
class LightningModule;
class PrecisionPlugin;
class Profiler;
class Strategy;

/// Runs predict_step without gradients and in eval mode.
///
/// Under ddp each process predicts one contiguous block of the data (the Trainer configures the
/// loader so); the blocks' outputs are then gathered on global rank 0, in rank order, so rank 0
/// returns every prediction in the dataset's order, as one process would. Other ranks return
/// their own block's outputs. A stream's predictions come in rank order of the processes' shares.
/// Hooks, the callbacks' before the module's: on_predict_start, on_predict_epoch_start (module
/// only), per batch the transfer hooks, on_predict_batch_start, predict_step,
/// on_predict_batch_end; on_predict_epoch_end (module only), on_predict_end, then the gather.
class PredictionLoop {
 public:
  /// Steps run on `device` under `precision`'s autocast; `callbacks` gets the callbacks' hooks
  /// (nullptr: no callbacks); `profiler` times each batch's fetch and step (nullptr: untimed).
  PredictionLoop(Strategy& strategy, const PrecisionPlugin& precision, c10::Device device,
                 CallbackDispatcher* callbacks = nullptr, Profiler* profiler = nullptr)
      : strategy_(strategy), precision_(precision), device_(device), callbacks_(callbacks), profiler_(profiler) {}

  /// The outputs of `batches` batches of `loader` (set to its epoch already; unset: to its end), gathered on global
  /// rank 0 when `gather` (the loader holds this process's block of a sharded dataset).
  std::vector<torch::Tensor> run(LightningModule& module, const DataLoader& loader, std::optional<int64_t> batches,
                                 bool gather) const;

 private:
  Strategy& strategy_;
  const PrecisionPlugin& precision_;
  c10::Device device_;
  CallbackDispatcher* callbacks_;
  Profiler* profiler_;
};

}  // namespace volt
