#include "volt/loops/prediction_loop.h"

#include <torch/serialize.h>
#include <torch/torch.h>

#include "volt/callbacks/callback.h"
#include "volt/data/data_loader.h"
#include "volt/loops/evaluation_loop.h"
#include "volt/module/lightning_module.h"
#include "volt/precision/precision_plugin.h"
#include "volt/profiler/profiler.h"
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
  const auto notify = [&](const CallbackHook& hook, const HookPoint& point) {
    if (callbacks_ != nullptr) callbacks_->dispatch(hook, point);
  };
  std::vector<torch::Tensor> outputs;
  {
    const TrainingModeScope eval_mode(module, /*training=*/false);
    torch::NoGradGuard no_grad;
    notify([](Callback& c, const CallbackContext& x, CallbackServices& s) { return c.on_predict_start(x, s); }, {});
    module.on_predict_start();
    module.on_predict_epoch_start();
    // No collective until the gather: a stream's processes may predict different counts.
    BatchStream stream = loader.stream(0, batches);
    for (int64_t i = 0; stream.has_next(); ++i) {
      std::optional<Profiler::Scope> fetch;
      if (profiler_) fetch.emplace(*profiler_, Action::kEvalDataFetch);
      const Batch batch = prepare_batch(module, stream.next(), device_, precision_, /*dataloader_idx=*/0);
      fetch.reset();
      HookPoint point{.batch = &batch, .batch_idx = i};
      notify([](Callback& c, const CallbackContext& x, CallbackServices& s) { return c.on_predict_batch_start(x, s); },
             point);
      module.on_predict_batch_start(batch, i, 0);
      torch::Tensor output;
      {
        std::optional<Profiler::Scope> step;
        if (profiler_) step.emplace(*profiler_, Action::kEvalStep);
        const AutocastGuard autocast = precision_.forward_context();
        output = module.predict_step(batch, i);
      }
      point.outputs = &output;
      notify([](Callback& c, const CallbackContext& x, CallbackServices& s) { return c.on_predict_batch_end(x, s); },
             point);
      module.on_predict_batch_end(output, batch, i, 0);
      outputs.push_back(std::move(output));
      if (profiler_) profiler_->step_done();
    }
    module.on_predict_epoch_end();
    notify([](Callback& c, const CallbackContext& x, CallbackServices& s) { return c.on_predict_end(x, s); }, {});
    module.on_predict_end();
  }
  if (!gather) return outputs;
  // Every rank takes part (a collective); only rank 0 keeps the whole.
  const std::vector<std::string> gathered = strategy_.collectives().all_gather_bytes(serialize(outputs));
  if (!strategy_.is_global_zero()) return outputs;
  std::vector<torch::Tensor> all;
  for (const std::string& bytes : gathered) {
    std::vector<torch::Tensor> part = deserialize(bytes);
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

}  // namespace volt
