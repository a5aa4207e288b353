#include "volt/strategies/strategy.h"

#include "volt/module/lightning_module.h"

namespace volt {

torch::Tensor Strategy::training_step(LightningModule& module, const Batch& batch, int64_t batch_idx) {
  // Lightning calls training_step_end on every strategy; with one piece it is the identity.
  return module.training_step_end({module.training_step(batch, batch_idx)}, {batch.size()});
}

}  // namespace volt
