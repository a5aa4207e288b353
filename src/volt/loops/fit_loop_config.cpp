#include "volt/loops/fit_loop_config.h"

#include <algorithm>

#include "volt/core/error.h"
#include "volt/plan/run_plan.h"

namespace volt {

FitLoopConfig fit_loop_config(const RunPlan& plan) {
  return FitLoopConfig{.epoch = {.device = plan.root_device(),
                                 .max_steps = plan.max_steps,
                                 .log_every_n_steps = plan.log_every_n_steps,
                                 .straggler_every_n_steps = plan.straggler_every_n_steps,
                                 .gradient_clip_val = plan.gradient_clip_val,
                                 .gradient_clip_algorithm = plan.gradient_clip_algorithm,
                                 .accumulate_grad_batches = plan.accumulate_grad_batches,
                                 .strategy = plan.strategy},
                       .checkpoints = {.state_dict_type = plan.state_dict_type,
                                       .hpc_checkpoint_dir = plan.hpc_checkpoint_dir,
                                       .hpc_checkpoints_to_keep = plan.hpc_checkpoints_to_keep,
                                       .snapshots_to_keep = plan.snapshots_to_keep,
                                       .async_checkpointing = plan.async_checkpointing,
                                       .snapshot_memory_root = plan.snapshot_memory_root,
                                       .snapshot_peer_rank = plan.snapshot_peer_rank.value_or(-1)},
                       .snapshots = {.every_n_steps = plan.snapshot_every_n_steps,
                                     .every_n_seconds = plan.snapshot_every_n_seconds,
                                     .skip_when_busy = plan.skip_snapshot_when_busy},
                       .topology = plan.topology,
                       .max_epochs = plan.max_epochs,
                       .min_epochs = plan.min_epochs,
                       .min_steps = plan.min_steps,
                       .check_val_every_n_epoch = plan.check_val_every_n_epoch,
                       .num_sanity_val_steps = plan.num_sanity_val_steps,
                       .reload_dataloaders_every_n_epochs = plan.reload_dataloaders_every_n_epochs,
                       .show_progress = plan.shows_progress(),
                       .enable_model_summary = plan.enable_model_summary,
                       .model_summary_max_depth = plan.model_summary_max_depth,
                       .straggler_threshold = plan.straggler_threshold,
                       .requeue = plan.requeue,
                       .fault = plan.fault,
                       .restart_attempt = plan.restart_attempt,
                       .fast_dev_run = plan.fast_dev_run};
}

int64_t accumulate_grad_batches(const std::vector<std::shared_ptr<Callback>>& callbacks, int64_t configured,
                                int64_t epoch) {
  for (const auto& callback : callbacks) {
    const std::optional<int64_t> scheduled = callback->accumulate_grad_batches(epoch);
    if (!scheduled) continue;
    VOLT_CHECK(configured == 1,
               "accumulate_grad_batches={} is set, and a {} schedules the accumulation too. HINT: leave "
               "accumulate_grad_batches at 1 and put every factor in the schedule.",
               configured, callback->state_key());
    return *scheduled;
  }
  return configured;
}

std::optional<int64_t> estimated_stepping_batches(const FitLoopConfig& config, std::optional<int64_t> num_train_batches,
                                                  const std::function<int64_t(int64_t epoch)>& accumulation) {
  const int64_t max_steps = config.epoch.max_steps;
  const std::optional<int64_t> cap = max_steps >= 0 ? std::optional<int64_t>(max_steps) : std::nullopt;
  if (config.max_epochs < 0 || !num_train_batches) return cap;
  int64_t steps = 0;
  for (int64_t epoch = 0; epoch < std::max<int64_t>(config.max_epochs, 1); ++epoch) {
    const int64_t every = std::max<int64_t>(accumulation(epoch), 1);
    steps += (*num_train_batches + every - 1) / every;
    if (cap && steps >= *cap) return cap;
  }
  return steps;
}

}  // namespace volt
