#include "trainer_shape.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <optional>

#include "volt/core/error.h"
#include "volt/core/strings.h"

namespace volt::tool {
namespace {

/// The value of the last `--name value` or `--name=value` in command[1:], for any of `names`.
std::optional<std::pair<std::string, std::string>> last_value(const std::vector<std::string>& command,
                                                              const std::vector<std::string>& names) {
  std::optional<std::pair<std::string, std::string>> found;
  for (std::size_t i = 1; i < command.size(); ++i) {
    for (const auto& name : names) {
      const std::string flag = "--" + name;
      if (command[i] == flag) {
        VOLT_CHECK(i + 1 < command.size(),
                   "the program's {} has no value; expected e.g. {} 2. HINT: give the value "
                   "after the flag.",
                   flag, flag);
        found = std::make_pair(flag, command[i + 1]);
      } else if (command[i].rfind(flag + "=", 0) == 0) {
        found = std::make_pair(flag, command[i].substr(flag.size() + 1));
      }
    }
  }
  return found;
}

/// The index of the last `flag` in command[1:], or 0 when none is there.
std::size_t last_switch(const std::vector<std::string>& command, const std::string& flag) {
  std::size_t at = 0;
  for (std::size_t i = 1; i < command.size(); ++i) {
    if (command[i] == flag) at = i;
  }
  return at;
}

int64_t devices_from(const std::string& flag, const std::string& value, const slurm::JobSpec& spec) {
  const std::string text = to_lower(trim(value));
  if (text == "auto" || text == "-1") return spec.ntasks_per_node;
  if (text.find(',') != std::string::npos || text.find('[') != std::string::npos) {
    std::string inner = text;
    inner.erase(std::remove_if(inner.begin(), inner.end(), [](char c) { return c == '[' || c == ']'; }), inner.end());
    int64_t count = 0;
    for (const auto& item : split(inner, ',')) {
      if (trim(item).empty()) continue;
      VOLT_CHECK(parse_int(item) && *parse_int(item) >= 0,
                 "the program's {}='{}' lists '{}', which is not a device "
                 "index; expected a count (2), -1, auto or a list of indices (0,1). HINT: write e.g. {} 2.",
                 flag, value, item, flag);
      ++count;
    }
    VOLT_CHECK(count > 0, "the program's {}='{}' lists no devices. HINT: write e.g. {} 2.", flag, value, flag);
    return count;
  }
  const auto count = parse_int(text);
  VOLT_CHECK(count && *count >= 1,
             "the program's {}='{}' is not a device count; expected a count (2), -1, auto or a "
             "list of indices (0,1). HINT: write e.g. {} 2.",
             flag, value, flag);
  return *count;
}

}  // namespace

std::string normalize_signal(const std::string& name) {
  std::string out = trim(name);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::toupper(c); });
  if (out.rfind("SIG", 0) == 0) out = out.substr(3);
  return out;
}

slurm::TrainerShape trainer_shape_from_command(const std::vector<std::string>& command, const slurm::JobSpec& spec) {
  slurm::TrainerShape shape;
  if (const auto devices = last_value(command, {"devices"})) {
    shape.devices = devices_from(devices->first, devices->second, spec);
  }
  if (const auto nodes = last_value(command, {"num-nodes", "num_nodes", "nb-gpu-nodes", "nb_gpu_nodes"})) {
    const auto count = parse_int(nodes->second);
    VOLT_CHECK(count && *count >= 1,
               "the program's {}='{}' is not a node count; expected a whole number >= 1. HINT: "
               "write e.g. {} 2.",
               nodes->first, nodes->second, nodes->first);
    shape.num_nodes = *count;
  }
  if (const auto accelerator = last_value(command, {"accelerator"})) {
    const std::string name = to_lower(trim(accelerator->second));
    VOLT_CHECK(name == "gpu" || name == "cuda" || name == "cpu" || name == "auto",
               "the program's --accelerator='{}' is not one this check knows; expected gpu, cuda, cpu or auto. HINT: "
               "pass --no-check to submit it unchecked.",
               accelerator->second);
    shape.uses_gpus = name == "gpu" || name == "cuda" || (name == "auto" && spec.gpus_per_node > 0);
  }
  // The later of --auto-requeue and --no-auto-requeue wins, as CLI11 reads them in the Trainer.
  shape.auto_requeue = last_switch(command, "--no-auto-requeue") <= last_switch(command, "--auto-requeue");
  if (const auto signal = last_value(command, {"requeue-signal"})) {
    shape.requeue_signal = normalize_signal(signal->second);
    VOLT_CHECK(!shape.requeue_signal.empty(),
               "the program's --requeue-signal is empty; expected e.g. SIGUSR1. HINT: "
               "write --requeue-signal SIGUSR1.");
  }
  return shape;
}

std::vector<std::string> check_job(const slurm::JobSpec& spec, const std::vector<std::string>& program) {
  std::vector<std::string> problems = slurm::validate(spec);
  const auto mismatches = slurm::check_job_against_trainer(spec, trainer_shape_from_command(program, spec));
  problems.insert(problems.end(), mismatches.begin(), mismatches.end());
  return problems;
}

}  // namespace volt::tool
