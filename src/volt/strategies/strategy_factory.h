// Builds the Strategy a RunPlan names: the one place that maps StrategyKind to a class.
#pragma once

#include <memory>

#include "volt/core/env.h"
#include "volt/plan/run_plan.h"
#include "volt/strategies/strategy.h"

namespace volt {

class Console;

/// The strategy `plan` names (single device, dp, ddp, ddp2, fsdp or pipeline), over
/// `plan.topology`, with the plan's process-group, gradient-sync, replica and pipeline settings.
///
/// `env` is this process's environment: the processes a ddp-family strategy launches inherit it,
/// with `plan.child_env` on top. `console` gets the pipeline's notes (the Trainer passes a silent
/// one off global rank 0). Where the plan leaves the rendezvous port open (`main_port == 0`),
/// a free port is picked here, into the strategy's copy of the topology: choosing it is the one
/// impure step, and the plan stays as it was resolved.
///
/// Example:
/// ```
/// const volt::RunPlan plan = volt::resolve_run_plan(options, env, machine);
/// std::unique_ptr<volt::Strategy> strategy = volt::make_strategy(plan, env, volt::make_stdio_console());
/// ```
std::unique_ptr<Strategy> make_strategy(const RunPlan& plan, const Env& env, std::shared_ptr<Console> console);

}  // namespace volt
