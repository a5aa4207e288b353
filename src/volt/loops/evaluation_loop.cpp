#include "volt/loops/evaluation_loop.h"

#include <torch/torch.h>

#include "volt/callbacks/callback.h"
#include "volt/core/error.h"
#include "volt/data/data_loader.h"
#include "volt/loops/step_feed.h"
#include "volt/metrics/metric.h"
#include "volt/module/lightning_module.h"
#include "volt/module/result_collection.h"
#include "volt/precision/precision_plugin.h"
#include "volt/profiler/profiler.h"
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

Batch prepare_batch(LightningModule& module, const Batch& batch, c10::Device device, const PrecisionPlugin& precision,
                    int64_t dataloader_idx) {
  Batch moved = module.on_before_batch_transfer(batch, dataloader_idx);
  moved = module.transfer_batch_to_device(std::move(moved), device, dataloader_idx);
  moved = module.on_after_batch_transfer(std::move(moved), dataloader_idx);
  return moved.map([&](const torch::Tensor& t) { return precision.convert_input(t); });
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
  const bool sanity = stage == EvalStage::kSanityCheck;
  const auto notify = [&](const CallbackHook& hook, const HookPoint& point) {
    if (callbacks_ != nullptr) callbacks_->dispatch(hook, point);
  };
  const HookPoint pass_point{.sanity_checking = sanity};
  const TrainingModeScope eval_mode(module, /*training=*/false);
  const MetricSinkScope sink(module, &results);
  torch::NoGradGuard no_grad;
  if (test) {
    module.on_test_start();
    notify([](Callback& c, const CallbackContext& x, CallbackServices& s) { return c.on_test_epoch_start(x, s); },
           pass_point);
    module.on_test_epoch_start();
  } else {
    module.on_validation_start();
    notify([](Callback& c, const CallbackContext& x, CallbackServices& s) { return c.on_validation_epoch_start(x, s); },
           pass_point);
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
    internal::ModuleAccess::set_dataloader_idx(module, k);
    if (bar_) bar_->start(bar_title(stage), 0, limit.value_or(-1));
    StepFeed feed(loader, 0, limit, strategy_.collectives());
    for (int64_t i = 0; feed.has_step(); ++i) {
      std::optional<Profiler::Scope> fetch;
      if (profiler_) fetch.emplace(*profiler_, Action::kEvalDataFetch);
      const StepInput input = feed.take();
      const Batch batch = prepare_batch(module, input.batch, device_, precision_, k);
      fetch.reset();
      const HookPoint point{.sanity_checking = sanity, .batch = &batch, .batch_idx = i, .dataloader_idx = k};
      // A dry process's replay keeps its collectives (sync_dist on_step logs) in line and logs nothing.
      std::optional<ResultCollection> kept;
      if (input.joined) {
        kept = results;
      } else {
        counts.examples += batch.size();
        if (test) {
          notify([](Callback& c, const CallbackContext& x, CallbackServices& s) { return c.on_test_batch_start(x, s); },
                 point);
          module.on_test_batch_start(batch, i, k);
        } else {
          notify([](Callback& c, const CallbackContext& x,
                    CallbackServices& s) { return c.on_validation_batch_start(x, s); },
                 point);
          module.on_validation_batch_start(batch, i, k);
        }
      }
      results.set_batch_size(batch.size());
      {
        std::optional<Profiler::Scope> step;
        if (profiler_) step.emplace(*profiler_, Action::kEvalStep);
        const AutocastGuard autocast = precision_.forward_context();
        // A replayed batch's examples were counted where they belong: its metric updates are not.
        std::optional<internal::DiscardMetricUpdates> discard;
        if (kept) discard.emplace();
        if (test) {
          module.test_step(batch, i);
        } else {
          module.validation_step(batch, i);
        }
      }
      if (!input.joined) {
        if (test) {
          notify([](Callback& c, const CallbackContext& x, CallbackServices& s) { return c.on_test_batch_end(x, s); },
                 point);
          module.on_test_batch_end(batch, i, k);
        } else {
          notify([](Callback& c, const CallbackContext& x,
                    CallbackServices& s) { return c.on_validation_batch_end(x, s); },
                 point);
          module.on_validation_batch_end(batch, i, k);
        }
      }
      if (kept) {
        kept->keep_metrics_from(results);
        results = std::move(*kept);
      }
      if (bar_) bar_->update(i + 1, {});
      ++counts.batches;
      feed.last();
      // Inside fit the trace's schedule counts training steps only.
      if (profiler_ && profiler_->stage() != "fit") profiler_->step_done();
    }
    if (bar_ && k + 1 < passes) bar_->finish({});
  }
  results.set_name_suffix("");
  internal::ModuleAccess::set_dataloader_idx(module, 0);
  if (test) {
    notify([](Callback& c, const CallbackContext& x, CallbackServices& s) { return c.on_test_epoch_end(x, s); },
           pass_point);
    module.on_test_epoch_end();
  } else {
    notify([](Callback& c, const CallbackContext& x, CallbackServices& s) { return c.on_validation_epoch_end(x, s); },
           pass_point);
    module.on_validation_epoch_end();
  }
  // One collective for all sync_dist values: exact means over every process's real examples.
  results.sync_epoch(strategy_.collectives());
  if (test) {
    module.on_test_end();
  } else {
    module.on_validation_end();
  }
  if (bar_) bar_->finish(results.epoch_metrics(MetricTarget::kProgBar));
  return counts;
}

}  // namespace volt
