// The `volt` tool against the library: for the same program flags, the job layout the tool
// accepts is the one resolve_run_plan accepts in every task srun starts, and the processes per
// node agree. Links LibTorch (for resolve_run_plan); the tool itself does not.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <fstream>

#include "rank_table.h"
#include "trainer_shape.h"
#include "volt/core/error.h"
#include "volt/options/trainer_flags.h"
#include "volt/plan/run_plan.h"

namespace volt::tool {
namespace {

using Strings = std::vector<std::string>;

std::string write_file(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + std::to_string(::getpid()) + "_" + name;
  std::ofstream(path) << text;
  return path;
}

/// The TrainerOptions the program itself reads from `command`: its own CLI with the Trainer flags
/// (no extras allowed), as examples/fashion_mnist parses them.
TrainerOptions program_options(const Strings& command) {
  CLI::App app("program", command.front());
  TrainerOptions options;
  TrainerFlagText text;
  add_trainer_flags(app, options, text);
  app.parse(Strings(command.rbegin(), std::prev(command.rend())));
  apply_trainer_flags(text, options);
  return options;
}

/// The machine a task of `spec` runs on: the node's GPUs visible (--gres without binding), a
/// CUDA build when the job has GPUs.
MachineInfo task_machine(const slurm::JobSpec& spec, const std::string& host) {
  MachineInfo machine;
  machine.cores = 8;
  machine.cwd = "/work";
  machine.host = host;
  machine.gpus = spec.gpus_per_node;
  machine.cuda_build = spec.gpus_per_node > 0;
  return machine;
}

/// The plan of every task srun would start for `spec`, or the first task's error.
std::vector<RunPlan> plans_of_every_task(const slurm::JobSpec& spec, const TrainerOptions& options) {
  std::vector<RunPlan> plans;
  for (const RankRow& row : build_rank_table(spec)) {
    // What srun adds to the variables the rank table lists: the step, which tells a task from the batch shell.
    const Env env = row.env.with("SLURM_STEP_ID", "0");
    plans.push_back(resolve_run_plan(options, env, task_machine(spec, row.host)));
  }
  return plans;
}

struct Case {
  Strings command;        ///< the program and its flags
  int64_t gpus_per_node;  ///< the job's --gres=gpu:N
  int64_t processes;      ///< processes per node the Trainer runs
};

class ToolAndPlan : public ::testing::TestWithParam<Case> {};

TEST_P(ToolAndPlan, AgreeOnProcessesPerNodeAndTheJobBothAccept) {
  const Case& c = GetParam();
  slurm::JobSpec spec;
  spec.gpus_per_node = c.gpus_per_node;
  spec.time = "01:00:00";
  spec.command = c.command;
  const slurm::TrainerShape shape = trainer_shape_from_command(c.command, spec);
  ASSERT_TRUE(shape.processes_per_node.has_value());
  EXPECT_EQ(*shape.processes_per_node, c.processes);

  // The job the tool's shape asks for: the tool accepts it, and so does every task's Trainer.
  spec.nodes = shape.num_nodes;
  spec.ntasks_per_node = *shape.processes_per_node;
  EXPECT_EQ(check_job(spec, c.command), Strings{});
  const TrainerOptions options = program_options(c.command);
  const std::vector<RunPlan> plans = plans_of_every_task(spec, options);
  ASSERT_EQ(static_cast<int64_t>(plans.size()), spec.nodes * spec.ntasks_per_node);
  for (std::size_t task = 0; task < plans.size(); ++task) {
    const RunPlan& plan = plans[task];
    EXPECT_EQ(plan.topology.world_size, spec.nodes * spec.ntasks_per_node);
    EXPECT_EQ(plan.topology.global_rank, static_cast<int64_t>(task));
    EXPECT_EQ(plan.devices, shape.devices);
    EXPECT_EQ(plan.num_nodes, shape.num_nodes);
    EXPECT_EQ(plan.accelerator == Accelerator::kCuda, shape.uses_gpus);
    EXPECT_EQ(to_string(plan.strategy), shape.strategy);
  }

  // One task per node more: the tool refuses the job, and so does the Trainer.
  spec.ntasks_per_node += 1;
  EXPECT_FALSE(check_job(spec, c.command).empty());
  EXPECT_THROW(plans_of_every_task(spec, options), Error);
}

const std::string kConfig = write_file("plan_config.yaml", "trainer:\n  devices: 2\n  num_nodes: 2\n");

/// "Case3_strategy_ddp_devices_2_numnodes_2": a failing case names its flags, and the name is the
/// same in every build (gtest's default prints the struct's bytes, pointers included).
std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name = "Case" + std::to_string(info.index);
  for (size_t i = 1; i < info.param.command.size(); ++i) {
    const std::string& arg = info.param.command[i];
    name += '_';
    if (arg == kConfig) {
      name += "yaml";
      continue;
    }
    for (const char c : arg)
      if (std::isalnum(static_cast<unsigned char>(c))) name += c;
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(
    FlagSets, ToolAndPlan,
    ::testing::Values(Case{{"./train"}, 0, 1},                                          //
                      Case{{"./train", "--devices", "2"}, 0, 2},                        // auto: ddp
                      Case{{"./train", "--strategy", "auto", "--devices", "3"}, 0, 3},  //
                      Case{{"./train", "--strategy", "ddp", "--devices", "2", "--num-nodes", "2"}, 0, 2},
                      Case{{"./train", "--strategy", "dp", "--devices", "2"}, 0, 1},  //
                      Case{{"./train", "--strategy", "ddp2", "--devices", "2", "--num-nodes", "2"}, 0, 1},
                      Case{{"./train", "--gpus", "2"}, 2, 2},  //
                      Case{{"./train", "--gpus", "2", "--strategy", "ddp2", "--num-nodes", "2"}, 2, 1},
                      Case{{"./train", "--accelerator", "gpu", "--devices", "auto"}, 4, 4},  //
                      Case{{"./train", "--config", kConfig}, 0, 2},                          //
                      Case{{"./train", "--config", kConfig, "--strategy", "ddp2"}, 0, 1}),
    case_name);

}  // namespace
}  // namespace volt::tool
