// Which CUDA devices a process uses, and what the processes it launches must see: a pure
// function of the request, the environment and the visible device count, so it is tested on
// CPU-only machines.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "volt/core/env.h"
#include "volt/environments/cluster_environment.h"
#include "volt/options/trainer_options.h"

namespace volt {

/// The inputs of place_gpus besides the environment.
struct GpuPlacementRequest {
  /// `devices` (or the seed documents' `gpus`): a count, -1 or "auto" for all, or indices
  /// numbered as this process sees the devices (after CUDA_VISIBLE_DEVICES).
  DeviceRequest devices;
  /// Processes on this node: `devices` under ddp, 1 under dp and ddp2.
  int64_t processes_per_node = 1;
  /// This process on its node (LOCAL_RANK, SLURM_LOCALID, ...).
  int64_t local_rank = 0;
  /// Who started the processes.
  ClusterKind cluster = ClusterKind::kLocal;
  /// True when this process will start its node's other local ranks.
  bool launches_local_processes = false;
  /// CUDA devices this process sees (MachineInfo::gpus).
  int64_t visible_gpus = 0;
};

/// Where a process runs.
struct GpuPlacement {
  /// CUDA device indices this process uses, as it numbers them: one under ddp, the node's
  /// devices under dp and ddp2; the first is the root (where outputs are gathered).
  std::vector<int64_t> devices;
  /// Variables to set for the processes this one launches: CUDA_DEVICE_ORDER=PCI_BUS_ID, and
  /// CUDA_VISIBLE_DEVICES listing the selected devices so that local rank r uses its device r.
  /// Empty unless this process launches the others (never under SLURM or another launcher).
  Env::Vars child_env;
};

/// The variable Volt sets for launched children with the selection it made visible to them,
/// so a child knows its CUDA_VISIBLE_DEVICES is exactly the selection.
inline constexpr const char* kGpuSelectionVar = "VOLT_GPU_SELECTION";

/// Maps a device request to this process's CUDA devices. Under SLURM (and torchrun, MPI) the
/// launcher's CUDA_VISIBLE_DEVICES is left alone: a task that sees one GPU (SLURM binds one
/// per task) uses device 0, a task that sees the node's GPUs uses the local rank's. Throws
/// volt::Error listing the visible devices when the request cannot be served.
GpuPlacement place_gpus(const GpuPlacementRequest& request, const Env& env);

}  // namespace volt
