#include "volt/options/run_layout.h"

#include <gtest/gtest.h>

#include "volt/core/testing.h"

namespace volt {
namespace {

using volt::testing::error_message;

constexpr NodeResources kCpuNode{.cores = 8, .gpus = 0};
constexpr NodeResources kGpuNode{.cores = 8, .gpus = 4};

TEST(RunLayout, DefaultsAreOneCpuProcess) {
  const RunLayout layout = resolve_run_layout({}, kCpuNode);
  EXPECT_EQ(layout.accelerator, Accelerator::kCpu);
  EXPECT_EQ(layout.strategy, StrategyKind::kSingleDevice);
  EXPECT_EQ(layout.devices, 1);
  EXPECT_EQ(layout.num_nodes, 1);
  EXPECT_EQ(layout.processes_per_node, 1);
  EXPECT_EQ(layout.replicas_per_process, 1);
  EXPECT_EQ(layout.world_size(), 1);
}

TEST(RunLayout, DdpIsOneProcessPerDeviceAndAutoPicksItForSeveral) {
  const RunLayout layout = resolve_run_layout({.devices = 3, .num_nodes = 2}, kCpuNode);
  EXPECT_EQ(layout.strategy, StrategyKind::kDdp);
  EXPECT_EQ(layout.processes_per_node, 3);
  EXPECT_EQ(layout.world_size(), 6);
  const RunLayout unused =
      resolve_run_layout({.devices = 2, .strategy = StrategyRequest::kDdpFindUnusedParametersTrue}, kCpuNode);
  EXPECT_EQ(unused.strategy, StrategyKind::kDdp);
  EXPECT_TRUE(unused.strategy_finds_unused_parameters);
}

TEST(RunLayout, DpAndDdp2RunOneProcessPerNodeWithAReplicaPerDevice) {
  const RunLayout dp = resolve_run_layout({.devices = 2, .strategy = StrategyRequest::kDp}, kCpuNode);
  EXPECT_EQ(dp.processes_per_node, 1);
  EXPECT_EQ(dp.replicas_per_process, 2);
  const RunLayout ddp2 =
      resolve_run_layout({.devices = 2, .strategy = StrategyRequest::kDdp2, .num_nodes = 2}, kCpuNode);
  EXPECT_EQ(ddp2.strategy, StrategyKind::kDdp2);
  EXPECT_EQ(ddp2.devices, 2);
  EXPECT_EQ(ddp2.processes_per_node, 1);
  EXPECT_EQ(ddp2.replicas_per_process, 2);
  EXPECT_EQ(ddp2.world_size(), 2);
}

TEST(RunLayout, DevicesCountCoresAndGpus) {
  EXPECT_EQ(resolve_run_layout({.devices = -1}, kCpuNode).devices, 8);
  EXPECT_EQ(resolve_run_layout({.devices = DeviceRequest({0, 2})}, kCpuNode).devices, 2);
  // On a node with GPUs "auto" is CUDA with every GPU.
  const RunLayout gpus = resolve_run_layout({}, kGpuNode);
  EXPECT_EQ(gpus.accelerator, Accelerator::kCuda);
  EXPECT_EQ(gpus.devices, 4);
  EXPECT_EQ(resolve_run_layout({.accelerator = AcceleratorRequest::kCpu}, kGpuNode).accelerator, Accelerator::kCpu);
}

TEST(RunLayout, SeedDocumentGpusAskForCuda) {
  const RunLayout layout = resolve_run_layout({.gpus = DeviceRequest(2)}, kGpuNode);
  EXPECT_EQ(layout.accelerator, Accelerator::kCuda);
  EXPECT_EQ(layout.devices, 2);
  EXPECT_EQ(layout.device_request.count(), 2);
  EXPECT_EQ(resolve_run_layout({.gpus = DeviceRequest(0)}, kGpuNode).devices, 4);  // gpus=0: devices decide
  EXPECT_EQ(resolve_run_layout({.gpus = DeviceRequest(0)}, kCpuNode).accelerator, Accelerator::kCpu);
  EXPECT_EQ(describe_accelerator_request({.gpus = DeviceRequest(2)}), "gpus=2");
  EXPECT_EQ(describe_accelerator_request({.accelerator = AcceleratorRequest::kGpu}), "accelerator='gpu'");
}

TEST(RunLayout, ImpossibleLayoutsSayWhatToChange) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {error_message([] { resolve_run_layout({.devices = 2, .strategy = StrategyRequest::kSingleDevice}, kCpuNode); }),
       "strategy='ddp'"},
      {error_message(
           [] { resolve_run_layout({.devices = 2, .strategy = StrategyRequest::kDp, .num_nodes = 2}, kCpuNode); }),
       "strategy='ddp2'"},
      {error_message([] { resolve_run_layout({.num_nodes = 0}, kCpuNode); }), "num_nodes=0 must be >= 1"},
      {error_message([] { resolve_run_layout({.devices = 0}, kCpuNode); }), "devices=0 asks for no devices"},
      {error_message([] { resolve_run_layout({.accelerator = AcceleratorRequest::kGpu}, kCpuNode); }),
       "devices=auto takes every visible CUDA device, but there are none"},
  };
  for (const auto& [message, expected] : cases) {
    EXPECT_NE(message.find(expected), std::string::npos) << message;
    EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace volt
