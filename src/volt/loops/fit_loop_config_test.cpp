// fit_loop_config: every field the loops read comes from its own field of the plan (each set to
// a value no other field holds, so a swapped or forgotten field fails).
#include "volt/loops/fit_loop_config.h"

#include <gtest/gtest.h>

#include "volt/plan/run_plan.h"

namespace volt {
namespace {

TEST(FitLoopConfig, EachFieldComesFromItsOwnFieldOfThePlan) {
  RunPlan plan;
  plan.strategy = StrategyKind::kDdp;
  plan.topology = Topology{.world_size = 4, .global_rank = 0, .host = "node7"};
  plan.state_dict_type = StateDictType::kSharded;
  plan.max_epochs = 11;
  plan.min_epochs = 12;
  plan.max_steps = 13;
  plan.min_steps = 14;
  plan.check_val_every_n_epoch = 15;
  plan.num_sanity_val_steps = 16;
  plan.reload_dataloaders_every_n_epochs = 17;
  plan.accumulate_grad_batches = 18;
  plan.gradient_clip_val = 19.5;
  plan.gradient_clip_algorithm = GradientClipAlgorithm::kValue;
  plan.log_every_n_steps = 20;
  plan.straggler_every_n_steps = 21;
  plan.straggler_threshold = 0.22;
  plan.enable_model_summary = false;
  plan.model_summary_max_depth = 23;
  plan.requeue.enabled = true;
  plan.requeue.signal = 24;
  plan.requeue.checkpoint_on_sigterm = true;
  plan.hpc_checkpoint_dir = "/runs/hpc";
  plan.hpc_checkpoints_to_keep = 25;
  plan.enable_progress_bar = true;

  const FitLoopConfig c = fit_loop_config(plan);
  EXPECT_EQ(c.epoch.device, plan.root_device());
  EXPECT_EQ(c.epoch.max_steps, 13);
  EXPECT_EQ(c.epoch.log_every_n_steps, 20);
  EXPECT_EQ(c.epoch.straggler_every_n_steps, 21);
  EXPECT_EQ(c.epoch.gradient_clip_val, 19.5);
  EXPECT_EQ(c.epoch.gradient_clip_algorithm, GradientClipAlgorithm::kValue);
  EXPECT_EQ(c.epoch.accumulate_grad_batches, 18);
  EXPECT_EQ(c.epoch.strategy, StrategyKind::kDdp);
  EXPECT_EQ(c.checkpoints.state_dict_type, StateDictType::kSharded);
  EXPECT_EQ(c.checkpoints.hpc_checkpoint_dir, "/runs/hpc");
  EXPECT_EQ(c.checkpoints.hpc_checkpoints_to_keep, 25);
  EXPECT_EQ(c.topology.world_size, 4);
  EXPECT_EQ(c.topology.host, "node7");
  EXPECT_EQ(c.max_epochs, 11);
  EXPECT_EQ(c.min_epochs, 12);
  EXPECT_EQ(c.min_steps, 14);
  EXPECT_EQ(c.check_val_every_n_epoch, 15);
  EXPECT_EQ(c.num_sanity_val_steps, 16);
  EXPECT_EQ(c.reload_dataloaders_every_n_epochs, 17);
  EXPECT_FALSE(c.enable_model_summary);
  EXPECT_EQ(c.model_summary_max_depth, 23);
  EXPECT_DOUBLE_EQ(c.straggler_threshold, 0.22);
  EXPECT_TRUE(c.requeue.enabled);
  EXPECT_EQ(c.requeue.signal, 24);
  EXPECT_TRUE(c.requeue.checkpoint_on_sigterm);
  EXPECT_TRUE(c.show_progress);  // global rank 0 with the bar on
  plan.topology.global_rank = 1;
  EXPECT_FALSE(fit_loop_config(plan).show_progress) << "only global rank 0 draws bars";
}

TEST(FitLoopConfig, EstimatedSteppingBatchesFollowsEpochsAccumulationAndTheStepCap) {
  FitLoopConfig c;
  c.max_epochs = 3;
  const auto every = [](int64_t factor) { return [factor](int64_t) { return factor; }; };
  EXPECT_EQ(estimated_stepping_batches(c, 10, every(1)), 30);
  EXPECT_EQ(estimated_stepping_batches(c, 10, every(4)), 9) << "ceil(10 / 4) = 3 per epoch";
  // A schedule: 4 in epoch 0, 1 afterwards (GradientAccumulationScheduler).
  EXPECT_EQ(estimated_stepping_batches(c, 10, [](int64_t epoch) { return epoch == 0 ? 4 : 1; }), 3 + 10 + 10);
  c.epoch.max_steps = 12;
  EXPECT_EQ(estimated_stepping_batches(c, 10, every(1)), 12) << "max_steps caps the epochs";
  EXPECT_EQ(estimated_stepping_batches(c, std::nullopt, every(1)), 12) << "a stream: max_steps alone";
  c.epoch.max_steps = -1;
  EXPECT_EQ(estimated_stepping_batches(c, std::nullopt, every(1)), std::nullopt) << "a stream, no cap";
  c.max_epochs = -1;
  EXPECT_EQ(estimated_stepping_batches(c, 10, every(1)), std::nullopt) << "unbounded";
}

}  // namespace
}  // namespace volt
