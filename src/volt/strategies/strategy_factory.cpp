#include "volt/strategies/strategy_factory.h"

#include <fmt/format.h>

#include <optional>
#include <string>

#include "volt/core/console.h"
#include "volt/distributed/subprocess_launcher.h"
#include "volt/environments/requeue.h"
#include "volt/plan/process_setup.h"
#include "volt/strategies/ddp2_strategy.h"
#include "volt/strategies/ddp_strategy.h"
#include "volt/strategies/dp_strategy.h"
#include "volt/strategies/fsdp_strategy.h"
#include "volt/strategies/pipeline_strategy.h"

namespace volt {
namespace {

/// The process group and gradient synchronization of the ddp family, as the plan asks.
DdpOptions ddp_options(const RunPlan& plan) {
  DdpOptions ddp;
  ddp.process_group.backend = to_string(plan.process_group_backend);
  ddp.process_group.timeout = plan.process_group_timeout;
  ddp.process_group.join_timeout = plan.join_timeout;
  // A stop signal (scancel, Ctrl-C) while waiting for the other ranks ends the wait at once: there
  // is nothing to save yet, and the signal must not sit in the stop handler until join_timeout.
  ddp.process_group.abort_check = []() -> std::optional<std::string> {
    if (const int signal = internal::StopSignalGuard::received()) {
      return fmt::format("received {} before training started (nothing trained, nothing saved)", signal_name(signal));
    }
    return std::nullopt;
  };
  ddp.gradient_sync.bucket_cap_mb = plan.bucket_cap_mb;
  ddp.gradient_sync.find_unused_parameters = plan.find_unused_parameters;
  ddp.launch_local_processes = plan.launch_local_processes;
  return ddp;
}

}  // namespace

std::unique_ptr<Strategy> make_strategy(const RunPlan& plan, const Env& env, std::shared_ptr<Console> console) {
  if (plan.strategy == StrategyKind::kSingleDevice) return std::make_unique<SingleDeviceStrategy>(plan.topology);
  // 16-mixed scales the loss before its backward; Pipe::train_step seeds its micro-batches'
  // backwards itself, which that scale cannot reach: train_step refuses to run then.
  PipeOptions pipe{.balance = plan.pipeline_balance,
                   .chunks = plan.pipeline_chunks,
                   .schedule = plan.pipeline_schedule,
                   .loss_scaling = plan.precision == Precision::k16Mixed};
  if (plan.strategy == StrategyKind::kPipeline) {
    // One stage per device: the selected GPUs, or stage threads sharing the CPU.
    if (plan.cuda_devices.empty()) pipe.devices.assign(static_cast<size_t>(plan.devices), torch::kCPU);
    for (int64_t device : plan.cuda_devices)
      pipe.devices.emplace_back(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
    pipe.report = [console](const std::string& line) { console->info(line); };
    if (plan.topology.world_size == 1) return std::make_unique<PipelineStrategy>(plan.topology, std::move(pipe));
  }
  DataParallelOptions dp{.replicas = plan.replicas_per_process,
                         .deterministic = plan.deterministic != DeterministicMode::kOff};
  // On GPUs each replica has its device (copies of the module); on the CPU they are threads.
  for (int64_t device : plan.cuda_devices)
    dp.devices.emplace_back(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
  if (plan.strategy == StrategyKind::kDp) return std::make_unique<DpStrategy>(plan.topology, std::move(dp));

  // The one impure step of planning, taken when the first stage needs the strategy: a launcher
  // picks a free rendezvous port for its children. It goes into the strategy's topology; the
  // plan keeps main_port == 0 ("a free port"), as it was resolved.
  Topology topology = plan.topology;
  if (topology.main_port == 0) topology.main_port = find_free_port();
  const DdpOptions ddp = ddp_options(plan);
  // The processes this one launches see only the GPUs the plan selected (CUDA_VISIBLE_DEVICES).
  Env child_env = env;
  for (const auto& [name, value] : plan.child_env) child_env = child_env.with(name, value);
  switch (plan.strategy) {
    case StrategyKind::kDdp2:
      return std::make_unique<Ddp2Strategy>(std::move(topology), ddp, std::move(dp), std::move(child_env));
    case StrategyKind::kPipeline:
      return std::make_unique<PipelineDdpStrategy>(std::move(topology), ddp, std::move(child_env), std::move(pipe));
    case StrategyKind::kFsdp: {
      if (plan.sharding_strategy != ShardingStrategy::kNoShard) {
        return std::make_unique<FsdpStrategy>(
            std::move(topology), ddp, std::move(child_env),
            FsdpOptions{.sharding = plan.sharding_strategy, .min_unit_params = plan.fsdp_min_unit_params});
      }
      // no_shard shards nothing: it is ddp (the same gradient all-reduce, checkpoints and memory),
      // named as the user asked.
      DdpOptions named = ddp;
      named.name = "fsdp";
      return std::make_unique<DdpStrategy>(std::move(topology), std::move(named), std::move(child_env));
    }
    case StrategyKind::kDdp:
    case StrategyKind::kSingleDevice:  // made above, like kDp
    case StrategyKind::kDp:
      break;
  }
  return std::make_unique<DdpStrategy>(std::move(topology), ddp, std::move(child_env));
}

}  // namespace volt
