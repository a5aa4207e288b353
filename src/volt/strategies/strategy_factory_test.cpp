#include "volt/strategies/strategy_factory.h"

#include <gtest/gtest.h>

#include <typeinfo>

#include "volt/core/console.h"
#include "volt/core/error.h"
#include "volt/strategies/ddp_strategy.h"
#include "volt/strategies/dp_strategy.h"
#include "volt/strategies/fsdp_strategy.h"

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

TEST(MakeStrategy, BuildsFsdpsNoShardAsPlainDdpUnderTheNameFsdp) {
  const std::unique_ptr<Strategy> strategy = strategy_of(
      plan({.devices = 2, .strategy = StrategyRequest::kFsdp, .sharding_strategy = ShardingStrategy::kNoShard}));
  const Strategy& made = *strategy;
  EXPECT_EQ(typeid(made), typeid(DdpStrategy));    // not an FsdpStrategy that behaves as ddp
  EXPECT_EQ(strategy->name(), "fsdp");             // what the summary and errors name
  EXPECT_EQ(strategy->state_sharding(), nullptr);  // so checkpoints are ddp's: whole optimizer state
}

TEST(MakeStrategy, BuildsFsdpForTheShardingStrategiesThatShard) {
  for (const ShardingStrategy sharding : {ShardingStrategy::kShardGradOp, ShardingStrategy::kFullShard}) {
    const std::unique_ptr<Strategy> strategy =
        strategy_of(plan({.devices = 2, .strategy = StrategyRequest::kFsdp, .sharding_strategy = sharding}));
    EXPECT_NE(dynamic_cast<FsdpStrategy*>(strategy.get()), nullptr) << to_string(sharding);
    EXPECT_EQ(strategy->name(), "fsdp");
    EXPECT_NE(strategy->state_sharding(), nullptr) << to_string(sharding);
  }
}

TEST(MakeStrategy, NamesPlainDdpDdp) {
  EXPECT_EQ(strategy_of(plan({.devices = 2, .strategy = StrategyRequest::kDdp}))->name(), "ddp");
}

TEST(FsdpStrategy, RefusesNoShardWhichIsDdp) {
  EXPECT_THROW(FsdpStrategy(Topology(), DdpOptions(), Env(), FsdpOptions{.sharding = ShardingStrategy::kNoShard}),
               Error);
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
