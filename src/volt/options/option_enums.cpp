#include "volt/options/option_enums.h"

#include <fmt/format.h>
#include <signal.h>

#include <iterator>
#include <optional>

#include "volt/core/error.h"
#include "volt/core/strings.h"

namespace volt {
namespace {

/// The value of `values` whose to_string is `text` (case and spaces ignored), if any.
template <typename E, std::size_t N>
std::optional<E> find_named(const std::string& text, const E (&values)[N]) {
  const std::string wanted = to_lower(trim(text));
  for (const E value : values) {
    if (to_lower(to_string(value)) == wanted) return value;
  }
  return std::nullopt;
}

/// "'a', 'b', 'c'": the names of `values`, quoted, for messages.
template <typename E, std::size_t N>
std::string quoted_names(const E (&values)[N]) {
  std::vector<std::string> names;
  for (const E value : values) names.push_back(fmt::format("'{}'", to_string(value)));
  return join(names, ", ");
}

/// The value named `text`, or a volt::Error "<option>='<text>' is not supported; supported: ...".
template <typename E, std::size_t N>
E parse_named(const std::string& text, const E (&values)[N], const char* option, const std::string& supported,
              const char* hint) {
  if (const auto value = find_named(text, values)) return *value;
  throw Error(fmt::format("{}='{}' is not supported; supported: {}. HINT: {}", option, text, supported, hint));
}

}  // namespace

const char* to_string(AcceleratorRequest accelerator) {
  switch (accelerator) {
    case AcceleratorRequest::kAuto:
      return "auto";
    case AcceleratorRequest::kCpu:
      return "cpu";
    case AcceleratorRequest::kGpu:
      return "gpu";
  }
  return "?";
}

AcceleratorRequest parse_accelerator_request(const std::string& text) {
  if (to_lower(trim(text)) == "cuda") return AcceleratorRequest::kGpu;
  return parse_named(text, kAcceleratorRequests, "accelerator",
                     quoted_names(kAcceleratorRequests) + ", 'cuda' (an alias of 'gpu')",
                     "'auto' picks the GPUs when any is visible, else the CPU.");
}

const char* to_string(StrategyRequest strategy) {
  switch (strategy) {
    case StrategyRequest::kAuto:
      return "auto";
    case StrategyRequest::kSingleDevice:
      return "single_device";
    case StrategyRequest::kDdp:
      return "ddp";
    case StrategyRequest::kDdpFindUnusedParametersTrue:
      return "ddp_find_unused_parameters_true";
    case StrategyRequest::kDp:
      return "dp";
    case StrategyRequest::kDdp2:
      return "ddp2";
    case StrategyRequest::kFsdp:
      return "fsdp";
    case StrategyRequest::kPipeline:
      return "pipeline";
  }
  return "?";
}

StrategyRequest parse_strategy_request(const std::string& text) {
  return parse_named(text, kStrategyRequests, "strategy", quoted_names(kStrategyRequests),
                     "use 'ddp' for several processes, or 'auto' to pick it when devices x num_nodes > 1.");
}

const char* to_string(Precision precision) {
  switch (precision) {
    case Precision::k32True:
      return "32-true";
    case Precision::k64True:
      return "64-true";
    case Precision::k16Mixed:
      return "16-mixed";
    case Precision::kBf16Mixed:
      return "bf16-mixed";
    case Precision::k16True:
      return "16-true";
    case Precision::kBf16True:
      return "bf16-true";
  }
  return "?";
}

Precision parse_precision(const std::string& text) {
  const std::string t = to_lower(trim(text));
  // Lightning's aliases: the bare numbers of Lightning 1.x ("16" meant native AMP).
  if (t == "32") return Precision::k32True;
  if (t == "64") return Precision::k64True;
  if (t == "16") return Precision::k16Mixed;
  if (t == "bf16") return Precision::kBf16Mixed;
  if (const auto precision = find_named(t, kPrecisions)) return *precision;
  throw Error(
      fmt::format("precision='{}' is not a precision; expected one of {}. HINT: '32-true' is the default; "
                  "'bf16-mixed' is mixed precision on CPU.",
                  text, describe_precisions({std::begin(kPrecisions), std::end(kPrecisions)})));
}

bool is_mixed(Precision precision) { return precision == Precision::k16Mixed || precision == Precision::kBf16Mixed; }

std::string describe_precisions(const std::vector<Precision>& precisions) {
  std::vector<std::string> names;
  for (const Precision precision : precisions) {
    const char* alias = nullptr;
    switch (precision) {
      case Precision::k32True:
        alias = "32";
        break;
      case Precision::k64True:
        alias = "64";
        break;
      case Precision::k16Mixed:
        alias = "16";
        break;
      case Precision::kBf16Mixed:
        alias = "bf16";
        break;
      case Precision::k16True:
      case Precision::kBf16True:
        break;
    }
    names.push_back(alias == nullptr ? fmt::format("'{}'", to_string(precision))
                                     : fmt::format("'{}' (alias {})", to_string(precision), alias));
  }
  return join(names, ", ");
}

const char* to_string(AmpLevel level) {
  switch (level) {
    case AmpLevel::kO0:
      return "O0";
    case AmpLevel::kO1:
      return "O1";
    case AmpLevel::kO2:
      return "O2";
    case AmpLevel::kO3:
      return "O3";
  }
  return "?";
}

AmpLevel parse_amp_level(const std::string& text) {
  if (const auto level = find_named(text, kAmpLevels)) return *level;
  throw Error(
      fmt::format("amp_level='{}' is not an apex optimization level; expected 'O0', 'O1', 'O2' or 'O3' (the letter "
                  "O). HINT: set precision instead ('bf16-mixed' for mixed precision on CPU).",
                  text));
}

const char* to_string(ProcessGroupBackend backend) {
  switch (backend) {
    case ProcessGroupBackend::kAuto:
      return "auto";
    case ProcessGroupBackend::kGloo:
      return "gloo";
    case ProcessGroupBackend::kNccl:
      return "nccl";
  }
  return "?";
}

ProcessGroupBackend parse_process_group_backend(const std::string& text) {
  return parse_named(text, kProcessGroupBackends, "process_group_backend",
                     quoted_names(kProcessGroupBackends) + " ('nccl' in CUDA builds)",
                     "'auto' picks nccl for GPUs and gloo for CPUs.");
}

const char* to_string(GradientClipAlgorithm algorithm) {
  switch (algorithm) {
    case GradientClipAlgorithm::kNorm:
      return "norm";
    case GradientClipAlgorithm::kValue:
      return "value";
  }
  return "?";
}

const char* to_string(ShardingStrategy strategy) {
  switch (strategy) {
    case ShardingStrategy::kFullShard:
      return "full_shard";
    case ShardingStrategy::kShardGradOp:
      return "shard_grad_op";
    case ShardingStrategy::kNoShard:
      return "no_shard";
  }
  return "?";
}

ShardingStrategy parse_sharding_strategy(const std::string& text) {
  return parse_named(text, kShardingStrategies, "sharding_strategy", quoted_names(kShardingStrategies),
                     "'shard_grad_op' shards gradients and optimizer state; 'full_shard' also the parameters of "
                     "each volt::FsdpUnit; 'no_shard' is ddp.");
}

const char* to_string(StateDictType type) {
  switch (type) {
    case StateDictType::kFull:
      return "full";
    case StateDictType::kSharded:
      return "sharded";
  }
  return "?";
}

StateDictType parse_state_dict_type(const std::string& text) {
  return parse_named(text, kStateDictTypes, "state_dict_type", quoted_names(kStateDictTypes),
                     "'full' gathers the optimizer state into one file on rank 0; 'sharded' writes a file per "
                     "process.");
}

const char* to_string(ProfilerKind kind) {
  switch (kind) {
    case ProfilerKind::kSimple:
      return "simple";
    case ProfilerKind::kPytorch:
      return "pytorch";
  }
  return "?";
}

ProfilerKind parse_profiler_kind(const std::string& text) {
  return parse_named(text, kProfilerKinds, "profiler", quoted_names(kProfilerKinds),
                     "'simple' prints the time per action at the end of each stage; 'pytorch' also writes a Chrome "
                     "trace of a few steps per process; leave it unset for no profiler.");
}

const char* to_string(PipelineSchedule schedule) {
  switch (schedule) {
    case PipelineSchedule::kGPipe:
      return "gpipe";
    case PipelineSchedule::k1F1B:
      return "1f1b";
  }
  return "?";
}

PipelineSchedule parse_pipeline_schedule(const std::string& text) {
  return parse_named(text, kPipelineSchedules, "pipeline_schedule", quoted_names(kPipelineSchedules),
                     "'gpipe' runs every forward before the backwards; '1f1b' keeps fewer activations alive (the "
                     "module's loss must come from Pipe::train_step).");
}

std::optional<std::vector<int64_t>> parse_pipeline_balance(const std::string& text) {
  if (to_lower(trim(text)) == "auto") return std::nullopt;
  std::vector<int64_t> counts;
  for (const std::string& part : split(text, ',')) {
    const auto count = parse_int(trim(part));
    VOLT_CHECK(count && *count >= 1,
               "pipeline_balance='{}' is not a list of layer counts; expected \"auto\" or counts >= 1 like \"2,1,3\" "
               "(one per stage). HINT: the counts must sum to the layers of the module's volt::Pipe.",
               text);
    counts.push_back(*count);
  }
  return counts;
}

std::string to_string_pipeline_balance(const std::optional<std::vector<int64_t>>& balance) {
  if (!balance) return "auto";
  std::vector<std::string> parts;
  for (const int64_t c : *balance) parts.push_back(std::to_string(c));
  return join(parts, ",");
}

GradientClipAlgorithm parse_gradient_clip_algorithm(const std::string& text) {
  return parse_named(text, kGradientClipAlgorithms, "gradient_clip_algorithm", quoted_names(kGradientClipAlgorithms),
                     "'norm' (the default) scales gradients to a total norm; 'value' clamps each element.");
}

const char* to_string(DeterministicMode mode) {
  switch (mode) {
    case DeterministicMode::kOff:
      return "false";
    case DeterministicMode::kOn:
      return "true";
    case DeterministicMode::kWarn:
      return "warn";
  }
  return "?";
}

DeterministicMode parse_deterministic_mode(const std::string& text) {
  const std::string word = to_lower(trim(text));
  if (word == "yes" || word == "on" || word == "1") return DeterministicMode::kOn;
  if (word == "no" || word == "off" || word == "0") return DeterministicMode::kOff;
  return parse_named(text, kDeterministicModes, "deterministic", quoted_names(kDeterministicModes),
                     "true refuses operations without a deterministic algorithm; 'warn' only warns about them.");
}

const char* to_string(RequeueSignal signal) {
  switch (signal) {
    case RequeueSignal::kSigUsr1:
      return "SIGUSR1";
    case RequeueSignal::kSigUsr2:
      return "SIGUSR2";
    case RequeueSignal::kSigHup:
      return "SIGHUP";
    case RequeueSignal::kSigAlrm:
      return "SIGALRM";
    case RequeueSignal::kSigQuit:
      return "SIGQUIT";
    case RequeueSignal::kSigCont:
      return "SIGCONT";
  }
  return "?";
}

int signal_number(RequeueSignal signal) {
  switch (signal) {
    case RequeueSignal::kSigUsr1:
      return SIGUSR1;
    case RequeueSignal::kSigUsr2:
      return SIGUSR2;
    case RequeueSignal::kSigHup:
      return SIGHUP;
    case RequeueSignal::kSigAlrm:
      return SIGALRM;
    case RequeueSignal::kSigQuit:
      return SIGQUIT;
    case RequeueSignal::kSigCont:
      return SIGCONT;
  }
  return SIGUSR1;
}

RequeueSignal parse_requeue_signal(const std::string& text) {
  std::string t = to_lower(trim(text));
  if (t.rfind("sig", 0) != 0) t = "sig" + t;
  const auto number = parse_int(t.substr(3));
  VOLT_CHECK(t != "sigterm" && t != "sigint" && number != SIGTERM && number != SIGINT,
             "requeue_signal='{}' already stops the run (it is handled as an interruption, with an HPC checkpoint "
             "under SLURM). HINT: requeue on SIGUSR1 (the default) or SIGUSR2, and set #SBATCH --signal to match.",
             text);
  for (const RequeueSignal signal : kRequeueSignals) {
    if (number ? *number == signal_number(signal) : t == to_lower(to_string(signal))) return signal;
  }
  std::vector<std::string> names;
  for (const RequeueSignal signal : kRequeueSignals) names.push_back(to_string(signal));
  throw Error(
      fmt::format("requeue_signal='{}' is not a signal Volt can requeue on; accepted: {} (with or without SIG, or "
                  "their numbers). HINT: use SIGUSR1, or SIGUSR2 where NCCL uses SIGUSR1, and the same in #SBATCH "
                  "--signal.",
                  text, join(names, ", ")));
}

}  // namespace volt
