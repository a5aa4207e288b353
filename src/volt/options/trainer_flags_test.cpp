#include "volt/options/trainer_flags.h"

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>

#include "volt/core/testing.h"
#include "volt/loggers/hparams_yaml.h"
#include "volt/options/cli_config.h"
#include "volt/options/run_main.h"

namespace volt {
namespace {

/// A program with only the Trainer flags.
struct Flags {
  CLI::App app{"test program", "prog"};
  TrainerOptions options;
  TrainerFlagText text;

  Flags() { add_trainer_flags(app, options, text); }

  /// Parses `args` (without the program name) and applies the Trainer flags.
  TrainerOptions& parse(const std::vector<std::string>& args) {
    app.parse(std::vector<std::string>(args.rbegin(), args.rend()));  // CLI11 takes them reversed
    apply_trainer_flags(text, options);
    return options;
  }
};

std::string write_file(const std::string& name, const std::string& text) {
  return volt::testing::write_scratch_file(name, text);
}

/// What parsing `args` throws as a volt::Error.
std::string flag_error(const std::vector<std::string>& args) {
  return volt::testing::error_message([&] { Flags().parse(args); });
}

TEST(TrainerFlags, EnumFlagsParseIntoTheOptionEnums) {
  Flags flags;
  const TrainerOptions& o = flags.parse({"--accelerator", "cuda", "--strategy", "ddp2", "--precision", "bf16",
                                         "--amp-level", "o1", "--process-group-backend", "gloo", "--requeue-signal",
                                         "usr2", "--gradient-clip-algorithm", "value"});
  EXPECT_EQ(o.accelerator, AcceleratorRequest::kGpu);
  EXPECT_EQ(o.strategy, StrategyRequest::kDdp2);
  EXPECT_EQ(o.precision, Precision::kBf16Mixed);
  EXPECT_EQ(o.amp_level, AmpLevel::kO1);
  EXPECT_EQ(o.process_group_backend, ProcessGroupBackend::kGloo);
  EXPECT_EQ(o.requeue_signal, RequeueSignal::kSigUsr2);
  EXPECT_EQ(o.gradient_clip_algorithm, GradientClipAlgorithm::kValue);
  EXPECT_EQ(Flags().parse({"--distributed-backend", "dp"}).strategy, StrategyRequest::kDp);
}

/// The words of `text` (names such as "ddp_find_unused_parameters_true", "16-true", "1f1b").
std::set<std::string> words_of(const std::string& text) {
  std::set<std::string> words;
  const std::regex word("[A-Za-z0-9_-]+");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), word); it != std::sregex_iterator(); ++it)
    words.insert(it->str());
  return words;
}

/// Expects `flag`'s --help text to name every value of `values`.
template <typename E, std::size_t N>
void expect_help_lists(const Flags& flags, const std::string& flag, const E (&values)[N]) {
  const std::string help = flags.app.get_option(flag)->get_description();
  const std::set<std::string> words = words_of(help);
  for (const E value : values)
    EXPECT_EQ(words.count(to_string(value)), 1u) << flag << " omits " << to_string(value) << ": " << help;
}

TEST(TrainerFlags, EveryEnumFlagsHelpListsEveryValue) {
  const Flags flags;
  expect_help_lists(flags, "--accelerator", kAcceleratorRequests);
  expect_help_lists(flags, "--strategy", kStrategyRequests);
  expect_help_lists(flags, "--sharding-strategy", kShardingStrategies);
  expect_help_lists(flags, "--state-dict-type", kStateDictTypes);
  expect_help_lists(flags, "--pipeline-schedule", kPipelineSchedules);
  expect_help_lists(flags, "--precision", kPrecisions);
  expect_help_lists(flags, "--amp-level", kAmpLevels);
  expect_help_lists(flags, "--process-group-backend", kProcessGroupBackends);
  expect_help_lists(flags, "--profiler", kProfilerKinds);
  expect_help_lists(flags, "--gradient-clip-algorithm", kGradientClipAlgorithms);
  expect_help_lists(flags, "--requeue-signal", kRequeueSignals);
  // --deterministic takes no value of its own (it is a flag that also takes a word): its type
  // name lists the words.
  const std::set<std::string> words = words_of(flags.app.get_option("--deterministic")->get_type_name());
  for (const DeterministicMode mode : kDeterministicModes)
    EXPECT_EQ(words.count(to_string(mode)), 1u) << to_string(mode);
  const std::set<std::string> log_model = words_of(flags.app.get_option("--mlflow-log-model")->get_description());
  for (const char* value : {"none", "end", "all"}) EXPECT_EQ(log_model.count(value), 1u) << value;
}

TEST(TrainerFlags, DebuggingFlagsFillTheirOptions) {
  Flags flags;
  const TrainerOptions& o = flags.parse({"--min-steps", "40", "--overfit-batches", "8", "--detect-anomaly",
                                         "--deterministic=warn", "--model-summary-max-depth", "2"});
  EXPECT_EQ(o.min_steps, 40);
  ASSERT_TRUE(o.overfit_batches.has_value());
  EXPECT_FALSE(o.overfit_batches->is_fraction());
  EXPECT_EQ(o.overfit_batches->count(), 8);
  EXPECT_TRUE(o.detect_anomaly);
  EXPECT_EQ(o.deterministic.mode(), DeterministicMode::kWarn);
  EXPECT_EQ(o.model_summary_max_depth, 2);

  const TrainerOptions defaults = Flags().parse({});
  EXPECT_EQ(defaults.min_steps, 0);
  EXPECT_FALSE(defaults.overfit_batches.has_value());
  EXPECT_FALSE(defaults.detect_anomaly);
  EXPECT_EQ(defaults.deterministic.mode(), DeterministicMode::kOff);
  EXPECT_EQ(defaults.model_summary_max_depth, 1);
}

TEST(TrainerFlags, AFlagGivenTwiceTakesTheLastValue) {
  Flags flags;
  const TrainerOptions& o = flags.parse({"--max-epochs", "1", "--devices", "2", "--no-progress-bar", "--max-epochs",
                                         "3", "--devices", "1", "--no-progress-bar"});
  EXPECT_EQ(o.max_epochs, 3);
  EXPECT_EQ(o.devices.count(), 1);
  EXPECT_FALSE(o.enable_progress_bar);
  // The program's own options stay as it made them, unless it asks.
  Flags own;
  int64_t layers = 0;
  own.app.add_option("--n-layer", layers);
  EXPECT_ANY_THROW(own.parse({"--n-layer", "1", "--n-layer", "2"}));
  Flags asked;
  asked.app.add_option("--n-layer", layers);
  take_last_when_repeated(asked.app);
  asked.parse({"--n-layer", "1", "--n-layer", "2"});
  EXPECT_EQ(layers, 2);
}

TEST(TrainerFlags, AnUnknownFlagIsAUsageErrorThatSuggestsTheClosestOne) {
  Flags flags;
  const char* argv[] = {"prog", "--max-epoch", "3", "--acelerator=cpu", "--zzz"};
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(parse_command_line(flags.app, 5, argv), kExitUsage);
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("HINT: --max-epoch: did you mean --max-epochs?"), std::string::npos) << said;
  EXPECT_NE(said.find("HINT: --acelerator: did you mean --accelerator?"), std::string::npos) << said;
  EXPECT_EQ(said.find("--zzz: did you mean"), std::string::npos) << said;
  Flags help;
  const char* asks[] = {"prog", "--help"};
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(parse_command_line(help.app, 2, asks), 0);
  EXPECT_NE(::testing::internal::GetCapturedStdout().find("--max-epochs"), std::string::npos);
  Flags fine;
  const char* good[] = {"prog", "--max-epochs", "1", "--max-epochs", "2"};
  EXPECT_EQ(parse_command_line(fine.app, 5, good), std::nullopt);
}

TEST(TrainerFlags, FaultToleranceFlagsFillTheirOptions) {
  Flags flags;
  const TrainerOptions& o =
      flags.parse({"--snapshot-every-n-steps", "50", "--snapshot-every-n-seconds", "1800", "--snapshots-to-keep", "3",
                   "--no-snapshot-in-memory", "--skip-snapshot-when-busy", "--async-checkpointing", "--max-restarts",
                   "2", "--snapshot-peer-copy"});
  EXPECT_EQ(o.snapshot_every_n_steps, 50);
  EXPECT_EQ(o.snapshot_every_n_seconds, 1800.0);
  EXPECT_EQ(o.snapshots_to_keep, 3);
  EXPECT_FALSE(o.snapshot_in_memory);
  EXPECT_TRUE(o.skip_snapshot_when_busy);
  EXPECT_TRUE(o.async_checkpointing);
  EXPECT_EQ(o.max_restarts, 2);
  EXPECT_TRUE(o.snapshot_peer_copy);
  const TrainerOptions defaults = Flags().parse({});
  EXPECT_FALSE(defaults.snapshot_peer_copy);
  EXPECT_FALSE(defaults.snapshot_every_n_steps.has_value());
  EXPECT_TRUE(defaults.snapshot_in_memory);
  EXPECT_EQ(defaults.max_restarts, 0);
}

TEST(TrainerFlags, BadDebuggingValuesNameTheFlag) {
  std::string message = flag_error({"--deterministic=sometimes"});
  EXPECT_NE(message.find("deterministic='sometimes' is not supported; supported: 'false', 'true', 'warn'"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("HINT"), std::string::npos) << message;
  message = flag_error({"--overfit-batches", "-2"});
  EXPECT_NE(message.find("--overfit-batches='-2' is out of range"), std::string::npos) << message;
}

TEST(TrainerFlags, MlflowFlagsFillTheMlflowOptions) {
  Flags flags;
  const TrainerOptions& o = flags.parse(
      {"--mlflow-tracking-uri", "http://h:5000", "--mlflow-experiment-name", "e", "--mlflow-log-model", "all"});
  ASSERT_TRUE(o.mlflow.has_value());
  EXPECT_EQ(o.mlflow->tracking_uri, "http://h:5000");
  EXPECT_EQ(o.mlflow->experiment_name, "e");
  EXPECT_EQ(o.mlflow->log_model, LogModel::kAll);
  // The experiment alone turns MLflow on, with the server MLFLOW_TRACKING_URI names.
  Flags experiment_only;
  const TrainerOptions& e = experiment_only.parse({"--mlflow-experiment-name", "e"});
  ASSERT_TRUE(e.mlflow.has_value());
  EXPECT_FALSE(e.mlflow->tracking_uri.has_value());
  EXPECT_FALSE(Flags().parse({}).mlflow.has_value());
  EXPECT_NE(flag_error({"--mlflow-log-model", "best"}).find("log_model='best' is not supported"), std::string::npos);
  EXPECT_NE(flag_error({"--mlflow-tracking-uri", "mlruns"}).find("HINT"), std::string::npos);
}

TEST(TrainerFlags, DevicesAndGpusAreDeviceRequests) {
  Flags flags;
  const TrainerOptions& o = flags.parse({"--devices", "0,1", "--gpus", "-1"});
  EXPECT_EQ(o.devices.indices(), (std::vector<int>{0, 1}));
  ASSERT_TRUE(o.gpus.has_value());
  EXPECT_EQ(o.gpus->count(), -1);
}

TEST(TrainerFlags, FlagsNotGivenLeaveTheOptionsAsTheProgramSetThem) {
  Flags flags;
  flags.options.strategy = StrategyRequest::kDdp;
  flags.options.max_steps = 5;
  const TrainerOptions& o = flags.parse({});
  EXPECT_EQ(o.strategy, StrategyRequest::kDdp);
  EXPECT_EQ(o.max_steps, 5);
  EXPECT_FALSE(o.num_threads.has_value());
  EXPECT_FALSE(o.gpus.has_value());
  EXPECT_FALSE(o.amp_level.has_value());
}

TEST(TrainerFlags, MaxStepsAndThreadsAreOptional) {
  EXPECT_EQ(Flags().parse({"--max-steps", "10"}).max_steps, 10);
  EXPECT_EQ(Flags().parse({"--max-steps", "-1"}).max_steps, -1);  // Lightning's "no limit", kept as given
  EXPECT_EQ(Flags().parse({"--num-threads", "2"}).num_threads, 2);
  // 0 is the flag's old "automatic", still in configs printed before: it leaves num_threads unset.
  EXPECT_FALSE(Flags().parse({"--num-threads", "0"}).num_threads.has_value());
  const std::string message = flag_error({"--num-threads", "-2"});
  EXPECT_NE(message.find("--num-threads=-2 must be >= 1"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
}

TEST(TrainerFlags, FsdpFlagsFillTheShardingOptions) {
  Flags flags;
  const TrainerOptions& o =
      flags.parse({"--strategy", "fsdp", "--sharding-strategy", "full_shard", "--fsdp-min-unit-params", "5000"});
  EXPECT_EQ(o.sharding_strategy, ShardingStrategy::kFullShard);
  EXPECT_EQ(o.fsdp_min_unit_params, 5000);
  EXPECT_FALSE(Flags().parse({"--strategy", "fsdp"}).fsdp_min_unit_params.has_value());
}

TEST(TrainerFlags, TuneAllocatorIsUnsetUnlessGivenEitherWay) {
  EXPECT_FALSE(Flags().parse({}).tune_allocator.has_value());
  EXPECT_EQ(Flags().parse({"--tune-allocator"}).tune_allocator, true);
  EXPECT_EQ(Flags().parse({"--no-tune-allocator"}).tune_allocator, false);
  // Printed unset, it reads back unset; printed set, it reads back as it was.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{}, std::vector<std::string>{"--no-tune-allocator"},
        std::vector<std::string>{"--tune-allocator"}}) {
    Flags first;
    const std::optional<bool> given = first.parse(args).tune_allocator;
    const nlohmann::json printed = resolved_config(first.app);
    Flags second;
    const TrainerOptions& o = second.parse({"--config", write_file("tune.yaml", to_hparams_yaml(printed))});
    EXPECT_EQ(o.tune_allocator, given) << to_hparams_yaml(printed);
  }
}

TEST(TrainerFlags, InvalidValuesAreErrorsNamingTheValueWithAHint) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--strategy", "dpp"}, "strategy='dpp' is not supported"},
      {{"--accelerator", "tpu"}, "accelerator='tpu' is not supported"},
      {{"--precision", "8"}, "precision='8' is not a precision"},
      {{"--amp-level", "O7"}, "amp_level='O7'"},
      {{"--process-group-backend", "mpi"}, "process_group_backend='mpi'"},
      {{"--requeue-signal", "TERM"}, "requeue_signal='TERM' already stops the run"},
      {{"--devices", "many"}, "devices='many' is invalid"},
      {{"--gpus", "-3"}, "devices=-3 is invalid"},
      {{"--limit-train-batches", "1.5"}, "--limit-train-batches='1.5' is out of range"},
      {{"--seed", "-1"}, "--seed=-1 must be >= 0"},
      {{"--tune-allocator=maybe"}, "tune_allocator='maybe' is not a switch"},
  };
  for (const auto& [args, expected] : cases) {
    const std::string message = flag_error(args);
    EXPECT_NE(message.find(expected), std::string::npos) << message;
    EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
  }
}

TEST(TrainerFlags, ConfigFilesSetTheEnumsAndNameTheKeyOfABadValue) {
  Flags flags;
  const TrainerOptions& o = flags.parse({"--config", write_file("enums.yaml", R"(
trainer:
  strategy: dp
  precision: bf16-mixed
  devices: 2
  requeue_signal: SIGUSR2
  max_steps: 7
)")});
  EXPECT_EQ(o.strategy, StrategyRequest::kDp);
  EXPECT_EQ(o.precision, Precision::kBf16Mixed);
  EXPECT_EQ(o.devices.count(), 2);
  EXPECT_EQ(o.requeue_signal, RequeueSignal::kSigUsr2);
  EXPECT_EQ(o.max_steps, 7);
  const std::string message = flag_error({"--config", write_file("bad_enum.yaml", "trainer:\n  strategy: dpp\n")});
  EXPECT_NE(message.find("trainer.strategy='dpp' is not accepted"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
}

TEST(TrainerFlags, TheResolvedConfigShowsEveryEnumByName) {
  Flags flags;
  flags.parse({"--strategy", "ddp"});
  const nlohmann::json trainer = resolved_config(flags.app)["trainer"];
  EXPECT_EQ(trainer["accelerator"], "auto");
  EXPECT_EQ(trainer["strategy"], "ddp");
  EXPECT_EQ(trainer["precision"], "32-true");
  EXPECT_EQ(trainer["process_group_backend"], "auto");
  EXPECT_EQ(trainer["requeue_signal"], "SIGUSR1");
  EXPECT_EQ(trainer["gradient_clip_algorithm"], "norm");
  EXPECT_EQ(trainer["max_steps"], nullptr);
  EXPECT_EQ(trainer["num_threads"], nullptr);
  EXPECT_EQ(trainer["gpus"], "");  // unset; read back, '' keeps it unset
  EXPECT_EQ(trainer["amp_level"], "");
}

TEST(TrainerFlags, APrintedConfigReadsBackToTheSameOptions) {
  Flags first;
  first.parse({"--strategy", "ddp2", "--devices", "2", "--num-nodes", "2", "--precision", "bf16-true",
               "--requeue-signal", "SIGHUP", "--max-steps", "9", "--num-threads", "3", "--amp-level", "O2"});
  const nlohmann::json printed = resolved_config(first.app);
  Flags second;
  const TrainerOptions& o = second.parse({"--config", write_file("printed_enums.yaml", to_hparams_yaml(printed))});
  EXPECT_EQ(resolved_config(second.app), printed) << to_hparams_yaml(printed);
  EXPECT_EQ(o.strategy, StrategyRequest::kDdp2);
  EXPECT_EQ(o.precision, Precision::kBf16True);
  EXPECT_EQ(o.requeue_signal, RequeueSignal::kSigHup);
  EXPECT_EQ(o.max_steps, 9);
  EXPECT_EQ(o.num_threads, 3);
  EXPECT_EQ(o.amp_level, AmpLevel::kO2);
}

}  // namespace
}  // namespace volt
