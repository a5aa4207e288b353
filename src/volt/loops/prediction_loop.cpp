#include "volt/loops/prediction_loop.h"

#include <torch/serialize.h>
#include <torch/torch.h>

#include "volt/data/data_loader.h"
#include "volt/loops/evaluation_loop.h"
#include "volt/module/lightning_module.h"
#include "volt/precision/precision_plugin.h"
#include "volt/strategies/strategy.h"

namespace volt {

namespace {

std::string serialize(const std::vector<torch::Tensor>& tensors) {
  c10::List<torch::Tensor> list;
  // CPU copies: the gather travels over Gloo's CPU path whatever device predicted.
  for (const auto& t : tensors) list.push_back(t.defined() ? t.to(torch::kCPU) : t);
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(list));
  return std::string(bytes.begin(), bytes.end());
}

std::vector<torch::Tensor> deserialize(const std::string& bytes) {
  const c10::IValue value = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  std::vector<torch::Tensor> out;
  for (const c10::IValue& t : value.toListRef()) out.push_back(t.isTensor() ? t.toTensor() : torch::Tensor());
  return out;
}

}  // namespace

std::vector<torch::Tensor> PredictionLoop::run(LightningModule& module, const DataLoader& loader,
                                               std::optional<int64_t> batches, bool gather) const {
  std::vector<torch::Tensor> outputs;
  {
    const TrainingModeScope eval_mode(module, /*training=*/false);
    torch::NoGradGuard no_grad;
    // No collective until the gather: a stream's processes may predict different counts.
    BatchStream stream = loader.stream(0, batches);
    for (int64_t i = 0; stream.has_next(); ++i) {
      const Batch batch = prepare_batch(stream.next(), device_, precision_);
      const AutocastGuard autocast = precision_.forward_context();
      outputs.push_back(module.predict_step(batch, i));
    }
  }
  if (!gather) return outputs;
  // Every rank takes part (a collective); only rank 0 keeps the whole.
  const std::vector<std::string> gathered = strategy_.all_gather_bytes(serialize(outputs));
  if (!strategy_.is_global_zero()) return outputs;
  std::vector<torch::Tensor> all;
  for (const std::string& bytes : gathered) {
    std::vector<torch::Tensor> part = deserialize(bytes);
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

}  // namespace volt
