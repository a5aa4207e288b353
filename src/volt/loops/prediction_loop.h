// predict_step over a loader, with every process's outputs gathered in order on global rank 0.
#pragma once

#include <c10/core/Device.h>
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace volt {

class DataLoader;
class LightningModule;
class PrecisionPlugin;
class Strategy;

/// Runs predict_step without gradients and in eval mode.
///
/// Under ddp each process predicts one contiguous block of the data (the Trainer configures the
/// loader so); the blocks' outputs are then gathered on global rank 0, in rank order, so rank 0
/// returns every prediction in the dataset's order, as one process would. Other ranks return
/// their own block's outputs. A stream's predictions come in rank order of the processes' shares.
class PredictionLoop {
 public:
  /// Steps run on `device` under `precision`'s autocast.
  PredictionLoop(Strategy& strategy, const PrecisionPlugin& precision, c10::Device device)
      : strategy_(strategy), precision_(precision), device_(device) {}

  /// The outputs of `batches` batches of `loader` (set to its epoch already; unset: to its end), gathered on global
  /// rank 0 when `gather` (the loader holds this process's block of a sharded dataset).
  std::vector<torch::Tensor> run(LightningModule& module, const DataLoader& loader, std::optional<int64_t> batches,
                                 bool gather) const;

 private:
  Strategy& strategy_;
  const PrecisionPlugin& precision_;
  c10::Device device_;
};

}  // namespace volt
