#include "volt/strategies/strategy.h"

#include <fmt/format.h>

#include "volt/core/error.h"
#include "volt/module/lightning_module.h"
#include "volt/optim/optimizer_state.h"

namespace volt {

torch::Tensor Strategy::training_step(LightningModule& module, const Batch& batch, int64_t batch_idx) {
  // Lightning calls training_step_end on every strategy; with one piece it is the identity.
  return module.training_step_end({module.training_step(batch, batch_idx)}, {batch.size()});
}

std::vector<c10::IValue> Strategy::gather_optimizer_states(
    const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) {
  std::vector<c10::IValue> states;
  states.reserve(optimizers.size());
  for (const auto& optimizer : optimizers) states.push_back(optimizer_state_dict(*optimizer));
  return states;
}

std::vector<c10::IValue> Strategy::local_optimizer_states(
    const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) {
  return Strategy::gather_optimizer_states(optimizers);  // nothing sharded: the same, without a collective
}

void Strategy::load_parameter_pieces(const ParameterPieces& pieces, const std::string& path) {
  if (pieces.empty()) return;
  throw CheckpointError(fmt::format(
      "checkpoint '{}' holds this process's pieces of {} parameters ('{}', ...), which strategy='{}' keeps whole. "
      "HINT: resume it under strategy='fsdp' with sharding_strategy='full_shard' on as many processes, or write it "
      "in one file first (volt::consolidate_sharded_checkpoint).",
      path, pieces.size(), pieces.begin()->first, name()));
}

void Strategy::load_optimizer_state(torch::optim::Optimizer& optimizer, const c10::IValue& state) {
  load_optimizer_state_dict(optimizer, state);
}

}  // namespace volt
