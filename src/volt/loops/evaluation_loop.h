// One evaluation pass: the sanity check, a validation run or a test.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "volt/data/dataset.h"

namespace volt {

class CallbackDispatcher;
class DataLoader;
class LightningModule;
class PrecisionPlugin;
class ProgressBar;
class Profiler;
class ResultCollection;
class Strategy;

/// Which hooks an evaluation pass calls.
enum class EvalStage { kSanityCheck, kValidation, kTest };
/// "sanity_check", "validate" or "test".
const char* to_string(EvalStage stage);

/// Moves a batch to `device` through the module's transfer hooks (on_before_batch_transfer,
/// transfer_batch_to_device, on_after_batch_transfer, with `dataloader_idx`), then casts floating
/// inputs and targets to the module's dtype (the -true precisions; the others keep them).
Batch prepare_batch(LightningModule& module, const Batch& batch, c10::Device device, const PrecisionPlugin& precision,
                    int64_t dataloader_idx);

/// What an evaluation pass went through on this process.
struct EvalCounts {
  /// Steps run (a process whose stream ran dry counts the steps it stepped along).
  int64_t batches = 0;
  /// Examples evaluated, each once (no padding, no replayed batches).
  int64_t examples = 0;
};

/// Runs validation_step or test_step over the first batches of a loader, without gradients and
/// in eval mode, and reduces the logged values across processes once at the end.
///
/// Hooks, module's after the callbacks': on_validation_start (on_test_start), the epoch start
/// hooks, per batch the transfer hooks and the batch start hooks, the step, the batch end hooks;
/// the epoch end hooks, the reduction, on_validation_end (on_test_end). The module's training
/// mode and metric sink are restored when the pass ends, also when a step throws.
class EvaluationLoop {
 public:
  /// Steps run on `device` under `precision`'s autocast; `bar` may be nullptr (no progress);
  /// `callbacks` gets the callbacks' epoch and batch hooks (nullptr: no callbacks); `profiler`
  /// times each batch's fetch and step (nullptr: untimed).
  EvaluationLoop(Strategy& strategy, const PrecisionPlugin& precision, c10::Device device, ProgressBar* bar,
                 CallbackDispatcher* callbacks = nullptr, Profiler* profiler = nullptr)
      : strategy_(strategy),
        precision_(precision),
        device_(device),
        bar_(bar),
        callbacks_(callbacks),
        profiler_(profiler) {}

  /// Evaluates `batches` batches of `loader` (set to its epoch already; unset: until every
  /// process's stream is dry) into `results` and returns how many batches and examples this
  /// process evaluated. Evaluation loaders are not padded, so every example counts once in the epoch
  /// means; a process whose stream ran dry steps along on a replay batch that counts nothing.
  EvalCounts run(LightningModule& module, const DataLoader& loader, std::optional<int64_t> batches, EvalStage stage,
                 ResultCollection& results) const;
  /// Evaluates `loaders` one after another in one pass (epoch hooks once, one reduction at the
  /// end), `batches[k]` batches of loader k; with more than one loader, the step reads k from
  /// LightningModule::dataloader_idx() and its values are logged as "<name>/dataloader_idx_<k>".
  EvalCounts run(LightningModule& module, const std::vector<DataLoader>& loaders,
                 const std::vector<std::optional<int64_t>>& batches, EvalStage stage, ResultCollection& results) const;

 private:
  Strategy& strategy_;
  const PrecisionPlugin& precision_;
  c10::Device device_;
  ProgressBar* bar_;
  CallbackDispatcher* callbacks_;
  Profiler* profiler_;
};

}  // namespace volt
