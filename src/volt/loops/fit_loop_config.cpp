#include "volt/loops/fit_loop_config.h"

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
                                       .hpc_checkpoints_to_keep = plan.hpc_checkpoints_to_keep},
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
                       .requeue = plan.requeue};
}

}  // namespace volt
