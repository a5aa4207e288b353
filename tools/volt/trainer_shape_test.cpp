#include "trainer_shape.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "volt/core/testing.h"

namespace volt::tool {
namespace {

using volt::testing::error_message;
using Strings = std::vector<std::string>;

/// A file under the test's temporary folder holding `text` (per process: CTest runs tests in parallel).
std::string write_file(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + std::to_string(::getpid()) + "_" + name;
  std::ofstream(path) << text;
  return path;
}

/// A job with `gpus` GPUs per node.
slurm::JobSpec job_with_gpus(int64_t gpus) {
  slurm::JobSpec spec;
  spec.gpus_per_node = gpus;
  return spec;
}

TEST(TrainerShapeFromCommand, DefaultsAreTheTrainersDefaults) {
  const slurm::TrainerShape shape = trainer_shape_from_command({"./train"}, {});
  EXPECT_EQ(shape.devices, 1);
  EXPECT_EQ(shape.num_nodes, 1);
  EXPECT_EQ(shape.processes_per_node, 1);
  EXPECT_EQ(shape.strategy, "single_device");
  EXPECT_FALSE(shape.uses_gpus);
  EXPECT_TRUE(shape.auto_requeue);
  EXPECT_EQ(shape.requeue_signal, "USR1");
}

TEST(TrainerShapeFromCommand, ReadsTheTrainerFlagsInBothForms) {
  const slurm::TrainerShape shape =
      trainer_shape_from_command({"./train", "--devices", "4", "--num-nodes=2", "--accelerator", "gpu",
                                  "--no-auto-requeue", "--requeue-signal", "SIGUSR2"},
                                 job_with_gpus(4));
  EXPECT_EQ(shape.devices, 4);
  EXPECT_EQ(shape.num_nodes, 2);
  EXPECT_EQ(shape.processes_per_node, 4);
  EXPECT_EQ(shape.strategy, "ddp");
  EXPECT_TRUE(shape.uses_gpus);
  EXPECT_FALSE(shape.auto_requeue);
  EXPECT_EQ(shape.requeue_signal, "USR2");
}

TEST(TrainerShapeFromCommand, ReadsOnlyTheFlagNamesTheProgramDefines) {
  // --nb-gpu-nodes is the seed documents' name the Trainer flags keep; --num_nodes is none of
  // them, so the program's CLI would not read it as num_nodes either.
  EXPECT_EQ(trainer_shape_from_command({"./train", "--nb-gpu-nodes", "4"}, {}).num_nodes, 4);
  EXPECT_EQ(trainer_shape_from_command({"./train", "--distributed-backend", "dp", "--devices", "2"}, {}).strategy,
            "dp");
  EXPECT_EQ(trainer_shape_from_command({"./train", "--num_nodes", "3"}, {}).num_nodes, 1);
}

TEST(TrainerShapeFromCommand, DevicesCountAsTheTrainerCountsThem) {
  slurm::JobSpec spec;
  spec.ntasks_per_node = 3;
  EXPECT_EQ(trainer_shape_from_command({"./train", "--devices", "0,1"}, spec).devices, 2);
  // "auto" on the CPU is one process, whatever the job asks for (as resolve_run_plan decides).
  EXPECT_EQ(trainer_shape_from_command({"./train", "--devices=auto"}, spec).devices, 1);
  // -1 is one per core; the tool cannot see a node's cores, so it takes the job's tasks.
  EXPECT_EQ(trainer_shape_from_command({"./train", "--devices", "-1"}, spec).devices, 3);
  // On GPUs, "auto" and -1 are every GPU of the node.
  spec.gpus_per_node = 4;
  EXPECT_EQ(trainer_shape_from_command({"./train", "--devices=auto"}, spec).devices, 4);
  EXPECT_EQ(trainer_shape_from_command({"./train", "--accelerator", "gpu", "--devices", "-1"}, spec).devices, 4);
}

TEST(TrainerShapeFromCommand, AutoAcceleratorUsesGpusWhenTheJobHasThem) {
  slurm::JobSpec spec;
  EXPECT_FALSE(trainer_shape_from_command({"./train", "--accelerator", "auto"}, spec).uses_gpus);
  spec.gpus_per_node = 2;
  EXPECT_TRUE(trainer_shape_from_command({"./train", "--accelerator", "auto"}, spec).uses_gpus);
  EXPECT_TRUE(trainer_shape_from_command({"./train", "--accelerator=cuda"}, job_with_gpus(1)).uses_gpus);
  EXPECT_FALSE(trainer_shape_from_command({"./train", "--accelerator", "cpu"}, spec).uses_gpus);
}

TEST(TrainerShapeFromCommand, GpusAskForCudaDevices) {
  const slurm::TrainerShape shape = trainer_shape_from_command({"./train", "--gpus", "2"}, job_with_gpus(2));
  EXPECT_TRUE(shape.uses_gpus);
  EXPECT_EQ(shape.devices, 2);
  EXPECT_EQ(shape.processes_per_node, 2);
  EXPECT_EQ(trainer_shape_from_command({"./train", "--gpus", "0,1,2"}, job_with_gpus(4)).devices, 3);
  EXPECT_FALSE(trainer_shape_from_command({"./train", "--gpus", "0"}, {}).uses_gpus);  // gpus=0: the CPU
}

TEST(TrainerShapeFromCommand, DpAndDdp2RunOneProcessPerNode) {
  const slurm::TrainerShape dp = trainer_shape_from_command({"./train", "--strategy", "dp", "--devices", "2"}, {});
  EXPECT_EQ(dp.devices, 2);
  EXPECT_EQ(dp.processes_per_node, 1);
  const slurm::TrainerShape ddp2 = trainer_shape_from_command(
      {"./train", "--strategy", "ddp2", "--devices", "2", "--num-nodes", "2"}, job_with_gpus(2));
  EXPECT_EQ(ddp2.strategy, "ddp2");
  EXPECT_EQ(ddp2.devices, 2);
  EXPECT_EQ(ddp2.num_nodes, 2);
  EXPECT_EQ(ddp2.processes_per_node, 1);
  EXPECT_EQ(trainer_shape_from_command({"./train", "--strategy", "auto", "--devices", "2"}, {}).strategy, "ddp");
}

TEST(TrainerShapeFromCommand, TheConfigFileIsReadUnderTheFlags) {
  const std::string config = write_file("job_config.yaml", R"(
trainer:
  devices: 2
  num_nodes: 2
  strategy: ddp2
  requeue_signal: SIGUSR2
model:
  lr: 0.1
save_top_k: 3
)");
  const slurm::TrainerShape shape = trainer_shape_from_command({"./train", "--config", config}, {});
  EXPECT_EQ(shape.devices, 2);
  EXPECT_EQ(shape.num_nodes, 2);
  EXPECT_EQ(shape.processes_per_node, 1);
  EXPECT_EQ(shape.requeue_signal, "USR2");
  // A flag wins over the file, as in the program.
  EXPECT_EQ(trainer_shape_from_command({"./train", "--config", config, "--num-nodes", "3"}, {}).num_nodes, 3);
}

TEST(TrainerShapeFromCommand, TheProgramsOwnFlagsArgumentsHelpAndPrintConfigAreLeftToIt) {
  ::testing::internal::CaptureStdout();
  const slurm::TrainerShape shape = trainer_shape_from_command(
      {"./train", "data.csv", "--lr", "0.1", "--model=cnn", "--help", "--print-config", "--devices", "2"}, {});
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "");
  EXPECT_EQ(shape.devices, 2);
}

TEST(TrainerShapeFromCommand, TheLaterRequeueSwitchWins) {
  EXPECT_TRUE(trainer_shape_from_command({"./train", "--no-auto-requeue", "--auto-requeue"}, {}).auto_requeue);
  EXPECT_FALSE(trainer_shape_from_command({"./train", "--auto-requeue", "--no-auto-requeue"}, {}).auto_requeue);
}

TEST(TrainerShapeFromCommand, TheProgramNameIsNotAFlag) {
  EXPECT_EQ(trainer_shape_from_command({"--devices", "4"}, {}).devices, 1);
}

TEST(TrainerShapeFromCommand, InvalidValuesAreErrorsNamingTheFlagWithAHint) {
  const auto message = [](const Strings& command) {
    return error_message([&] { trainer_shape_from_command(command, {}); });
  };
  const std::vector<std::pair<Strings, std::string>> cases = {
      {{"./train", "--devices", "many"}, "the program's Trainer flags: devices='many' is invalid"},
      {{"./train", "--gpus", "x"}, "devices='x' is invalid"},
      {{"./train", "--strategy", "dpp"}, "strategy='dpp' is not supported; supported: 'auto', 'single_device'"},
      {{"./train", "--accelerator", "tpu"}, "accelerator='tpu' is not supported"},
      {{"./train", "--precision", "8"}, "precision='8' is not a precision"},
      {{"./train", "--requeue-signal", "SIGTERM"}, "requeue_signal='SIGTERM' already stops the run"},
      {{"./train", "--num-nodes", "0"}, "the program's Trainer options: num_nodes=0 must be >= 1"},
      {{"./train", "--num-nodes", "two"}, "--num-nodes"},
      {{"./train", "--devices"}, "--devices"},
      {{"./train", "--strategy", "dp", "--devices", "2", "--num-nodes", "2"}, "strategy='dp' runs one process"},
      {{"./train", "--config", "/nonexistent/run.yaml"}, "/nonexistent/run.yaml"},
      {{"./train", "--config", write_file("bad_job_config.yaml", "trainer:\n  devices: many\n")},
       "trainer.devices='many' is not accepted"},
  };
  for (const auto& [command, expected] : cases) {
    const std::string text = message(command);
    EXPECT_NE(text.find(expected), std::string::npos) << text;
    EXPECT_NE(text.find("HINT:"), std::string::npos) << text;
  }
}

TEST(CheckJob, AFittingJobHasNoProblems) {
  slurm::JobSpec spec;
  spec.nodes = 2;
  spec.ntasks_per_node = 2;
  spec.time = "01:00:00";
  const Strings program{"./train", "--devices", "2", "--num-nodes", "2"};
  spec.command = program;
  EXPECT_EQ(check_job(spec, program), Strings{});
}

TEST(CheckJob, Ddp2WithTwoDevicesOnTwoNodesFitsOneTaskPerNode) {
  // The regression of issue #11: the hand-written reader wanted two tasks per node here, with a
  // HINT that resolve_run_plan then refused.
  slurm::JobSpec spec;
  spec.nodes = 2;
  spec.ntasks_per_node = 1;
  spec.time = "01:00:00";
  const Strings program{"./train", "--strategy", "ddp2", "--devices", "2", "--num-nodes", "2"};
  spec.command = program;
  EXPECT_EQ(check_job(spec, program), Strings{});
  spec.ntasks_per_node = 2;
  const Strings problems = check_job(spec, program);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("runs 1 process per node (strategy=ddp2)"), std::string::npos) << problems[0];
  EXPECT_NE(problems[0].find("HINT: set ntasks_per_node=1 (volt slurm: --ntasks-per-node)."), std::string::npos)
      << problems[0];
}

TEST(CheckJob, ADeviceMismatchIsAProblemWithAHint) {
  slurm::JobSpec spec;
  spec.nodes = 2;
  spec.ntasks_per_node = 2;
  spec.time = "01:00:00";
  const Strings program{"./train", "--devices", "4", "--num-nodes", "2"};
  spec.command = program;
  const Strings problems = check_job(spec, program);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("HINT:"), std::string::npos) << problems[0];
  EXPECT_NE(problems[0].find('4'), std::string::npos) << problems[0];
}

TEST(CheckJob, ValidateProblemsComeFirst) {
  slurm::JobSpec spec;
  spec.job_name = "bad name";
  spec.time = "01:00:00";
  spec.command = {"./train"};
  const Strings problems = check_job(spec, spec.command);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("job_name"), std::string::npos) << problems[0];
}

}  // namespace
}  // namespace volt::tool
