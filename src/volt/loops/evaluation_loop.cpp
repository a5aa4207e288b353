#include "volt/loops/evaluation_loop.h"

#include <torch/torch.h>

#include "volt/core/error.h"
#include "volt/data/data_loader.h"
#include "volt/loops/step_feed.h"
#include "volt/module/lightning_module.h"
#include "volt/module/result_collection.h"
#include "volt/precision/precision_plugin.h"
#include "volt/progress/progress_bar.h"
#include "volt/strategies/strategy.h"

namespace volt {

const char* to_string(EvalStage stage) {
  switch (stage) {
    case EvalStage::kSanityCheck:
      return "sanity_check";
    case EvalStage::kValidation:
      return "validate";
    case EvalStage::kTest:
      return "test";
  }
  return "?";
}

Batch prepare_batch(const Batch& batch, c10::Device device, const PrecisionPlugin& precision) {
  // A batch the loader pinned is copied to the GPU without blocking the step's thread.
  return batch.map(
      [&](const torch::Tensor& t) { return precision.convert_input(t.to(device, /*non_blocking=*/t.is_pinned())); });
}

namespace {

const char* bar_title(EvalStage stage) {
  switch (stage) {
    case EvalStage::kSanityCheck:
      return "Sanity Checking";
    case EvalStage::kValidation:
      return "Validation";
    case EvalStage::kTest:
      return "Testing";
  }
  return "?";
}

}  // namespace

EvalCounts EvaluationLoop::run(LightningModule& module, const DataLoader& loader, std::optional<int64_t> batches,
                               EvalStage stage, ResultCollection& results) const {
  return run(module, std::vector<DataLoader>{loader}, {batches}, stage, results);
}

EvalCounts EvaluationLoop::run(LightningModule& module, const std::vector<DataLoader>& loaders,
                               const std::vector<std::optional<int64_t>>& batches, EvalStage stage,
                               ResultCollection& results) const {
  VOLT_INTERNAL_ASSERT(loaders.size() == batches.size(), "{} loaders, {} batch counts", loaders.size(), batches.size());
  const bool test = stage == EvalStage::kTest;
  const TrainingModeScope eval_mode(module, /*training=*/false);
  const MetricSinkScope sink(module, &results);
  torch::NoGradGuard no_grad;
  if (test) {
    module.on_test_epoch_start();
  } else {
    module.on_validation_epoch_start();
  }
  EvalCounts counts;
  const auto passes = static_cast<int64_t>(loaders.size());
  for (int64_t k = 0; k < passes; ++k) {
    const DataLoader& loader = loaders[static_cast<size_t>(k)];
    const std::optional<int64_t> limit = batches[static_cast<size_t>(k)];
    if (limit && *limit <= 0) continue;
    // Lightning's add_dataloader_idx: names tell the loaders apart only when there are several.
    results.set_name_suffix(passes > 1 ? fmt::format("/dataloader_idx_{}", k) : "");
    module.set_dataloader_idx(k);
    if (bar_) bar_->start(bar_title(stage), 0, limit.value_or(-1));
    StepFeed feed(loader, 0, limit, strategy_.topology().world_size, count_across(strategy_));
    for (int64_t i = 0; feed.has_step(); ++i) {
      const StepInput input = feed.take();
      const Batch batch = prepare_batch(input.batch, device_, precision_);
      // A dry process's replay keeps its collectives (sync_dist on_step logs) in line and logs nothing.
      std::optional<ResultCollection> kept;
      if (input.joined) {
        kept = results;
      } else {
        counts.examples += batch.size();
      }
      results.set_batch_size(batch.size());
      {
        const AutocastGuard autocast = precision_.forward_context();
        if (test) {
          module.test_step(batch, i);
        } else {
          module.validation_step(batch, i);
        }
      }
      if (kept) results = std::move(*kept);
      if (bar_) bar_->update(i + 1, {});
      ++counts.batches;
      feed.last();
    }
    if (bar_ && k + 1 < passes) bar_->finish({});
  }
  results.set_name_suffix("");
  module.set_dataloader_idx(0);
  if (test) {
    module.on_test_epoch_end();
  } else {
    module.on_validation_epoch_end();
  }
  // One collective for all sync_dist values: exact means over every process's real examples.
  results.sync_epoch([this](torch::Tensor& t, Reduce op) { strategy_.reduce(t, op); });
  if (bar_) bar_->finish(results.epoch_metrics(MetricTarget::kProgBar));
  return counts;
}

}  // namespace volt
