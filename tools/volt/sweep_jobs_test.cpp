#include "sweep_jobs.h"

#include <gtest/gtest.h>

#include "trainer_shape.h"
#include "volt/core/testing.h"

namespace volt::tool {
namespace {

using volt::testing::error_message;
using Strings = std::vector<std::string>;

SweepJobOptions options() {
  SweepJobOptions o;
  o.volt_executable = "/opt/volt/bin/volt";
  o.layout.root = "/sweeps/lr";
  o.max_parallel = 2;
  o.program = {"./train", "--max-epochs", "3"};
  return o;
}

slurm::JobSpec base() {
  slurm::JobSpec spec;
  spec.job_name = "lr";
  spec.time = "01:00:00";
  return spec;
}

std::vector<slurm::Trial> two_by_two() {
  return slurm::expand_sweep(
      {slurm::SweepParameter::choice("lr", {0.1, 0.01}), slurm::SweepParameter::int_range("layers", 2, 4, 2)},
      slurm::SearchKind::kGrid, 0, 0);
}

TEST(SweepLayout, PathsAreUnderTheRoot) {
  const SweepLayout layout{"/sweeps/lr"};
  EXPECT_EQ(layout.manifest(), "/sweeps/lr/manifest.json");
  EXPECT_EQ(layout.jobs_file(), "/sweeps/lr/jobs.json");
  EXPECT_EQ(layout.logs_dir(), "/sweeps/lr/logs");
}

TEST(SweepArrayJob, RendersOneArrayRunningRunTrial) {
  const slurm::JobSpec spec = sweep_array_job(base(), options(), static_cast<int64_t>(two_by_two().size()));
  const std::string script = slurm::render_sbatch_script(spec);
  EXPECT_NE(script.find("#SBATCH --array=0-3%2\n"), std::string::npos) << script;
  EXPECT_NE(script.find("#SBATCH --output=/sweeps/lr/logs/slurm-%A_%a.out\n"), std::string::npos) << script;
  EXPECT_NE(script.find("srun /opt/volt/bin/volt sweep run-trial --manifest /sweeps/lr/manifest.json --out "
                        "/sweeps/lr -- ./train --max-epochs 3\n"),
            std::string::npos)
      << script;
  EXPECT_EQ(check_job(spec, options().program), Strings{});
}

TEST(SweepArrayJob, KeepsLogPathsTheUserChose) {
  slurm::JobSpec custom = base();
  custom.output = "logs/%A_%a.log";
  EXPECT_EQ(sweep_array_job(custom, options(), 4).output, "logs/%A_%a.log");
}

TEST(TrialJob, RunsOneTrialByIndex) {
  const auto trials = two_by_two();
  const slurm::JobSpec spec = trial_job(base(), options(), trials[3]);
  EXPECT_EQ(spec.job_name, "lr-trial_003");
  EXPECT_FALSE(spec.array.has_value());
  EXPECT_EQ(spec.output, "/sweeps/lr/logs/trial_003-%j.out");
  EXPECT_EQ(spec.command, (Strings{"/opt/volt/bin/volt", "sweep", "run-trial", "--manifest", "/sweeps/lr/manifest.json",
                                   "--out", "/sweeps/lr", "--index", "3", "--", "./train", "--max-epochs", "3"}));
}

TEST(RunTrialArgv, AppendsTheTrialFlagsAndItsOwnRootDir) {
  const auto trials = two_by_two();
  EXPECT_EQ(run_trial_argv({"./train", "--devices", "2"}, trials[1], "/sweeps/lr"),
            (Strings{"./train", "--devices", "2", "--lr", "0.1", "--layers", "4", "--default-root-dir",
                     "/sweeps/lr/trial_001"}));
}

TEST(ResolveTrialIndex, TheFlagWinsOverTheArrayTaskId) {
  const Env env(Env::Vars{{"SLURM_ARRAY_TASK_ID", "3"}});
  EXPECT_EQ(resolve_trial_index(1, env), 1);
  EXPECT_EQ(resolve_trial_index(std::nullopt, env), 3);
}

TEST(ResolveTrialIndex, NeitherIsAnErrorWithAHint) {
  const std::string message = error_message([] { resolve_trial_index(std::nullopt, Env()); });
  EXPECT_NE(message.find("neither --index nor SLURM_ARRAY_TASK_ID is set"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT:"), std::string::npos);
  EXPECT_NE(error_message([] {
              resolve_trial_index(std::nullopt, Env(Env::Vars{{"SLURM_ARRAY_TASK_ID", "x"}}));
            }).find("SLURM_ARRAY_TASK_ID='x' is not a trial index"),
            std::string::npos);
  EXPECT_NE(error_message([] { resolve_trial_index(-1, Env()); }).find("--index -1 is negative"), std::string::npos);
}

TEST(CheckProgramForSweep, FlagsTheSweepSetsMayNotBeInTheProgram) {
  const std::vector<slurm::SweepParameter> parameters{slurm::SweepParameter::choice("lr", {0.1})};
  EXPECT_EQ(check_program_for_sweep({"./train", "--max-epochs", "3"}, parameters), Strings{});
  const Strings problems = check_program_for_sweep({"./train", "--lr=0.5", "--default-root-dir", "x"}, parameters);
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_NE(problems[0].find("set --lr=0.5, which the sweep sets per trial"), std::string::npos) << problems[0];
  EXPECT_NE(problems[1].find("--default-root-dir"), std::string::npos) << problems[1];
}

TEST(JobsFile, RoundTrips) {
  const std::vector<JobRecord> jobs{{0, "123_0"}, {1, "123_1"}};
  const auto parsed = parse_jobs_file(render_jobs_file(jobs), "jobs.json");
  ASSERT_EQ(parsed.size(), 2u);
  EXPECT_EQ(parsed[1].index, 1);
  EXPECT_EQ(parsed[1].job_id, "123_1");
  EXPECT_NE(error_message([] { parse_jobs_file("{}", "x/jobs.json"); }).find("x/jobs.json is not a jobs file"),
            std::string::npos);
  EXPECT_NE(error_message([] { parse_jobs_file("nope", "x/jobs.json"); }).find("HINT:"), std::string::npos);
}

TEST(SbatchJobId, ParsableOutputMayNameACluster) {
  EXPECT_EQ(parse_sbatch_job_id("12345\n"), "12345");
  EXPECT_EQ(parse_sbatch_job_id("12345;cluster\n"), "12345");
  EXPECT_NE(error_message([] { parse_sbatch_job_id("Submitted batch job 1"); }).find("expected a job id"),
            std::string::npos);
}

}  // namespace
}  // namespace volt::tool
