#include "trainer_shape.h"

#include <gtest/gtest.h>

#include "volt/core/testing.h"

namespace volt::tool {
namespace {

using volt::testing::error_message;
using Strings = std::vector<std::string>;

TEST(TrainerShapeFromCommand, DefaultsAreTheTrainersDefaults) {
  const slurm::TrainerShape shape = trainer_shape_from_command({"./train"}, {});
  EXPECT_EQ(shape.devices, 1);
  EXPECT_EQ(shape.num_nodes, 1);
  EXPECT_FALSE(shape.uses_gpus);
  EXPECT_TRUE(shape.auto_requeue);
  EXPECT_EQ(shape.requeue_signal, "USR1");
}

TEST(TrainerShapeFromCommand, ReadsTheTrainerFlagsInBothForms) {
  const slurm::TrainerShape shape =
      trainer_shape_from_command({"./train", "--devices", "4", "--num-nodes=2", "--accelerator", "gpu",
                                  "--no-auto-requeue", "--requeue-signal", "SIGUSR2"},
                                 {});
  EXPECT_EQ(shape.devices, 4);
  EXPECT_EQ(shape.num_nodes, 2);
  EXPECT_TRUE(shape.uses_gpus);
  EXPECT_FALSE(shape.auto_requeue);
  EXPECT_EQ(shape.requeue_signal, "USR2");
}

TEST(TrainerShapeFromCommand, AcceptsLightningsOtherNodeFlagNames) {
  EXPECT_EQ(trainer_shape_from_command({"./train", "--num_nodes", "3"}, {}).num_nodes, 3);
  EXPECT_EQ(trainer_shape_from_command({"./train", "--nb-gpu-nodes", "4"}, {}).num_nodes, 4);
}

TEST(TrainerShapeFromCommand, DeviceListsCountAndAutoTakesTheTasksPerNode) {
  slurm::JobSpec spec;
  spec.ntasks_per_node = 3;
  EXPECT_EQ(trainer_shape_from_command({"./train", "--devices", "0,1"}, spec).devices, 2);
  EXPECT_EQ(trainer_shape_from_command({"./train", "--devices=auto"}, spec).devices, 3);
  EXPECT_EQ(trainer_shape_from_command({"./train", "--devices", "-1"}, spec).devices, 3);
}

TEST(TrainerShapeFromCommand, AutoAcceleratorUsesGpusWhenTheJobHasThem) {
  slurm::JobSpec spec;
  EXPECT_FALSE(trainer_shape_from_command({"./train", "--accelerator", "auto"}, spec).uses_gpus);
  spec.gpus_per_node = 2;
  EXPECT_TRUE(trainer_shape_from_command({"./train", "--accelerator", "auto"}, spec).uses_gpus);
  EXPECT_TRUE(trainer_shape_from_command({"./train", "--accelerator=cuda"}, {}).uses_gpus);
}

TEST(TrainerShapeFromCommand, TheLaterRequeueSwitchWins) {
  EXPECT_TRUE(trainer_shape_from_command({"./train", "--no-auto-requeue", "--auto-requeue"}, {}).auto_requeue);
  EXPECT_FALSE(trainer_shape_from_command({"./train", "--auto-requeue", "--no-auto-requeue"}, {}).auto_requeue);
}

TEST(TrainerShapeFromCommand, TheProgramNameIsNotAFlag) {
  EXPECT_EQ(trainer_shape_from_command({"--devices", "4"}, {}).devices, 1);
}

TEST(TrainerShapeFromCommand, MalformedValuesNameTheFlag) {
  EXPECT_NE(error_message([] {
              trainer_shape_from_command({"./train", "--devices", "many"}, {});
            }).find("the program's --devices='many' is not a device count"),
            std::string::npos);
  EXPECT_NE(error_message([] {
              trainer_shape_from_command({"./train", "--num-nodes", "0"}, {});
            }).find("--num-nodes='0' is not a node count"),
            std::string::npos);
  EXPECT_NE(error_message([] {
              trainer_shape_from_command({"./train", "--devices"}, {});
            }).find("has no value"),
            std::string::npos);
  EXPECT_NE(error_message([] {
              trainer_shape_from_command({"./train", "--accelerator", "tpu"}, {});
            }).find("expected gpu, cuda, cpu or auto"),
            std::string::npos);
}

TEST(NormalizeSignal, DropsSigAndUppercases) {
  EXPECT_EQ(normalize_signal("SIGUSR2"), "USR2");
  EXPECT_EQ(normalize_signal("usr1"), "USR1");
  EXPECT_EQ(normalize_signal("sigterm"), "TERM");
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
