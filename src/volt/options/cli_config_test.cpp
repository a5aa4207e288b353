#include "volt/options/cli_config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "volt/core/error.h"
#include "volt/core/testing.h"
#include "volt/loggers/hparams_yaml.h"
#include "volt/options/trainer_flags.h"

namespace volt {
namespace {

/// A program like examples/fashion_mnist: the Trainer flags plus its own model and data flags.
struct Program {
  CLI::App app{"test program", "prog"};
  TrainerOptions trainer;
  TrainerFlagText text;
  std::string model = "mlp";
  double lr = 1e-3;
  int64_t batch_size = 64;
  int64_t save_top_k = 1;
  bool skip_test = false;

  Program() {
    add_trainer_flags(app, trainer, text);
    app.add_option("--model", model, "mlp or cnn")->capture_default_str()->group("Model");
    app.add_option("--lr", lr, "learning rate")->capture_default_str()->group("Model");
    app.add_option("--batch-size", batch_size, "batch size")->capture_default_str()->group("Data");
    app.add_option("--save-top-k", save_top_k, "checkpoints kept");
    app.add_flag("--no-test", skip_test, "skip the test set");
  }

  /// Parses `args` as a command line (without the program name) and applies the Trainer flags.
  void parse(const std::vector<std::string>& args) {
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them reversed
    app.parse(reversed);
    apply_trainer_flags(text, trainer);
  }
};

std::string write_file(const std::string& name, const std::string& text) {
  return volt::testing::write_scratch_file(name, text);
}

/// The message of the volt::Error that parsing `yaml` as a config file throws ("" if none).
std::string config_error(const std::string& yaml) {
  Program program;
  try {
    program.parse({"--config", write_file("bad.yaml", yaml)});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CliConfig, FileSetsTrainerModelDataAndTopLevelOptions) {
  Program p;
  p.parse({"--config", write_file("run.yaml", R"(
trainer:
  max_epochs: 3
  limit_train_batches: 0.25
  devices: [0, 1]
  deterministic: true
  logger: false
  gradient_clip_val: 0.5
model:
  model: cnn
  lr: 0.01
data:
  batch_size: 32
save_top_k: 2
no_test: yes
)")});
  EXPECT_EQ(p.trainer.max_epochs, 3);
  EXPECT_TRUE(p.trainer.limit_train_batches.is_fraction());
  EXPECT_DOUBLE_EQ(p.trainer.limit_train_batches.fraction(), 0.25);
  EXPECT_EQ(p.trainer.devices.indices(), (std::vector<int>{0, 1}));
  EXPECT_EQ(p.trainer.deterministic.mode(), DeterministicMode::kOn);
  EXPECT_FALSE(p.trainer.logger);
  EXPECT_EQ(p.trainer.gradient_clip_val, 0.5);
  EXPECT_EQ(p.model, "cnn");
  EXPECT_DOUBLE_EQ(p.lr, 0.01);
  EXPECT_EQ(p.batch_size, 32);
  EXPECT_EQ(p.save_top_k, 2);
  EXPECT_TRUE(p.skip_test);
}

TEST(CliConfig, FlagsOverrideTheFile) {
  Program p;
  const std::string file = write_file("override.yaml", R"(
trainer: {max_epochs: 3, logger: false, limit_train_batches: 0.5}
model: {lr: 0.01}
)");
  p.parse({"--max-epochs", "1", "--config", file, "--logger", "--lr", "0.5"});
  EXPECT_EQ(p.trainer.max_epochs, 1);
  EXPECT_TRUE(p.trainer.logger);
  EXPECT_DOUBLE_EQ(p.lr, 0.5);
  EXPECT_DOUBLE_EQ(p.trainer.limit_train_batches.fraction(), 0.5);  // from the file: no flag
}

TEST(CliConfig, KeysMayUseDashesAliasesAndNegations) {
  Program p;
  p.parse({"--config", write_file("names.yaml", R"(
trainer:
  max-epochs: 2
  distributed_backend: ddp
  no_logger: true
)")});
  EXPECT_EQ(p.trainer.max_epochs, 2);
  EXPECT_EQ(p.trainer.strategy, StrategyRequest::kDdp);
  EXPECT_FALSE(p.trainer.logger);
}

TEST(CliConfig, NullAndEmptyFilesKeepTheDefaults) {
  Program p;
  p.parse({"--config", write_file("null.yaml", "trainer:\n  max_epochs: null\n  seed: ~\nmodel:\n  lr:\n")});
  EXPECT_FALSE(p.trainer.max_epochs.has_value());
  EXPECT_FALSE(p.trainer.seed.has_value());
  EXPECT_DOUBLE_EQ(p.lr, 1e-3);
  Program empty;
  empty.parse({"--config", write_file("empty.yaml", "")});
  EXPECT_EQ(empty.model, "mlp");
}

TEST(CliConfig, UnknownKeyNamesTheKeyTheAcceptedKeysAndAHint) {
  const std::string message = config_error("trainer:\n  max_epoch: 3\n");
  EXPECT_NE(message.find("bad.yaml"), std::string::npos) << message;
  EXPECT_NE(message.find("unknown key 'trainer.max_epoch'"), std::string::npos) << message;
  EXPECT_NE(message.find("did you mean 'trainer.max_epochs'"), std::string::npos) << message;
  EXPECT_NE(message.find("accumulate_grad_batches"), std::string::npos) << message;  // the accepted keys
  EXPECT_NE(message.find("HINT: `prog --print-config`"), std::string::npos) << message;
}

TEST(CliConfig, UnknownTopLevelKeyListsTheTopLevelKeys) {
  const std::string message = config_error("save_top: 3\n");
  EXPECT_NE(message.find("unknown key 'save_top'"), std::string::npos) << message;
  EXPECT_NE(message.find("did you mean 'save_top_k'"), std::string::npos) << message;
  EXPECT_NE(message.find("Top-level keys: no_test, save_top_k"), std::string::npos) << message;
}

TEST(CliConfig, UnknownSectionListsTheSections) {
  const std::string message = config_error("trainr:\n  max_epochs: 3\n");
  EXPECT_NE(message.find("unknown section 'trainr:'"), std::string::npos) << message;
  EXPECT_NE(message.find("did you mean 'trainer:'"), std::string::npos) << message;
  EXPECT_NE(message.find("Sections: data, model, trainer"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT"), std::string::npos) << message;
}

TEST(CliConfig, KeyInTheWrongSectionSaysWhereItBelongs) {
  const std::string message = config_error("model:\n  max_epochs: 3\n");
  EXPECT_NE(message.find("'max_epochs' is a 'trainer:' key, but it is under 'model:'"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT: move it to 'trainer:'"), std::string::npos) << message;
  EXPECT_NE(config_error("max_epochs: 3\n").find("at the top level"), std::string::npos);
}

/// What parsing `args` throws ("" if nothing).
std::string parse_error(const std::vector<std::string>& args) {
  Program program;
  try {
    program.parse(args);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(TrainerFlags, FlagsNotGivenLeaveTheOptionsUnset) {
  Program program;
  program.parse({});
  EXPECT_FALSE(program.trainer.seed.has_value());
  EXPECT_FALSE(program.trainer.gradient_clip_val.has_value());
  EXPECT_FALSE(program.trainer.max_epochs.has_value());
  Program given;
  given.parse({"--seed", "0", "--gradient-clip-val", "0.5", "--max-epochs", "-1"});
  EXPECT_EQ(given.trainer.seed.value_or(99), 0u);
  EXPECT_EQ(given.trainer.gradient_clip_val.value_or(-9.0), 0.5);
  EXPECT_EQ(given.trainer.max_epochs.value_or(-9), -1) << "-1 is Lightning's 'no limit' for max_epochs";
}

TEST(TrainerFlags, MinusOneIsNotASilentOffForSeedOrClipping) {
  // Before, "not given" was -1 inside the flags' range: --seed -1 ran unseeded and
  // --gradient-clip-val -1 ran without clipping, both without a word.
  std::string message = parse_error({"--seed", "-1"});
  EXPECT_NE(message.find("--seed=-1 must be >= 0"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT: leave --seed out"), std::string::npos) << message;
  message = parse_error({"--gradient-clip-val", "-1"});
  EXPECT_NE(message.find("--gradient-clip-val=-1 must be >= 0"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT"), std::string::npos) << message;
}

TEST(CliConfig, WrongTypesNameTheKeyAndWhatIsAccepted) {
  std::string message = config_error("trainer:\n  max_epochs: three\n");
  EXPECT_NE(message.find("trainer.max_epochs='three' is not an integer (--max-epochs takes INT)"), std::string::npos)
      << message;
  EXPECT_NE(message.find("HINT"), std::string::npos) << message;
  message = config_error("model:\n  lr: fast\n");
  EXPECT_NE(message.find("model.lr='fast' is not a number"), std::string::npos) << message;
  message = config_error("trainer:\n  deterministic: maybe\n");
  EXPECT_NE(message.find("trainer.deterministic='maybe' is not supported; expected one of true, false, warn"),
            std::string::npos)
      << message;
  message = config_error("trainer:\n  detect_anomaly: maybe\n");
  EXPECT_NE(message.find("trainer.detect_anomaly='maybe' is not a boolean; expected true or false"), std::string::npos)
      << message;
  message = config_error("trainer:\n  overfit_batches: 1.5\n");
  EXPECT_NE(message.find("overfit_batches"), std::string::npos) << message;
  EXPECT_NE(message.find("a batch count"), std::string::npos) << message;
  message = config_error("trainer:\n  limit_train_batches: abc\n");
  EXPECT_NE(message.find("trainer.limit_train_batches='abc' is not accepted"), std::string::npos) << message;
  EXPECT_NE(message.find("a batch count"), std::string::npos) << message;
  message = config_error("trainer:\n  max_epochs: {a: 1}\n");
  EXPECT_NE(message.find("trainer.max_epochs is a mapping; expected an integer"), std::string::npos) << message;
  message = config_error("trainer:\n  max_epochs: 3\n  max-epochs: 4\n");
  EXPECT_NE(message.find("sets trainer.max_epochs twice"), std::string::npos) << message;
}

TEST(CliConfig, DeterministicTakesTrueFalseOrWarnFromFlagsAndFiles) {
  const auto mode_of = [](const std::vector<std::string>& args) {
    Program p;
    p.parse(args);
    return p.trainer.deterministic.mode();
  };
  EXPECT_EQ(mode_of({}), DeterministicMode::kOff);
  EXPECT_EQ(mode_of({"--deterministic"}), DeterministicMode::kOn);
  EXPECT_EQ(mode_of({"--deterministic=warn"}), DeterministicMode::kWarn);
  EXPECT_EQ(mode_of({"--deterministic=false"}), DeterministicMode::kOff);
  EXPECT_EQ(mode_of({"--config", write_file("warn.yaml", "trainer:\n  deterministic: warn\n")}),
            DeterministicMode::kWarn);
  EXPECT_EQ(mode_of({"--config", write_file("yes.yaml", "trainer:\n  deterministic: yes\n")}), DeterministicMode::kOn);
  EXPECT_EQ(mode_of({"--config", write_file("warn.yaml", "trainer:\n  deterministic: warn\n"), "--deterministic"}),
            DeterministicMode::kOn)
      << "the flag overrides the file";

  Program warn;
  warn.parse({"--deterministic=warn"});
  EXPECT_EQ(resolved_config(warn.app)["trainer"]["deterministic"], "warn");
  Program on;
  on.parse({"--deterministic"});
  EXPECT_EQ(resolved_config(on.app)["trainer"]["deterministic"], true);
}

TEST(CliConfig, TheDebuggingAndSummaryOptionsAreConfigKeys) {
  Program p;
  p.parse({"--config", write_file("debug.yaml",
                                  "trainer:\n  min_steps: 30\n  overfit_batches: 0.25\n  detect_anomaly: true\n"
                                  "  model_summary_max_depth: -1\n")});
  EXPECT_EQ(p.trainer.min_steps, 30);
  ASSERT_TRUE(p.trainer.overfit_batches.has_value());
  EXPECT_TRUE(p.trainer.overfit_batches->is_fraction());
  EXPECT_EQ(p.trainer.overfit_batches->fraction(), 0.25);
  EXPECT_TRUE(p.trainer.detect_anomaly);
  EXPECT_EQ(p.trainer.model_summary_max_depth, -1);
  const nlohmann::json config = resolved_config(p.app);
  EXPECT_EQ(config["trainer"]["min_steps"], 30);
  EXPECT_EQ(config["trainer"]["overfit_batches"], 0.25);
  EXPECT_EQ(config["trainer"]["detect_anomaly"], true);
  EXPECT_EQ(config["trainer"]["model_summary_max_depth"], -1);

  Program defaults;
  defaults.parse({});
  const nlohmann::json unset = resolved_config(defaults.app);
  EXPECT_EQ(unset["trainer"]["overfit_batches"], "") << "unset: off, written as the other unset text options are";
  EXPECT_EQ(unset["trainer"]["min_steps"], 0);
  EXPECT_EQ(unset["trainer"]["model_summary_max_depth"], 1);
}

TEST(CliConfig, InvalidYamlNamesTheFileAndLine) {
  const std::string message = config_error("trainer:\n  max_epochs: [3\n");
  EXPECT_NE(message.find("'" + write_file("bad.yaml", "") + "' is not valid YAML"), std::string::npos) << message;
  EXPECT_NE(message.find("line "), std::string::npos) << message;
}

TEST(CliConfig, MissingFileIsAParseError) {
  Program p;
  EXPECT_THROW(p.parse({"--config", "/nonexistent/run.yaml"}), CLI::ParseError);
}

TEST(CliConfig, ResolvedConfigHoldsEveryOptionWithItsDefault) {
  Program p;
  p.parse({});
  const nlohmann::json config = resolved_config(p.app);
  EXPECT_EQ(config["trainer"]["max_epochs"], nullptr);  // unset: the Trainer decides
  EXPECT_EQ(config["trainer"]["limit_train_batches"], 1.0);
  EXPECT_EQ(config["trainer"]["devices"], "auto");
  EXPECT_EQ(config["trainer"]["logger"], true);
  EXPECT_EQ(config["trainer"]["deterministic"], false);
  EXPECT_EQ(config["trainer"]["gradient_clip_algorithm"], "norm");
  EXPECT_EQ(config["trainer"]["num_sanity_val_steps"], 2);
  EXPECT_EQ(config["model"]["lr"], 1e-3);
  EXPECT_EQ(config["data"]["batch_size"], 64);
  EXPECT_EQ(config["save_top_k"], 1);
  EXPECT_EQ(config["no_test"], false);
  for (const char* absent : {"help", "config", "print_config"}) EXPECT_FALSE(config.contains(absent)) << absent;
}

TEST(CliConfig, ResolvedConfigHoldsWhatWasGiven) {
  Program p;
  p.parse({"--max-epochs", "2", "--limit-val-batches", "3", "--no-logger", "--lr", "0.25", "--seed", "7"});
  const nlohmann::json config = resolved_config(p.app);
  EXPECT_EQ(config["trainer"]["max_epochs"], 2);
  EXPECT_EQ(config["trainer"]["limit_val_batches"], 3);
  EXPECT_EQ(config["trainer"]["logger"], false);
  EXPECT_EQ(config["trainer"]["seed"], 7);
  EXPECT_EQ(config["model"]["lr"], 0.25);
}

TEST(CliConfig, PrintedConfigReadBackGivesTheSameConfig) {
  Program first;
  first.parse({"--max-epochs", "2", "--limit-train-batches", "0.1", "--devices", "0,1", "--no-logger", "--model", "cnn",
               "--lr", "3e-4", "--gradient-clip-val", "0.5", "--save-top-k", "3", "--default-root-dir", "runs/x"});
  const nlohmann::json printed = resolved_config(first.app);
  Program second;
  second.parse({"--config", write_file("printed.yaml", to_hparams_yaml(printed))});
  EXPECT_EQ(resolved_config(second.app), printed) << to_hparams_yaml(printed);
  EXPECT_EQ(second.trainer.max_epochs, 2);
  EXPECT_DOUBLE_EQ(second.trainer.limit_train_batches.fraction(), 0.1);
  EXPECT_EQ(second.trainer.devices.indices(), (std::vector<int>{0, 1}));
  EXPECT_FALSE(second.trainer.logger);
  EXPECT_EQ(second.model, "cnn");
  EXPECT_DOUBLE_EQ(second.lr, 3e-4);
  EXPECT_EQ(second.trainer.gradient_clip_val, 0.5);
  EXPECT_EQ(second.save_top_k, 3);
  EXPECT_EQ(second.trainer.default_root_dir, "runs/x");
}

TEST(CliConfig, PrintConfigPrintsTheResolvedYamlAndEndsParsingSuccessfully) {
  Program p;
  ::testing::internal::CaptureStdout();
  try {
    p.parse({"--config", write_file("print.yaml", "model: {lr: 0.5}\n"), "--print-config", "--max-epochs", "4"});
    ADD_FAILURE() << "--print-config did not end parsing";
  } catch (const CLI::Success& e) {
    EXPECT_EQ(p.app.exit(e), 0);
  }
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(out, to_hparams_yaml(resolved_config(p.app)));
  EXPECT_NE(out.find("trainer:\n"), std::string::npos) << out;
  EXPECT_NE(out.find("  max_epochs: 4\n"), std::string::npos) << out;
  EXPECT_NE(out.find("  lr: 0.5\n"), std::string::npos) << out;
}

TEST(CliConfig, PrintConfigChecksTheGivenValuesFirst) {
  Program p;
  EXPECT_THROW(p.parse({"--print-config", "--limit-train-batches", "abc"}), Error);
}

TEST(CliConfig, KeysAreLongNamesAndSectionsAreGroups) {
  CLI::App app;
  int value = 0;
  EXPECT_EQ(config_key(*app.add_option("--max-epochs,-m", value)->group("Trainer")), "max_epochs");
  EXPECT_EQ(config_section(*app.get_option("--max-epochs")), "trainer");
  EXPECT_EQ(config_section(*app.add_option("--top", value)), "");
  EXPECT_EQ(config_section(*app.add_option("--x", value)->group("Data Module")), "data_module");
  EXPECT_EQ(config_key(*app.add_option("-s", value)), "");
  EXPECT_EQ(config_key(*app.add_option("--quiet", value)->configurable(false)), "");
}

}  // namespace
}  // namespace volt
