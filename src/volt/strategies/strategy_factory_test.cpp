#include "volt/strategies/strategy_factory.h"

#include <gtest/gtest.h>

#include "volt/core/console.h"
#include "volt/strategies/ddp_strategy.h"
#include "volt/strategies/dp_strategy.h"

namespace volt {
namespace {

const MachineInfo kMachine{8, "/work", "host0"};

RunPlan plan(const TrainerOptions& options, Env::Vars env = {}) {
  return resolve_run_plan(options, Env(std::move(env)), kMachine);
}

std::unique_ptr<Strategy> strategy_of(const RunPlan& plan) { return make_strategy(plan, Env(), make_stdio_console()); }

TEST(MakeStrategy, MakesTheStrategyThePlanNames) {
  EXPECT_NE(dynamic_cast<SingleDeviceStrategy*>(strategy_of(plan({})).get()), nullptr);
  EXPECT_NE(dynamic_cast<DpStrategy*>(strategy_of(plan({.devices = 2, .strategy = StrategyRequest::kDp})).get()),
            nullptr);
  EXPECT_NE(dynamic_cast<DdpStrategy*>(strategy_of(plan({.devices = 2, .strategy = StrategyRequest::kDdp})).get()),
            nullptr);
}

TEST(MakeStrategy, PicksAFreeRendezvousPortForTheStrategyAndLeavesThePlanAsResolved) {
  const RunPlan resolved = plan({.devices = 2, .strategy = StrategyRequest::kDdp});
  ASSERT_EQ(resolved.topology.main_port, 0);  // "a free port", chosen by whoever launches
  const std::unique_ptr<Strategy> strategy = strategy_of(resolved);
  EXPECT_GT(strategy->topology().main_port, 0);
  EXPECT_EQ(resolved.topology.main_port, 0);
}

TEST(MakeStrategy, KeepsTheRendezvousPortThePlanNames) {
  const RunPlan resolved = plan({.devices = 2, .strategy = StrategyRequest::kDdp}, {{"LOCAL_RANK", "1"},
                                                                                    {"NODE_RANK", "0"},
                                                                                    {"WORLD_SIZE", "2"},
                                                                                    {"MASTER_ADDR", "127.0.0.1"},
                                                                                    {"MASTER_PORT", "4444"}});
  EXPECT_EQ(strategy_of(resolved)->topology().main_port, 4444);
}

}  // namespace
}  // namespace volt
