#include "volt/slurm/job_spec.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>

#include "volt/core/testing.h"

namespace volt::slurm {
namespace {

using volt::testing::error_message;

/// A valid spec for tests to break one field of.
JobSpec minimal_spec() {
  JobSpec spec;
  spec.time = "01:00:00";
  spec.command = {"./train"};
  return spec;
}

/// The one problem `validate` finds after `change`; records a failure unless there is exactly one.
std::string only_problem(const std::function<void(JobSpec&)>& change) {
  JobSpec spec = minimal_spec();
  change(spec);
  const std::vector<std::string> problems = validate(spec);
  if (problems.size() != 1) {
    ADD_FAILURE() << "expected one problem, got " << problems.size();
    return problems.empty() ? "" : problems[0];
  }
  EXPECT_NE(problems[0].find("HINT:"), std::string::npos) << problems[0];
  return problems[0];
}

TEST(JobSpec, DefaultsArePinned) {
  const JobSpec spec;
  EXPECT_EQ(spec.job_name, "volt");
  EXPECT_EQ(spec.nodes, 1);
  EXPECT_EQ(spec.ntasks_per_node, 1);
  EXPECT_EQ(spec.gpus_per_node, 0);
  EXPECT_EQ(spec.output, "slurm-%j.out");
  EXPECT_EQ(spec.error, "slurm-%j.out");
  EXPECT_TRUE(spec.open_mode_append);
  EXPECT_EQ(spec.signal, "USR1");
  EXPECT_EQ(spec.signal_lead_seconds, 90);
  EXPECT_FALSE(spec.signal_to_batch_shell_only);
  EXPECT_TRUE(spec.requeue);
  EXPECT_FALSE(spec.array.has_value());
}

TEST(JobSpec, DefaultsWithACommandAndATimeAreValid) { EXPECT_TRUE(validate(minimal_spec()).empty()); }

TEST(JobScript, TypicalTwoNodeGpuJobRendersThisWholeScript) {
  JobSpec spec;
  spec.job_name = "mnist-ddp";
  spec.nodes = 2;
  spec.ntasks_per_node = 4;
  spec.gpus_per_node = 4;
  spec.gpu_type = "a100";
  spec.cpus_per_task = 8;
  spec.mem = "64G";
  spec.time = "1-00:00:00";
  spec.partition = "gpu";
  spec.account = "proj42";
  spec.qos = "normal";
  spec.output = "logs/%x-%j.out";
  spec.error = "logs/%x-%j.err";
  spec.modules = {"cuda/12.1", "gcc/12"};
  spec.env = {{"NCCL_DEBUG", "INFO"}, {"OMP_NUM_THREADS", "8"}};
  spec.setup = {"cd \"$SLURM_SUBMIT_DIR\"", "export MASTER_PORT=$((10000 + SLURM_JOB_ID % 20000))"};
  spec.extra_sbatch = {"--exclusive"};
  spec.command = {"./train", "--devices", "4", "--num_nodes", "2", "--run_name", "first try"};
  EXPECT_EQ(render_sbatch_script(spec),
            "#!/bin/bash\n"
            "#SBATCH --job-name=mnist-ddp\n"
            "#SBATCH --nodes=2\n"
            "#SBATCH --ntasks-per-node=4\n"
            "#SBATCH --gres=gpu:a100:4\n"
            "#SBATCH --cpus-per-task=8\n"
            "#SBATCH --mem=64G\n"
            "#SBATCH --time=1-00:00:00\n"
            "#SBATCH --partition=gpu\n"
            "#SBATCH --account=proj42\n"
            "#SBATCH --qos=normal\n"
            "#SBATCH --output=logs/%x-%j.out\n"
            "#SBATCH --error=logs/%x-%j.err\n"
            "#SBATCH --open-mode=append\n"
            "#SBATCH --signal=USR1@90\n"
            "#SBATCH --requeue\n"
            "#SBATCH --exclusive\n"
            "\n"
            "set -eo pipefail\n"
            "\n"
            "module load cuda/12.1\n"
            "module load gcc/12\n"
            "export NCCL_DEBUG=INFO\n"
            "export OMP_NUM_THREADS=8\n"
            "cd \"$SLURM_SUBMIT_DIR\"\n"
            "export MASTER_PORT=$((10000 + SLURM_JOB_ID % 20000))\n"
            "\n"
            "srun ./train --devices 4 --num_nodes 2 --run_name 'first try'\n");
}

TEST(JobScript, UnsetOptionsWriteNoLines) {
  JobSpec spec;
  spec.requeue = false;
  spec.signal = "";
  spec.output = "";
  spec.error = "";
  spec.open_mode_append = false;
  spec.command = {"./train"};
  EXPECT_EQ(render_sbatch_script(spec),
            "#!/bin/bash\n"
            "#SBATCH --job-name=volt\n"
            "#SBATCH --nodes=1\n"
            "#SBATCH --ntasks-per-node=1\n"
            "\n"
            "set -eo pipefail\n"
            "\n"
            "srun ./train\n");
}

TEST(JobScript, SignalGoesToTheSrunStepsNotOnlyTheBatchShell) {
  JobSpec spec = minimal_spec();
  EXPECT_NE(render_sbatch_script(spec).find("#SBATCH --signal=USR1@90\n"), std::string::npos);
  spec.signal_to_batch_shell_only = true;
  spec.signal = "USR2";
  spec.signal_lead_seconds = 120;
  EXPECT_NE(render_sbatch_script(spec).find("#SBATCH --signal=B:USR2@120\n"), std::string::npos);
}

TEST(JobScript, GresNamesTheGpuTypeOnlyWhenGiven) {
  JobSpec spec = minimal_spec();
  spec.gpus_per_node = 2;
  EXPECT_NE(render_sbatch_script(spec).find("#SBATCH --gres=gpu:2\n"), std::string::npos);
  spec.gpu_type = "h100";
  EXPECT_NE(render_sbatch_script(spec).find("#SBATCH --gres=gpu:h100:2\n"), std::string::npos);
}

TEST(JobScript, ArrayRangeComesFromSizeAndParallelism) {
  EXPECT_EQ(array_range({4, 2}), "0-3%2");
  EXPECT_EQ(array_range({4, 0}), "0-3");
  EXPECT_EQ(array_range({1, 0}), "0");
  JobSpec spec = minimal_spec();
  spec.array = ArraySpec{10, 3};
  EXPECT_NE(render_sbatch_script(spec).find("#SBATCH --requeue\n#SBATCH --array=0-9%3\n"), std::string::npos);
}

TEST(JobScript, EnvironmentValuesAreLiteral) {
  JobSpec spec = minimal_spec();
  spec.env = {{"GREETING", "it's $HOME"}};
  EXPECT_NE(render_sbatch_script(spec).find("export GREETING='it'\\''s $HOME'\n"), std::string::npos);
}

TEST(JobScript, RenderingAnInvalidSpecListsEveryProblem) {
  JobSpec spec;  // no time with requeue, no command
  spec.nodes = 0;
  const std::string message = error_message([&] { render_sbatch_script(spec); });
  EXPECT_NE(message.find("the sbatch job 'volt' has 3 problems:"), std::string::npos) << message;
  EXPECT_NE(message.find("\n  - nodes=0"), std::string::npos) << message;
  EXPECT_NE(message.find("\n  - requeue=true but time is empty"), std::string::npos) << message;
  EXPECT_NE(message.find("\n  - command is empty"), std::string::npos) << message;
}

TEST(ShellQuote, SafeWordsStayAsTheyAre) {
  EXPECT_EQ(shell_quote("./train"), "./train");
  EXPECT_EQ(shell_quote("--lr=0.001"), "--lr=0.001");
  EXPECT_EQ(shell_quote("a@b%c+d,e:f"), "a@b%c+d,e:f");
}

TEST(ShellQuote, OtherWordsAreSingleQuoted) {
  EXPECT_EQ(shell_quote(""), "''");
  EXPECT_EQ(shell_quote("first try"), "'first try'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote("$HOME"), "'$HOME'");
  EXPECT_EQ(shell_quote("a\"b"), "'a\"b'");
}

TEST(ShellQuote, BashReadsEachQuotedWordBackAsOneArgument) {
  if (access("/bin/bash", X_OK) != 0) GTEST_SKIP() << "needs /bin/bash";
  const std::vector<std::string> words = {"plain", "two words",   "it's",           "\"dq\"", "$HOME `id` $(id)",
                                          "",      "back\\slash", "semi;colon&amp", "*",      "line\nbreak"};
  std::string command = "/bin/bash -c 'printf \"<%s>\" \"$@\"' bash";
  std::string expected;
  for (const auto& word : words) {
    command += " " + shell_quote(word);
    expected += "<" + word + ">";
  }
  // `command` is itself read by /bin/sh, which quotes like bash for single-quoted words.
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  std::array<char, 256> buffer{};
  while (std::fgets(buffer.data(), buffer.size(), pipe) != nullptr) output += buffer.data();
  ASSERT_EQ(pclose(pipe), 0);
  EXPECT_EQ(output, expected);
}

TEST(TimeLimit, AcceptsEverySlurmForm) {
  EXPECT_EQ(parse_time_limit("90"), 90 * 60);
  EXPECT_EQ(parse_time_limit("10:30"), 10 * 60 + 30);
  EXPECT_EQ(parse_time_limit("02:00:00"), 2 * 3600);
  EXPECT_EQ(parse_time_limit("1-12"), 36 * 3600);
  EXPECT_EQ(parse_time_limit("1-12:30"), 36 * 3600 + 30 * 60);
  EXPECT_EQ(parse_time_limit("2-00:00:05"), 48 * 3600 + 5);
  EXPECT_EQ(parse_time_limit("48:00:00"), 48 * 3600);
}

TEST(TimeLimit, RejectsOtherText) {
  for (const char* text : {"", "0", "00:00:00", "1h", "1:2:3:4", "1-24:00:00", "01:60:00", "10:60", "-5", "1-",
                           "a-01:00:00", "1:-1", "2 hours", "1.5"}) {
    EXPECT_FALSE(parse_time_limit(text).has_value()) << text;
  }
}

std::string text_of(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// Runs `script` with bash, `srun` standing for a function that runs its command; returns the
/// exit status.
int run_with_fake_srun(const std::string& script, const std::string& dir) {
  const std::string path = dir + "/job.sh";
  FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) return -1;
  std::fputs(("srun() { \"$@\"; }\n" + script).c_str(), file);
  std::fclose(file);
  const int status = std::system(("/bin/bash " + path + " 2>" + dir + "/stderr").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(JobScript, MaxRestartsRunsAFailedStepAgainWithItsAttemptNumber) {
  if (access("/bin/bash", X_OK) != 0) GTEST_SKIP() << "needs /bin/bash";
  const volt::testing::TempDir temp;
  const std::string dir = temp.path().string();
  JobSpec spec = minimal_spec();
  spec.max_restarts = 2;
  // Fails in attempts 0 and 1, as a killed task would; attempt 2 finishes.
  spec.command = {"/bin/sh", "-c",
                  "echo $VOLT_RESTART_COUNT >> " + dir + "/attempts; [ $VOLT_RESTART_COUNT -ge 2 ] || exit 3"};
  EXPECT_EQ(run_with_fake_srun(render_sbatch_script(spec), dir), 0);
  EXPECT_EQ(text_of(dir + "/attempts"), "0\n1\n2\n");
  EXPECT_NE(text_of(dir + "/stderr").find("starting it again (restart 2 of 2)"), std::string::npos);

  // One restart is not enough: the job fails with the step's exit code, saying so.
  spec.max_restarts = 1;
  std::remove((dir + "/attempts").c_str());
  EXPECT_EQ(run_with_fake_srun(render_sbatch_script(spec), dir), 3);
  EXPECT_EQ(text_of(dir + "/attempts"), "0\n1\n");
  EXPECT_NE(text_of(dir + "/stderr").find("exit code 3 after 1 restarts; giving up"), std::string::npos);

  spec.max_restarts = 0;
  EXPECT_EQ(render_sbatch_script(spec).find("while true"), std::string::npos) << "one srun line, as before";
}

TEST(JobSpecValidation, EachProblemNamesTheFieldAndWhatWasGiven) {
  EXPECT_NE(only_problem([](JobSpec& s) { s.max_restarts = -1; }).find("max_restarts=-1 is negative"),
            std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) { s.job_name = "my job"; }).find("job_name='my job'"), std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) { s.job_name = "my job"; }).find("'my_job'"), std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) { s.job_name = ""; }).find("job_name=''"), std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) { s.nodes = 0; }).find("nodes=0 is not allowed"), std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) { s.ntasks_per_node = -1; }).find("ntasks_per_node=-1"), std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) { s.gpus_per_node = -2; }).find("gpus_per_node=-2"), std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) { s.gpu_type = "a100"; }).find("gpu_type='a100' is set but gpus_per_node=0"),
            std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) {
              s.gpus_per_node = 1;
              s.gpu_type = "a 100";
            }).find("gpu_type='a 100' has characters"),
            std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) { s.cpus_per_task = 0; }).find("cpus_per_task=0"), std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) { s.mem = "16GB"; }).find("mem='16GB' is not a memory size"),
            std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) { s.time = "2h"; }).find("time='2h' is not a SLURM time limit"),
            std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) { s.time = ""; }).find("requeue=true but time is empty"), std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) { s.partition = "gpu long"; }).find("partition='gpu long'"), std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) { s.account = "a;rm"; }).find("account='a;rm'"), std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) { s.qos = "$(x)"; }).find("qos='$(x)'"), std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) { s.output = "my logs/%j.out"; }).find("output='my logs/%j.out' has spaces"),
            std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) { s.error = "run-%q.err"; }).find("the pattern '%q'"), std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) { s.signal = "SIGUSR1"; }).find("write 'USR1' without 'SIG'"),
            std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) { s.signal = "KILL"; }).find("signal='KILL' is not a signal"),
            std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) { s.signal_lead_seconds = 0; }).find("signal_lead_seconds=0 is out of range"),
            std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) {
              s.time = "10:00";
              s.signal_lead_seconds = 600;
            }).find("signal_lead_seconds=600 is not below time='10:00' (600 s)"),
            std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) { s.modules = {"cuda 12"}; }).find("modules[0]='cuda 12'"), std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) {
              s.extra_sbatch = {"#SBATCH --exclusive"};
            }).find("extra_sbatch[0]='#SBATCH --exclusive' is not one sbatch option"),
            std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) { s.env = {{"NCCL-DEBUG", "INFO"}}; }).find("'NCCL-DEBUG'"), std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) { s.setup = {"a\nb"}; }).find("setup[0] spans several lines"),
            std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) { s.command = {}; }).find("command is empty"), std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) { s.command = {"", "x"}; }).find("command is empty"), std::string::npos);
  EXPECT_NE(only_problem([](JobSpec& s) { s.array = ArraySpec{0, 0}; }).find("array has size=0"), std::string::npos);
}

TEST(JobSpecValidation, OutputPatternsSlurmExpandsAreAccepted) {
  JobSpec spec = minimal_spec();
  spec.output = "logs/%x_%A_%3a_%j_%u_%N_100%%.out";
  spec.mem = "0";
  spec.requeue = false;
  spec.time = "";
  spec.signal = "TERM";
  EXPECT_TRUE(validate(spec).empty());
}

}  // namespace
}  // namespace volt::slurm
