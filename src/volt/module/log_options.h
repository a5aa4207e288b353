// How a value logged from a step is aggregated and where it goes.
#pragma once

#include <optional>
#include <string>

#include "volt/base/reduce.h"

namespace volt {

/// Options of LightningModule::log, with Lightning's defaults.
///
/// Example: `log("val/acc", acc, {.prog_bar = true, .on_epoch = true})`.
struct LogOptions {
  /// Show the value on the progress bar.
  bool prog_bar = false;
  /// Send the value to the loggers (CSV, TensorBoard).
  bool logger = true;
  /// Record the value of every step; unset: true in training_step, false in evaluation steps.
  std::optional<bool> on_step;
  /// Aggregate over the epoch with `reduce_fx`; unset: false in training_step, true otherwise.
  std::optional<bool> on_epoch;
  /// How the epoch aggregate is computed; kMean is weighted by batch size.
  Reduce reduce_fx = Reduce::kMean;
  /// Reduce the value across processes under ddp (costs a collective per call).
  bool sync_dist = false;
  /// The weight of this value in a kMean; unset: the size of the current batch.
  std::optional<int64_t> batch_size;
};

}  // namespace volt
