// How a run's processes and devices are laid out on its nodes: the part of resolve_run_plan
// that needs neither LibTorch nor the environment, so the `volt` tool checks a SLURM job
// against a program's flags with the very function the program's Trainer runs.
#pragma once

#include <cstdint>
#include <string>

#include "volt/options/trainer_options.h"

namespace volt {

/// The accelerator a run uses (resolved: never "auto").
enum class Accelerator {
  kCpu,   ///< "cpu"
  kCuda,  ///< "cuda"
};
/// "cpu" or "cuda".
const char* to_string(Accelerator accelerator);

/// How the work is spread over processes and devices (resolved: never "auto").
enum class StrategyKind {
  kSingleDevice,  ///< "single_device": one process, one device
  kDdp,           ///< "ddp": one process per device
  kDp,            ///< "dp": one process drives its node's devices
  kDdp2,          ///< "ddp2": dp inside each node, ddp across nodes
  kFsdp,          ///< "fsdp": one process per device, gradients and optimizer state sharded
  kPipeline,      ///< "pipeline": one process, the module's volt::Pipe split over its devices
};
/// "single_device", "ddp", "dp", "ddp2", "fsdp" or "pipeline".
const char* to_string(StrategyKind strategy);

/// What a node offers each process, as far as the layout depends on it.
///
/// resolve_run_plan passes this machine (MachineInfo); the `volt` tool passes the job's nodes
/// (`--gres=gpu:N`).
struct NodeResources {
  /// Cores a process sees: devices=-1 on the CPU means one device (process or replica) per core.
  int64_t cores = 1;
  /// CUDA devices a process sees: accelerator "auto" picks CUDA when there are any, and devices
  /// "auto" or -1 on CUDA take them all.
  int64_t gpus = 0;
};

/// The hardware options of TrainerOptions, resolved: where the run's processes and devices go.
struct RunLayout {
  /// Where tensors live.
  Accelerator accelerator = Accelerator::kCpu;
  /// How processes cooperate.
  StrategyKind strategy = StrategyKind::kSingleDevice;
  /// What the devices were counted from: `gpus` when it asks for GPUs, else `devices`.
  DeviceRequest device_request;
  /// Devices per node: processes under ddp, replicas of one process under dp and ddp2.
  int64_t devices = 1;
  /// Nodes.
  int64_t num_nodes = 1;
  /// Processes on each node: `devices` under ddp, 1 under single_device, dp and ddp2 (what
  /// SLURM's --ntasks-per-node must be).
  int64_t processes_per_node = 1;
  /// Module replicas each process runs: one per device under dp and ddp2, else 1.
  int64_t replicas_per_process = 1;
  /// True when strategy 'ddp_find_unused_parameters_true' asked for find_unused_parameters.
  bool strategy_finds_unused_parameters = false;

  /// Processes in the whole run.
  int64_t world_size() const { return processes_per_node * num_nodes; }
};

/// True when `options` asks for GPUs through the seed documents' `gpus` (any value but 0).
bool requests_gpus_by_count(const TrainerOptions& options);

/// How `options` chose its accelerator, for messages: "gpus=2" or "accelerator='auto'".
std::string describe_accelerator_request(const TrainerOptions& options);

/// The accelerator `options` resolve to when a process sees `visible_gpus` CUDA devices: gpus=N
/// (N != 0) and "gpu" mean CUDA, "auto" means CUDA when visible_gpus > 0. Whether this build and
/// machine can run CUDA is resolve_run_plan's question.
Accelerator resolve_accelerator(const TrainerOptions& options, int64_t visible_gpus);

/// Lays out the processes and devices `options` ask for on nodes offering `node`; pure.
/// resolve_run_plan calls it, and so does the `volt` tool. Throws volt::Error naming the
/// option, what was given, what is possible and a HINT.
///
/// Example: `{.devices = 2, .strategy = StrategyRequest::kDdp2, .num_nodes = 2}` gives strategy
/// ddp2, devices 2, processes_per_node 1, replicas_per_process 2, world_size() 2.
RunLayout resolve_run_layout(const TrainerOptions& options, const NodeResources& node);

}  // namespace volt
