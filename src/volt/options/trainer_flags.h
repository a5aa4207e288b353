// Command-line flags for TrainerOptions (CLI11), shared by every program built with Volt and by
// the `volt` tool, which reads a program's command line with these very definitions. No LibTorch.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "volt/options/trainer_options.h"

namespace volt {

/// Flags whose values need parsing after CLI11 has run (limits, devices, the option enums) or
/// that stay unset unless given. Empty text and unset values leave TrainerOptions as it was.
struct TrainerFlagText {
  std::string accelerator;                      ///< --accelerator
  std::string strategy;                         ///< --strategy (--distributed-backend)
  std::string sharding_strategy;                ///< --sharding-strategy
  std::string state_dict_type;                  ///< --state-dict-type
  std::optional<int64_t> fsdp_min_unit_params;  ///< --fsdp-min-unit-params (unset: not given)
  std::string profiler;                         ///< --profiler
  std::string pipeline_balance;                 ///< --pipeline-balance ("auto" or "2,1,3")
  std::string pipeline_schedule;                ///< --pipeline-schedule
  std::string precision;                        ///< --precision
  std::string amp_level;                        ///< --amp-level
  std::string process_group_backend;            ///< --process-group-backend
  std::string requeue_signal;                   ///< --requeue-signal
  std::string limit_train_batches;              ///< --limit-train-batches
  std::string limit_val_batches;                ///< --limit-val-batches
  std::string limit_test_batches;               ///< --limit-test-batches
  std::string limit_predict_batches;            ///< --limit-predict-batches
  std::string val_check_interval;               ///< --val-check-interval
  std::string devices;                          ///< --devices
  std::string gpus;                             ///< --gpus (the seed documents' GPU request)
  std::string gradient_clip_algorithm;          ///< --gradient-clip-algorithm
  std::string overfit_batches;                  ///< --overfit-batches
  std::string deterministic;                    ///< --deterministic (bare: "true"), --deterministic=warn
  std::string tune_allocator;                   ///< --tune-allocator ("true"), --no-tune-allocator ("false")
  std::string max_time;                         ///< --max-time
  std::string mlflow_tracking_uri;              ///< --mlflow-tracking-uri
  std::string mlflow_experiment_name;           ///< --mlflow-experiment-name
  std::string mlflow_log_model;                 ///< --mlflow-log-model
  std::optional<int64_t> max_epochs;            ///< --max-epochs (unset: not given)
  std::optional<int64_t> pipeline_chunks;       ///< --pipeline-chunks (unset: not given)
  std::optional<int64_t> max_steps;             ///< --max-steps (unset: not given)
  std::optional<int64_t> num_threads;           ///< --num-threads (unset: not given; 0: automatic)
  std::optional<int64_t> seed;                  ///< --seed (unset: not given)
  std::optional<double> gradient_clip_val;      ///< --gradient-clip-val (unset: not given)
};

/// The CLI11 group of the Trainer flags, which makes them the `trainer:` section of a config file.
inline constexpr const char* kTrainerGroup = "Trainer";

/// Adds one flag per Trainer option to `app` (`--max-epochs`, `--limit-train-batches`, ...),
/// mirroring Lightning's Trainer argument names with dashes, in the group "Trainer", plus
/// `--config` and `--print-config` (add_config_flags). A bad value is a volt::Error naming the
/// flag (or the config file and key), what is accepted and a HINT. A flag given twice takes the
/// last value (take_last_when_repeated). Call apply_trainer_flags after parsing.
///
/// Example:
/// ```
/// CLI::App app("train");
/// volt::TrainerOptions options;
/// volt::TrainerFlagText text;
/// volt::add_trainer_flags(app, options, text);
/// app.parse(argc, argv);  // --devices 2 --strategy ddp --config run.yaml
/// volt::apply_trainer_flags(text, options);
/// ```
void add_trainer_flags(CLI::App& app, TrainerOptions& options, TrainerFlagText& text);

/// Makes every single-valued option of `app` in `group` (every one when empty) take the last
/// value when given more than once, as argparse and LightningCLI do: a script's defaults followed
/// by an override (`train $DEFAULTS --max-epochs 2`) works. CLI11 refuses a repeat by default.
void take_last_when_repeated(CLI::App& app, const std::string& group = "");

/// Parses a program's command line into `app`, every single-valued option taking the last value
/// when repeated (take_last_when_repeated). On a parse error it prints CLI11's message (or the
/// help) and, for each unknown flag, the closest one `app` knows ("HINT: --max-epoch: did you
/// mean --max-epochs?"), and returns what main should return: 0 after --help, 2
/// (kExitUsage) otherwise. Unset when parsing succeeded.
///
/// Example: `if (const std::optional<int> code = volt::parse_command_line(app, argc, argv)) return *code;`
std::optional<int> parse_command_line(CLI::App& app, int argc, const char* const* argv);

/// Moves the parsed text flags into `options`; throws volt::Error naming the flag on bad values.
void apply_trainer_flags(const TrainerFlagText& text, TrainerOptions& options);

}  // namespace volt
