#include "job_flags.h"

#include <gtest/gtest.h>

#include <fstream>

#include "volt/core/testing.h"

namespace volt::tool {
namespace {

using volt::testing::error_message;
using Strings = std::vector<std::string>;

/// The JobSpec `args` (flags after the program name) resolve to.
slurm::JobSpec parse(Strings args) {
  CLI::App app;
  JobFlags flags;
  flags.add_to(app);
  args.insert(args.begin(), "volt");
  std::vector<const char*> argv;
  for (const auto& arg : args) argv.push_back(arg.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  return flags.resolve();
}

TEST(JobFlags, NoFlagsGiveJobSpecDefaults) {
  const slurm::JobSpec spec = parse({});
  const slurm::JobSpec defaults;
  EXPECT_EQ(spec.job_name, defaults.job_name);
  EXPECT_EQ(spec.nodes, 1);
  EXPECT_EQ(spec.signal, "USR1");
  EXPECT_TRUE(spec.requeue);
  EXPECT_EQ(spec.output, defaults.output);
}

TEST(JobFlags, EachFlagSetsItsField) {
  const slurm::JobSpec spec = parse({"--job-name",
                                     "mnist",
                                     "--nodes",
                                     "2",
                                     "--ntasks-per-node",
                                     "4",
                                     "--gpus-per-node",
                                     "4",
                                     "--gpu-type",
                                     "a100",
                                     "--cpus-per-task",
                                     "8",
                                     "--mem",
                                     "64G",
                                     "--time",
                                     "02:00:00",
                                     "--partition",
                                     "gpu",
                                     "--account",
                                     "lab",
                                     "--qos",
                                     "high",
                                     "--output",
                                     "logs/%j.out",
                                     "--error",
                                     "logs/%j.err",
                                     "--signal",
                                     "SIGUSR2",
                                     "--signal-lead",
                                     "120",
                                     "--signal-batch-only",
                                     "--no-requeue",
                                     "--module",
                                     "cuda/12.1",
                                     "--module",
                                     "gcc/12",
                                     "--setup",
                                     "source venv/bin/activate",
                                     "--sbatch=--exclusive",
                                     "--export",
                                     "NCCL_DEBUG=INFO",
                                     "--export",
                                     "A=b=c"});
  EXPECT_EQ(spec.job_name, "mnist");
  EXPECT_EQ(spec.nodes, 2);
  EXPECT_EQ(spec.ntasks_per_node, 4);
  EXPECT_EQ(spec.gpus_per_node, 4);
  EXPECT_EQ(spec.gpu_type, "a100");
  EXPECT_EQ(spec.cpus_per_task, 8);
  EXPECT_EQ(spec.mem, "64G");
  EXPECT_EQ(spec.time, "02:00:00");
  EXPECT_EQ(spec.partition, "gpu");
  EXPECT_EQ(spec.account, "lab");
  EXPECT_EQ(spec.qos, "high");
  EXPECT_EQ(spec.output, "logs/%j.out");
  EXPECT_EQ(spec.error, "logs/%j.err");
  EXPECT_EQ(spec.signal, "USR2");
  EXPECT_EQ(spec.signal_lead_seconds, 120);
  EXPECT_TRUE(spec.signal_to_batch_shell_only);
  EXPECT_FALSE(spec.requeue);
  EXPECT_EQ(spec.modules, (Strings{"cuda/12.1", "gcc/12"}));
  EXPECT_EQ(spec.setup, (Strings{"source venv/bin/activate"}));
  EXPECT_EQ(spec.extra_sbatch, (Strings{"--exclusive"}));
  EXPECT_EQ(spec.env, (std::map<std::string, std::string>{{"A", "b=c"}, {"NCCL_DEBUG", "INFO"}}));
}

TEST(JobFlags, RepeatableFlagsLeaveTheProgramAfterTheSeparatorAlone) {
  CLI::App app;
  JobFlags flags;
  flags.add_to(app);
  Strings program;
  app.add_option("program", program);
  const std::vector<const char*> argv{"volt", "--module", "a", "--module", "b", "--", "./train", "--devices", "2"};
  app.parse(static_cast<int>(argv.size()), argv.data());
  EXPECT_EQ(flags.resolve().modules, (Strings{"a", "b"}));
  EXPECT_EQ(program, (Strings{"./train", "--devices", "2"}));
}

TEST(JobFlags, TheLastValueOfAFlagWins) { EXPECT_EQ(parse({"--nodes", "2", "--nodes", "3"}).nodes, 3); }

TEST(JobFlags, BadNumbersNameTheFlagAndValue) {
  const std::string message = error_message([] { parse({"--nodes", "two"}); });
  EXPECT_NE(message.find("--nodes='two' is not a whole number >= 1"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT:"), std::string::npos);
  EXPECT_NE(error_message([] { parse({"--gpus-per-node", "-1"}); }).find("--gpus-per-node='-1'"), std::string::npos);
}

TEST(JobFlags, ExportsNeedANameAndAnEqualsSign) {
  EXPECT_NE(error_message([] { parse({"--export", "NCCL_DEBUG"}); }).find("expected NAME=VALUE"), std::string::npos);
  EXPECT_NE(error_message([] { parse({"--export", "1X=2"}); }).find("names the variable '1X'"), std::string::npos);
}

TEST(JobFlags, AJobFileSetsTheSameKeysAndFlagsWin) {
  const std::string path = ::testing::TempDir() + "/volt_job_flags_test.json";
  std::ofstream(path) << R"({"nodes": 2, "ntasks_per_node": 2, "time": "01:00:00", "module": ["cuda"],
                             "export": {"OMP_NUM_THREADS": 4}, "no-requeue": true})";
  const slurm::JobSpec spec = parse({"--job-file", path, "--nodes", "3", "--module", "gcc"});
  EXPECT_EQ(spec.nodes, 3);
  EXPECT_EQ(spec.ntasks_per_node, 2);
  EXPECT_EQ(spec.time, "01:00:00");
  EXPECT_EQ(spec.modules, (Strings{"cuda", "gcc"}));
  EXPECT_EQ(spec.env.at("OMP_NUM_THREADS"), "4");
  EXPECT_FALSE(spec.requeue);
}

TEST(JobFlags, AJobFileRejectsUnknownKeysAndBadJson) {
  slurm::JobSpec spec;
  const std::string unknown = error_message([&] { apply_job_json(spec, R"({"gpus": 2})", "job.json"); });
  EXPECT_NE(unknown.find("job.json: unknown key \"gpus\"; expected one of: job-name, nodes"), std::string::npos)
      << unknown;
  EXPECT_NE(error_message([&] { apply_job_json(spec, "{nodes: 2}", "job.json"); }).find("is not valid JSON"),
            std::string::npos);
  EXPECT_NE(error_message([&] { apply_job_json(spec, "[1]", "job.json"); }).find("expected a JSON object"),
            std::string::npos);
  EXPECT_NE(error_message([&] { apply_job_json(spec, R"({"nodes": 1.5})", "job.json"); }).find("\"nodes\" is 1.5"),
            std::string::npos);
}

}  // namespace
}  // namespace volt::tool
