#include "trainer_shape.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <iterator>

#include "volt/core/error.h"
#include "volt/options/trainer_flags.h"

namespace volt::tool {
namespace {

/// The HINT of every error about the program's flags.
constexpr const char* kProgramHint =
    "HINT: the check reads the program's Trainer flags (and its --config file, from this directory) as the program "
    "will; fix them, or pass --no-check to render the job unchecked.";

/// Runs `read`, giving a volt::Error it throws the context that it is about the program's flags.
template <typename F>
auto about_the_program(const std::string& what, F read) {
  try {
    return read();
  } catch (const Error& e) {
    throw Error(fmt::format("the program's {}: {}", what, e.what()));
  }
}

}  // namespace

TrainerOptions trainer_options_from_command(const std::vector<std::string>& command) {
  TrainerOptions options;
  if (command.size() <= 1) return options;
  CLI::App app("the program's Trainer flags", command.front());
  TrainerFlagText text;
  add_trainer_flags(app, options, text);
  // Everything but the Trainer flags and --config belongs to the program.
  app.set_help_flag();
  app.remove_option(app.get_option("--print-config"));
  app.allow_extras();
  app.allow_config_extras(CLI::config_extras_mode::ignore_all);
  std::vector<std::string> reversed(command.rbegin(), std::prev(command.rend()));  // CLI11 takes them reversed
  about_the_program("Trainer flags", [&] {
    try {
      app.parse(reversed);
    } catch (const CLI::ParseError& e) {
      throw Error(fmt::format("{}. {}", e.what(), kProgramHint));
    }
    apply_trainer_flags(text, options);
    return 0;
  });
  return options;
}

NodeResources node_resources(const slurm::JobSpec& spec) {
  NodeResources node;
  node.cores = spec.ntasks_per_node;
  node.gpus = spec.gpus_per_node;
  return node;
}

slurm::TrainerShape trainer_shape_from_command(const std::vector<std::string>& command, const slurm::JobSpec& spec) {
  const TrainerOptions options = trainer_options_from_command(command);
  const RunLayout layout =
      about_the_program("Trainer options", [&] { return resolve_run_layout(options, node_resources(spec)); });
  slurm::TrainerShape shape;
  shape.devices = layout.devices;
  shape.num_nodes = layout.num_nodes;
  shape.uses_gpus = layout.accelerator == Accelerator::kCuda;
  shape.auto_requeue = options.auto_requeue;
  // JobSpec::signal's form: without "SIG" ("USR1").
  shape.requeue_signal = std::string(to_string(options.requeue_signal)).substr(3);
  shape.processes_per_node = layout.processes_per_node;
  shape.strategy = to_string(layout.strategy);
  return shape;
}

std::vector<std::string> check_job(const slurm::JobSpec& spec, const std::vector<std::string>& program) {
  std::vector<std::string> problems = slurm::validate(spec);
  const auto mismatches = slurm::check_job_against_trainer(spec, trainer_shape_from_command(program, spec));
  problems.insert(problems.end(), mismatches.begin(), mismatches.end());
  return problems;
}

}  // namespace volt::tool
