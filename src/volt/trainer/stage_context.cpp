#include "volt/trainer/stage_context.h"

#include <fmt/format.h>

#include <algorithm>
#include <typeinfo>

#include "volt/core/console.h"
#include "volt/core/error.h"
#include "volt/loops/fit_loop.h"

namespace volt::internal {

bool StageView::shards_gradients() const { return strategy_.state_sharding() != nullptr; }

void StageView::print(const std::string& line) const { console_->info(line); }

void StageCallbacks::dispatch(const CallbackHook& hook, const HookPoint& point) {
  const CallbackContext c = context(point);
  for (const auto& callback : callbacks_) hook(*callback, c, *this);
}

CallbackContext StageCallbacks::context(const HookPoint& point) const {
  CallbackContext c;
  c.epoch = progress_.epoch;
  c.global_step = progress_.global_step;
  c.metrics = &metrics_;
  c.module = &module_;
  c.batch = point.batch;
  c.batch_idx = point.batch_idx;
  c.dataloader_idx = point.dataloader_idx;
  c.outputs = point.outputs;
  return c;
}

void StageCallbacks::save_checkpoint(const std::string& path) {
  throw Error(fmt::format(
      "a callback asked to save checkpoint '{}' during validate, test or predict, where there is no training "
      "state to save. HINT: save checkpoints from the fit hooks (on_train_epoch_end, on_validation_end).",
      path));
}

void StageCallbacks::save_weights_checkpoint(const std::string& path) {
  throw Error(
      fmt::format("a callback asked to save weights checkpoint '{}' during validate, test or predict; only fit saves "
                  "checkpoints. HINT: save checkpoints from the fit hooks (on_train_epoch_end, on_validation_end).",
                  path));
}

bool StageCallbacks::broadcast_decision(bool decision) { return rank_zero_decision(strategy_, decision); }

void StageCallbacks::remove_checkpoint(const std::string& path) {
  throw Error(
      fmt::format("a callback asked to remove checkpoint '{}' during validate, test or predict; only fit manages "
                  "checkpoints. HINT: remove checkpoints from the fit hooks.",
                  path));
}

std::vector<std::shared_ptr<Callback>> with_module_callbacks(std::vector<std::shared_ptr<Callback>> callbacks,
                                                             LightningModule& module) {
  for (std::shared_ptr<Callback>& added : module.configure_callbacks()) {
    VOLT_CHECK(added != nullptr,
               "{}::configure_callbacks returned a null callback. HINT: return only created callbacks, e.g. "
               "std::make_shared<ModelCheckpoint>(...), or leave one out.",
               module.name());
    const Callback& replacing = *added;
    callbacks.erase(std::remove_if(callbacks.begin(), callbacks.end(),
                                   [&](const std::shared_ptr<Callback>& c) { return typeid(*c) == typeid(replacing); }),
                    callbacks.end());
    callbacks.push_back(std::move(added));
  }
  return callbacks;
}

}  // namespace volt::internal
