// YAML configuration files for programs built with Volt's CLI helper (LightningCLI's --config).
//
//   fashion_mnist --print-config > run.yaml        every option with its resolved value
//   fashion_mnist --config run.yaml --max-epochs 1 the file's values, the flags on top
//
// Every option of the CLI11 app with a long name is a config key: the long name with `_` for
// `-` (`--max-epochs` -> `max_epochs`; `max-epochs` and an option's other long names are read
// too). The option's CLI11 group is its section, lower-cased: group "Trainer" -> `trainer:`,
// "Model" -> `model:`, "Data" -> `data:`; options left in CLI11's default group ("Options") are
// top-level keys. Precedence: command-line flag > config file > the program's default. `null`
// (or an empty value) keeps the default. Unknown keys, keys in the wrong section and values of
// the wrong type are volt::Errors naming the file, the key and what is accepted; an app set to
// `allow_config_extras(CLI::config_extras_mode::ignore_all)` skips unknown sections and keys (the
// `volt` tool reads only a program's Trainer options). A flag takes true or false; a flag whose
// CLI11 type name lists words (`->type_name("true|false|warn")`, as `--deterministic` does)
// takes exactly those. No LibTorch.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace volt {

/// Adds `--config FILE` (read a YAML config) and `--print-config` (print the resolved config as
/// YAML to stdout, then end parsing with CLI::Success, which `app.exit` turns into exit code 0)
/// to `app`, and makes `app` read YAML. Calling it again on the same app does nothing.
///
/// Example:
/// ```
/// CLI::App app("train");
/// volt::add_config_flags(app);  // add_trainer_flags calls it too
/// app.add_option("--lr", lr)->group("Model");
/// app.parse(argc, argv);        // run.yaml may now say `model: {lr: 0.01}`
/// ```
void add_config_flags(CLI::App& app);

/// The resolved configuration of a parsed `app`: {section: {key: value}} plus top-level keys,
/// with every configurable option's final value (flag, else file, else the program's default;
/// null where there is none). This is what --print-config prints and what
/// TrainerOptions::config saves.
nlohmann::json resolved_config(CLI::App& app);

/// The config key of `option` ("max_epochs" for `--max-epochs`), or "" when it cannot be
/// configured (no long name, marked `configurable(false)`, or the help flag).
std::string config_key(const CLI::Option& option);

/// The section `option` belongs to: its group lower-cased with `_` for spaces ("Trainer" ->
/// "trainer"), or "" for CLI11's default group "Options" (a top-level key).
std::string config_section(const CLI::Option& option);

/// A switch's word as flags and config files spell it: true for "true", "yes", "on" or "1",
/// false for "false", "no", "off" or "0" (any case, spaces trimmed); nullopt for anything else.
std::optional<bool> parse_switch_word(const std::string& text);

}  // namespace volt
