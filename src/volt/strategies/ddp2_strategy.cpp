#include "volt/strategies/ddp2_strategy.h"

#include "volt/core/error.h"

namespace volt {

Ddp2Strategy::Ddp2Strategy(Topology node_topology, DdpOptions ddp, DataParallelOptions dp, Env env)
    : ddp_(std::move(node_topology), std::move(ddp), std::move(env)), parallel_(std::move(dp)) {
  VOLT_INTERNAL_ASSERT(ddp_.topology().processes_per_node == 1, "ddp2 runs one process per node, not {}",
                       ddp_.topology().processes_per_node);
}

}  // namespace volt
