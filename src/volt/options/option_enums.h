// The enums of TrainerOptions: each value a user may ask for, with `to_string` and a `parse_*`
// that the command-line flags, YAML configs and messages share (after Ceres' types.h).
//
// Every `parse_*` ignores case and surrounding spaces, accepts exactly what `to_string` writes
// (plus the aliases it names), and throws volt::Error saying what was given, what is accepted
// and a HINT. No LibTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace volt {

/// Where the user asks the Trainer to run (TrainerOptions::accelerator).
enum class AcceleratorRequest {
  kAuto,  ///< "auto": the GPUs when the process sees any, else the CPU
  kCpu,   ///< "cpu"
  kGpu,   ///< "gpu" (alias "cuda"): CUDA devices, in CUDA builds
};
/// "auto", "cpu" or "gpu".
const char* to_string(AcceleratorRequest accelerator);
/// Parses "auto", "cpu", "gpu" or its alias "cuda".
AcceleratorRequest parse_accelerator_request(const std::string& text);
/// Every AcceleratorRequest, in the order help texts and messages list them.
inline constexpr AcceleratorRequest kAcceleratorRequests[] = {AcceleratorRequest::kAuto, AcceleratorRequest::kCpu,
                                                              AcceleratorRequest::kGpu};

/// How the user asks the Trainer to spread the work (TrainerOptions::strategy).
enum class StrategyRequest {
  kAuto,                         ///< "auto": ddp when devices x num_nodes > 1, else single_device
  kSingleDevice,                 ///< "single_device": one process, one device
  kDdp,                          ///< "ddp": one process per device, gradients all-reduced
  kDdpFindUnusedParametersTrue,  ///< "ddp_find_unused_parameters_true": ddp with find_unused_parameters
  kDp,                           ///< "dp": one process splits each batch across its node's devices
  kDdp2,                         ///< "ddp2": dp inside each node, ddp across nodes
  kFsdp,                         ///< "fsdp": ddp with gradients and optimizer state sharded
  kPipeline,                     ///< "pipeline": one process, the module's volt::Pipe split over its devices
};
/// "auto", "single_device", "ddp", "ddp_find_unused_parameters_true", "dp", "ddp2", "fsdp" or
/// "pipeline".
const char* to_string(StrategyRequest strategy);
/// Parses one of the names to_string writes.
StrategyRequest parse_strategy_request(const std::string& text);
/// Every StrategyRequest, in the order help texts and messages list them.
inline constexpr StrategyRequest kStrategyRequests[] = {
    StrategyRequest::kAuto, StrategyRequest::kSingleDevice,
    StrategyRequest::kDdp,  StrategyRequest::kDdpFindUnusedParametersTrue,
    StrategyRequest::kDp,   StrategyRequest::kDdp2,
    StrategyRequest::kFsdp, StrategyRequest::kPipeline};

/// The numeric precision of parameters and computation (Lightning's `precision=`).
enum class Precision {
  k32True,     ///< "32-true": float32 everywhere (the default)
  k64True,     ///< "64-true": the module and floating inputs in float64
  k16Mixed,    ///< "16-mixed": float32 weights, float16 autocast, dynamic loss scaling
  kBf16Mixed,  ///< "bf16-mixed": float32 weights, bfloat16 autocast, no loss scaling
  k16True,     ///< "16-true": the module and floating inputs in float16
  kBf16True,   ///< "bf16-true": the module and floating inputs in bfloat16
};
/// "32-true", "64-true", "16-mixed", "bf16-mixed", "16-true" or "bf16-true".
const char* to_string(Precision precision);
/// Parses a precision name or one of Lightning's short aliases: 32, 64, 16 (16-mixed) and
/// "bf16" (bf16-mixed). Whether this build can run the mode is check_precision_supported's
/// question (volt/precision/precision.h).
Precision parse_precision(const std::string& text);
/// True for the autocast modes (16-mixed, bf16-mixed).
bool is_mixed(Precision precision);
/// `precisions` for messages, with their aliases: "'32-true' (alias 32), '16-true'".
std::string describe_precisions(const std::vector<Precision>& precisions);
/// Every Precision, in the order help texts and messages list them.
inline constexpr Precision kPrecisions[] = {Precision::k32True,    Precision::k64True, Precision::k16Mixed,
                                            Precision::kBf16Mixed, Precision::k16True, Precision::kBf16True};

/// Apex's optimization levels, which the seed documents (Lightning 0.x) set with use_amp.
enum class AmpLevel {
  kO0,  ///< "O0": float32 (32-true)
  kO1,  ///< "O1": mixed precision (16-mixed)
  kO2,  ///< "O2": float16 weights with float32 master copies (16-mixed, the nearest native mode)
  kO3,  ///< "O3": float16 (16-true)
};
/// "O0", "O1", "O2" or "O3".
const char* to_string(AmpLevel level);
/// Parses "O0".."O3" (the letter O, any case).
AmpLevel parse_amp_level(const std::string& text);
/// Every AmpLevel, in order.
inline constexpr AmpLevel kAmpLevels[] = {AmpLevel::kO0, AmpLevel::kO1, AmpLevel::kO2, AmpLevel::kO3};

/// The c10d backend the user asks ddp to use (TrainerOptions::process_group_backend).
enum class ProcessGroupBackend {
  kAuto,  ///< "auto": nccl for GPUs (CUDA builds), gloo for CPUs
  kGloo,  ///< "gloo"
  kNccl,  ///< "nccl": CUDA tensors, in CUDA builds
};
/// "auto", "gloo" or "nccl".
const char* to_string(ProcessGroupBackend backend);
/// Parses "auto", "gloo" or "nccl".
ProcessGroupBackend parse_process_group_backend(const std::string& text);
/// Every ProcessGroupBackend, in the order help texts and messages list them.
inline constexpr ProcessGroupBackend kProcessGroupBackends[] = {ProcessGroupBackend::kAuto, ProcessGroupBackend::kGloo,
                                                                ProcessGroupBackend::kNccl};

/// What strategy='fsdp' shards over the processes (PyTorch's ShardingStrategy, lower case).
enum class ShardingStrategy {
  kFullShard,    ///< "full_shard": each volt::FsdpUnit's parameters too, gathered for its forward and backward
  kShardGradOp,  ///< "shard_grad_op": gradients and optimizer state; whole parameters (ZeRO-2)
  kNoShard,      ///< "no_shard": nothing; gradients all-reduced as under ddp
};
/// "full_shard", "shard_grad_op" or "no_shard".
const char* to_string(ShardingStrategy strategy);
/// Parses one of the names to_string writes, in any case (PyTorch's "SHARD_GRAD_OP" too).
ShardingStrategy parse_sharding_strategy(const std::string& text);
/// Every ShardingStrategy, in the order help texts and messages list them.
inline constexpr ShardingStrategy kShardingStrategies[] = {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                                           ShardingStrategy::kNoShard};

/// How strategy='fsdp' writes a checkpoint's optimizer state (Lightning's FSDPStrategy
/// state_dict_type).
enum class StateDictType {
  kFull,     ///< "full": gathered on rank 0 into Volt's one file; resumes under any strategy
  kSharded,  ///< "sharded": each process writes its own shard file beside an index; nothing gathered
};
/// "full" or "sharded".
const char* to_string(StateDictType type);
/// Parses "full" or "sharded", in any case.
StateDictType parse_state_dict_type(const std::string& text);
/// Every StateDictType, in order.
inline constexpr StateDictType kStateDictTypes[] = {StateDictType::kFull, StateDictType::kSharded};

/// What the Trainer's profiler makes of the actions it times (TrainerOptions::profiler,
/// Lightning's `profiler=`). Unset: the actions are still timed (the straggler report reads
/// them), but no table, file or trace is made.
enum class ProfilerKind {
  kSimple,   ///< "simple": wall time per action, a table at the end of each stage and a file per process
  kPytorch,  ///< "pytorch": "simple" plus LibTorch's profiler over a window of steps, a Chrome trace per process
};
/// "simple" or "pytorch".
const char* to_string(ProfilerKind kind);
/// Parses "simple" or "pytorch", in any case.
ProfilerKind parse_profiler_kind(const std::string& text);
/// Every ProfilerKind, in order.
inline constexpr ProfilerKind kProfilerKinds[] = {ProfilerKind::kSimple, ProfilerKind::kPytorch};

/// The order in which each pipeline stage runs its micro-batches' forward and backward passes
/// (TrainerOptions::pipeline_schedule, volt::Pipeline::train_step).
enum class PipelineSchedule {
  kGPipe,  ///< "gpipe": every forward, then every backward in reverse order (fill-drain)
  k1F1B,   ///< "1f1b": stage s runs k - s - 1 forwards, then one forward and one backward in turn
};
/// "gpipe" or "1f1b".
const char* to_string(PipelineSchedule schedule);
/// Parses "gpipe" or "1f1b" (any case); throws volt::Error with the supported names.
PipelineSchedule parse_pipeline_schedule(const std::string& text);
/// Every PipelineSchedule, in order.
inline constexpr PipelineSchedule kPipelineSchedules[] = {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B};

/// Parses --pipeline-balance: "auto" (nullopt) or layer counts per stage, "2,1,3"; throws
/// volt::Error with a HINT for anything else (a count below 1, a word).
std::optional<std::vector<int64_t>> parse_pipeline_balance(const std::string& text);
/// "auto" for nullopt, else the counts as "2,1,3".
std::string to_string_pipeline_balance(const std::optional<std::vector<int64_t>>& balance);

/// How gradients are clipped.
enum class GradientClipAlgorithm {
  kNorm,   ///< "norm": scale all gradients so their total norm is at most the value
  kValue,  ///< "value": clamp each gradient element to [-value, value]
};
/// "norm" or "value".
const char* to_string(GradientClipAlgorithm algorithm);
/// Parses "norm" or "value".
GradientClipAlgorithm parse_gradient_clip_algorithm(const std::string& text);
/// Every GradientClipAlgorithm, in order.
inline constexpr GradientClipAlgorithm kGradientClipAlgorithms[] = {GradientClipAlgorithm::kNorm,
                                                                    GradientClipAlgorithm::kValue};

/// Whether LibTorch may only use deterministic algorithms during a stage (Lightning's
/// `deterministic=`: false, true or "warn").
enum class DeterministicMode {
  kOff,   ///< "false": LibTorch picks the fastest kernels, deterministic or not (the default)
  kOn,    ///< "true": deterministic algorithms only; an operation that has none throws
  kWarn,  ///< "warn": deterministic algorithms where they exist; an operation without one warns
};
/// "false", "true" or "warn".
const char* to_string(DeterministicMode mode);
/// Parses "false", "true" or "warn", and the boolean words configs use ("yes"/"no", "on"/"off",
/// "1"/"0").
DeterministicMode parse_deterministic_mode(const std::string& text);
/// Every DeterministicMode, in order.
inline constexpr DeterministicMode kDeterministicModes[] = {DeterministicMode::kOff, DeterministicMode::kOn,
                                                            DeterministicMode::kWarn};

/// The signal SLURM sends before the time limit that makes the Trainer save and requeue its job
/// (`#SBATCH --signal=USR1@90`). SIGTERM and SIGINT are not among them: they already stop the run.
enum class RequeueSignal {
  kSigUsr1,  ///< "SIGUSR1" (the default)
  kSigUsr2,  ///< "SIGUSR2" (where NCCL uses SIGUSR1)
  kSigHup,   ///< "SIGHUP"
  kSigAlrm,  ///< "SIGALRM"
  kSigQuit,  ///< "SIGQUIT"
  kSigCont,  ///< "SIGCONT"
};
/// "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGALRM", "SIGQUIT" or "SIGCONT".
const char* to_string(RequeueSignal signal);
/// Parses a signal name with or without "SIG" ("SIGUSR2", "usr2") or its number on this system.
/// SIGTERM and SIGINT are refused (they already stop the run), as is any other signal.
RequeueSignal parse_requeue_signal(const std::string& text);
/// The signal's number on this system (SIGUSR1 for kSigUsr1).
int signal_number(RequeueSignal signal);
/// Every RequeueSignal, in the order help texts and messages list them.
inline constexpr RequeueSignal kRequeueSignals[] = {RequeueSignal::kSigUsr1, RequeueSignal::kSigUsr2,
                                                    RequeueSignal::kSigHup,  RequeueSignal::kSigAlrm,
                                                    RequeueSignal::kSigQuit, RequeueSignal::kSigCont};

/// "a, b or c": the names to_string writes for `values` (one of the lists above), for help texts
/// generated from the lists, so that a new enumerator shows in --help by itself.
template <typename E, std::size_t N>
std::string names_or(const E (&values)[N]) {
  std::string text;
  for (std::size_t i = 0; i < N; ++i) {
    if (i > 0) text += i + 1 == N ? " or " : ", ";
    text += to_string(values[i]);
  }
  return text;
}

}  // namespace volt
