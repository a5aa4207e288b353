#include "volt/plan/gpu_placement.h"

#include "volt/core/error.h"
#include "volt/core/strings.h"

namespace volt {

namespace {

/// "0, 1 (CUDA_VISIBLE_DEVICES=2,3)" or "none", for error messages.
std::string visible_list(int64_t visible, const Env& env) {
  if (visible == 0) return "none";
  std::vector<std::string> ids;
  for (int64_t i = 0; i < visible; ++i) ids.push_back(std::to_string(i));
  std::string out = join(ids, ", ");
  if (const auto cvd = env.get("CUDA_VISIBLE_DEVICES")) out += fmt::format(" (CUDA_VISIBLE_DEVICES={})", *cvd);
  if (const auto step = env.get("SLURM_STEP_GPUS")) out += fmt::format(" (SLURM_STEP_GPUS={})", *step);
  return out;
}

/// The requested devices in this process's numbering (before per-rank selection).
std::vector<int64_t> selected_devices(const GpuPlacementRequest& r, const Env& env) {
  const int64_t visible = r.visible_gpus;
  VOLT_CHECK(visible > 0,
             "devices={} asks for CUDA devices, but none is visible to this process; available: cpu. HINT: use "
             "accelerator=\"cpu\", or check CUDA_VISIBLE_DEVICES{} and the driver (nvidia-smi).",
             r.devices.to_string(),
             env.has("CUDA_VISIBLE_DEVICES") ? fmt::format("={}", env.get_or("CUDA_VISIBLE_DEVICES", "")) : "");
  std::vector<int64_t> out;
  if (!r.devices.indices().empty()) {
    for (int index : r.devices.indices()) {
      VOLT_CHECK(index < visible,
                 "devices={} names CUDA device {}, but this process sees {} device(s): {}. HINT: use indices below "
                 "{}, or a count.",
                 r.devices.to_string(), index, visible, visible_list(visible, env), visible);
      out.push_back(index);
    }
    return out;
  }
  const int64_t count = r.devices.is_auto() || r.devices.count() == -1 ? visible : r.devices.count();
  VOLT_CHECK(count >= 1 && count <= visible,
             "devices={} asks for {} CUDA device(s), but this process sees {}: {}. HINT: use devices<={} or -1 for "
             "all of them.",
             r.devices.to_string(), count, visible, visible_list(visible, env), visible);
  for (int64_t i = 0; i < count; ++i) out.push_back(i);
  return out;
}

}  // namespace

GpuPlacement place_gpus(const GpuPlacementRequest& r, const Env& env) {
  VOLT_INTERNAL_ASSERT(r.processes_per_node >= 1 && r.local_rank >= 0 && r.local_rank < r.processes_per_node,
                       "place_gpus: local rank {} of {}", r.local_rank, r.processes_per_node);
  GpuPlacement placement;
  const bool one_per_process = r.processes_per_node > 1;
  // A child Volt launched sees exactly the devices its parent selected, numbered from 0.
  if (const auto selection = env.get(kGpuSelectionVar)) {
    const int64_t selected = static_cast<int64_t>(split(*selection, ',').size());
    VOLT_CHECK(r.visible_gpus == selected,
               "this process was launched to use CUDA devices {} ({}={}), but it sees {}. HINT: do not change "
               "CUDA_VISIBLE_DEVICES in the program before the Trainer starts.",
               *selection, kGpuSelectionVar, *selection, r.visible_gpus);
    if (one_per_process) {
      placement.devices = {r.local_rank};
    } else {
      for (int64_t i = 0; i < selected; ++i) placement.devices.push_back(i);
    }
    return placement;
  }
  const bool external = r.cluster != ClusterKind::kLocal;
  if (external && one_per_process && r.visible_gpus == 1) {
    // SLURM's --gpus-per-task (or gres binding) shows each task only its own GPU.
    placement.devices = {0};
    return placement;
  }
  const std::vector<int64_t> selected = selected_devices(r, env);
  if (one_per_process) {
    VOLT_CHECK(static_cast<int64_t>(selected.size()) >= r.processes_per_node,
               "{} processes per node need one CUDA device each, but devices={} selects {}: {}. HINT: request as "
               "many devices as processes per node.",
               r.processes_per_node, r.devices.to_string(), selected.size(), visible_list(r.visible_gpus, env));
    placement.devices = {selected[static_cast<size_t>(r.local_rank)]};
  } else {
    placement.devices = selected;
  }
  if (!r.launches_local_processes || external) return placement;
  // The children get the selected devices only, in PCI bus order (what nvidia-smi shows), so
  // local rank r uses its device r. Ids pass through this process's CUDA_VISIBLE_DEVICES.
  const auto parent = env.get("CUDA_VISIBLE_DEVICES");
  const std::vector<std::string> parent_ids = parent ? split(*parent, ',') : std::vector<std::string>{};
  std::vector<std::string> ids;
  for (int64_t index : selected) {
    ids.push_back(index < static_cast<int64_t>(parent_ids.size()) ? trim(parent_ids[static_cast<size_t>(index)])
                                                                  : std::to_string(index));
  }
  placement.child_env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID";
  placement.child_env["CUDA_VISIBLE_DEVICES"] = join(ids, ",");
  placement.child_env[kGpuSelectionVar] = join(ids, ",");
  return placement;
}

}  // namespace volt
