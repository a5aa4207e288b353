#include "volt/plan/gpu_placement.h"

#include <gtest/gtest.h>

#include "volt/core/error.h"

namespace volt {
namespace {

std::string error_of(const GpuPlacementRequest& request, Env::Vars env = {}) {
  try {
    place_gpus(request, Env(std::move(env)));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(GpuPlacement, DdpUnderVoltsLauncherNarrowsTheChildrensDevicesInPciOrder) {
  const GpuPlacement p = place_gpus(
      {.devices = DeviceRequest("1,3"), .processes_per_node = 2, .launches_local_processes = true, .visible_gpus = 4},
      Env(Env::Vars{}));
  EXPECT_EQ(p.devices, (std::vector<int64_t>{1}));  // local rank 0 uses the first selected device
  EXPECT_EQ(p.child_env.at("CUDA_DEVICE_ORDER"), "PCI_BUS_ID");
  EXPECT_EQ(p.child_env.at("CUDA_VISIBLE_DEVICES"), "1,3");
}

TEST(GpuPlacement, ChildIdsPassThroughTheParentsVisibleDevices) {
  const GpuPlacement p = place_gpus(
      {.devices = DeviceRequest("0,2"), .processes_per_node = 2, .launches_local_processes = true, .visible_gpus = 3},
      Env(Env::Vars{{"CUDA_VISIBLE_DEVICES", "4,5,7"}}));
  EXPECT_EQ(p.child_env.at("CUDA_VISIBLE_DEVICES"), "4,7");
}

TEST(GpuPlacement, ALaunchedChildUsesItsLocalRanksDevice) {
  const GpuPlacement p =
      place_gpus({.devices = DeviceRequest("1,3"), .processes_per_node = 2, .local_rank = 1, .visible_gpus = 2},
                 Env(Env::Vars{{"CUDA_VISIBLE_DEVICES", "1,3"}, {kGpuSelectionVar, "1,3"}}));
  EXPECT_EQ(p.devices, (std::vector<int64_t>{1}));
  EXPECT_TRUE(p.child_env.empty());
}

TEST(GpuPlacement, SlurmTasksThatSeeOnlyTheirOwnGpuUseDeviceZero) {
  const GpuPlacement p = place_gpus(
      {.devices = 2, .processes_per_node = 2, .local_rank = 1, .cluster = ClusterKind::kSlurm, .visible_gpus = 1},
      Env(Env::Vars{{"SLURM_LOCALID", "1"}, {"CUDA_VISIBLE_DEVICES", "0"}, {"SLURM_STEP_GPUS", "3"}}));
  EXPECT_EQ(p.devices, (std::vector<int64_t>{0}));
  EXPECT_TRUE(p.child_env.empty());  // SLURM's variables are left as SLURM set them
}

TEST(GpuPlacement, SlurmTasksThatSeeTheNodesGpusUseTheirLocalRank) {
  const GpuPlacement p = place_gpus({.devices = 4,
                                     .processes_per_node = 4,
                                     .local_rank = 2,
                                     .cluster = ClusterKind::kSlurm,
                                     .launches_local_processes = true,
                                     .visible_gpus = 4},
                                    Env(Env::Vars{{"CUDA_VISIBLE_DEVICES", "0,1,2,3"}}));
  EXPECT_EQ(p.devices, (std::vector<int64_t>{2}));
  EXPECT_TRUE(p.child_env.empty());
}

TEST(GpuPlacement, DpAndDdp2UseEveryDeviceOfTheNodeWithTheFirstAsRoot) {
  EXPECT_EQ(place_gpus({.devices = -1, .visible_gpus = 3}, Env(Env::Vars{})).devices, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(place_gpus({.devices = DeviceRequest("2, 0"), .visible_gpus = 3}, Env(Env::Vars{})).devices,
            (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(place_gpus({.devices = DeviceRequest("auto"), .visible_gpus = 2}, Env(Env::Vars{})).devices,
            (std::vector<int64_t>{0, 1}));
}

TEST(GpuPlacement, RequestsTheMachineCannotServeListWhatIsAvailable) {
  const std::string too_many = error_of({.devices = 4, .visible_gpus = 2}, {{"CUDA_VISIBLE_DEVICES", "2,3"}});
  EXPECT_NE(too_many.find("sees 2: 0, 1 (CUDA_VISIBLE_DEVICES=2,3)"), std::string::npos) << too_many;
  const std::string index = error_of({.devices = DeviceRequest("0,5"), .visible_gpus = 2});
  EXPECT_NE(index.find("names CUDA device 5"), std::string::npos) << index;
  const std::string none = error_of({.devices = 1, .visible_gpus = 0});
  EXPECT_NE(none.find("available: cpu"), std::string::npos) << none;
  const std::string fewer = error_of({.devices = DeviceRequest("1"), .processes_per_node = 2, .visible_gpus = 2});
  EXPECT_NE(fewer.find("one CUDA device each"), std::string::npos) << fewer;
}

}  // namespace
}  // namespace volt
