#include "volt/options/run_layout.h"

#include <fmt/format.h>

#include "volt/core/error.h"

namespace volt {
namespace {

/// The strategy `request` names, or nullopt for "auto" (decided by the process count).
std::optional<StrategyKind> requested_strategy(StrategyRequest request) {
  switch (request) {
    case StrategyRequest::kAuto:
      return std::nullopt;
    case StrategyRequest::kSingleDevice:
      return StrategyKind::kSingleDevice;
    case StrategyRequest::kDdp:
    case StrategyRequest::kDdpFindUnusedParametersTrue:
      return StrategyKind::kDdp;
    case StrategyRequest::kDp:
      return StrategyKind::kDp;
    case StrategyRequest::kDdp2:
      return StrategyKind::kDdp2;
    case StrategyRequest::kFsdp:
      return StrategyKind::kFsdp;
    case StrategyRequest::kPipeline:
      return StrategyKind::kPipeline;
  }
  return std::nullopt;
}

/// Devices per node. CPU "devices" are processes (or dp replicas): a count, -1 for one per core,
/// or a list (its length counts). CUDA devices: a count, a list, or every visible one for "auto"
/// and -1.
int64_t resolve_devices(const DeviceRequest& request, const std::string& what, Accelerator accelerator,
                        const NodeResources& node) {
  const bool cuda = accelerator == Accelerator::kCuda;
  if (!request.indices().empty()) return static_cast<int64_t>(request.indices().size());
  if (request.is_auto() || request.count() == -1) {
    const int64_t all = cuda ? node.gpus : (request.is_auto() ? 1 : node.cores);
    VOLT_CHECK(all >= 1,
               "{}={} takes every visible {}, but there are none. HINT: give the processes {} (e.g. #SBATCH "
               "--gres=gpu:N), or set a count.",
               what, request.to_string(), cuda ? "CUDA device" : "core", cuda ? "GPUs" : "cores");
    return all;
  }
  VOLT_CHECK(request.count() >= 1,
             "{}={} asks for no devices; expected a count >= 1, -1 (all), \"auto\" or a list like \"0,1\". HINT: "
             "use {}=1 for one device.",
             what, request.count(), what);
  return request.count();
}

}  // namespace

const char* to_string(Accelerator accelerator) {
  switch (accelerator) {
    case Accelerator::kCpu:
      return "cpu";
    case Accelerator::kCuda:
      return "cuda";
  }
  return "?";
}

const char* to_string(StrategyKind strategy) {
  switch (strategy) {
    case StrategyKind::kSingleDevice:
      return "single_device";
    case StrategyKind::kDdp:
      return "ddp";
    case StrategyKind::kDp:
      return "dp";
    case StrategyKind::kDdp2:
      return "ddp2";
    case StrategyKind::kFsdp:
      return "fsdp";
    case StrategyKind::kPipeline:
      return "pipeline";
  }
  return "?";
}

bool requests_gpus_by_count(const TrainerOptions& options) {
  // The seed documents' gpus=N asks for CUDA devices; gpus=0 is the CPU.
  const std::optional<DeviceRequest>& gpus = options.gpus;
  return gpus && (gpus->is_auto() || !gpus->indices().empty() || gpus->count() != 0);
}

std::string describe_accelerator_request(const TrainerOptions& options) {
  if (requests_gpus_by_count(options)) return fmt::format("gpus={}", options.gpus->to_string());
  return fmt::format("accelerator='{}'", to_string(options.accelerator));
}

Accelerator resolve_accelerator(const TrainerOptions& options, int64_t visible_gpus) {
  if (requests_gpus_by_count(options)) return Accelerator::kCuda;
  switch (options.accelerator) {
    case AcceleratorRequest::kAuto:
      return visible_gpus > 0 ? Accelerator::kCuda : Accelerator::kCpu;
    case AcceleratorRequest::kCpu:
      return Accelerator::kCpu;
    case AcceleratorRequest::kGpu:
      return Accelerator::kCuda;
  }
  return Accelerator::kCpu;
}

RunLayout resolve_run_layout(const TrainerOptions& options, const NodeResources& node) {
  RunLayout layout;
  layout.accelerator = resolve_accelerator(options, node.gpus);
  // gpus=N is the seed documents' accelerator="gpu", devices=N.
  const bool by_gpus = requests_gpus_by_count(options);
  layout.device_request = by_gpus ? *options.gpus : options.devices;
  layout.devices = resolve_devices(layout.device_request, by_gpus ? "gpus" : "devices", layout.accelerator, node);
  VOLT_CHECK(options.num_nodes >= 1, "num_nodes={} must be >= 1. HINT: a run on one machine is num_nodes=1.",
             options.num_nodes);
  layout.num_nodes = options.num_nodes;
  const int64_t devices_in_run = layout.devices * layout.num_nodes;
  layout.strategy = requested_strategy(options.strategy)
                        .value_or(devices_in_run > 1 ? StrategyKind::kDdp : StrategyKind::kSingleDevice);
  layout.strategy_finds_unused_parameters = options.strategy == StrategyRequest::kDdpFindUnusedParametersTrue;
  VOLT_CHECK(layout.strategy != StrategyKind::kSingleDevice || devices_in_run == 1,
             "strategy='single_device' runs one process, but devices={} x num_nodes={} asks for {}. HINT: use "
             "strategy='ddp' (or 'auto'), or devices=1.",
             layout.devices, layout.num_nodes, devices_in_run);
  VOLT_CHECK(layout.strategy != StrategyKind::kDp || layout.num_nodes == 1,
             "strategy='dp' runs one process on one node, but num_nodes={}. HINT: use strategy='ddp2' (dp inside "
             "each node, gradients all-reduced across nodes) or 'ddp'.",
             layout.num_nodes);
  // dp and ddp2 run one process per node, which drives all of the node's devices; so does a
  // pipeline, one stage per device (over several nodes, each node's pipeline is a ddp replica).
  const bool replicated = layout.strategy == StrategyKind::kDp || layout.strategy == StrategyKind::kDdp2;
  layout.replicas_per_process = replicated ? layout.devices : 1;
  layout.processes_per_node = replicated || layout.strategy == StrategyKind::kPipeline ? 1 : layout.devices;
  return layout;
}

}  // namespace volt
