// Command-line flags for TrainerOptions, for any program built with Volt (CLI11).
#pragma once

#include <CLI/CLI.hpp>
#include <optional>

#include "volt/trainer/trainer_options.h"

namespace volt {

/// Flags whose values need parsing after CLI11 has run (limits, devices).
struct TrainerFlagText {
  std::string limit_train_batches;          ///< --limit-train-batches
  std::string limit_val_batches;            ///< --limit-val-batches
  std::string limit_test_batches;           ///< --limit-test-batches
  std::string limit_predict_batches;        ///< --limit-predict-batches
  std::string val_check_interval;           ///< --val-check-interval
  std::string devices;                      ///< --devices
  std::string gpus;                         ///< --gpus (the seed documents' GPU request)
  std::string gradient_clip_algorithm;      ///< --gradient-clip-algorithm
  std::optional<int64_t> max_epochs;        ///< --max-epochs (unset: not given)
  std::optional<int64_t> seed;              ///< --seed (unset: not given)
  std::optional<double> gradient_clip_val;  ///< --gradient-clip-val (unset: not given)
};

/// The CLI11 group of the Trainer flags, which makes them the `trainer:` section of a config file.
inline constexpr const char* kTrainerGroup = "Trainer";

/// Adds one flag per Trainer option to `app` (`--max-epochs`, `--limit-train-batches`, ...),
/// mirroring Lightning's Trainer argument names with dashes, in the group "Trainer", plus
/// `--config` and `--print-config` (add_config_flags). Call apply_trainer_flags after parsing.
void add_trainer_flags(CLI::App& app, TrainerOptions& options, TrainerFlagText& text);

/// Moves the parsed text flags into `options`; throws volt::Error naming the flag on bad values.
void apply_trainer_flags(const TrainerFlagText& text, TrainerOptions& options);

/// Runs `body` and maps Volt's errors to exit codes with a one-paragraph message on stderr:
/// 0 success, 1 volt::Error (bad input, checkpoint problems), 70 internal errors and other exceptions.
int run_main(const std::function<int()>& body);

}  // namespace volt
