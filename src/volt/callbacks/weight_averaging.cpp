#include "volt/callbacks/weight_averaging.h"

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>

#include "volt/core/error.h"
#include "volt/module/lightning_module.h"

namespace volt {
namespace {

/// The module's parameters (and buffers with `buffers`) by name, detached, in the module's order.
std::vector<std::pair<std::string, torch::Tensor>> weights_of(LightningModule& module, bool buffers) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : module.named_parameters(/*recurse=*/true))
    out.emplace_back(item.key(), item.value().detach());
  if (buffers) {
    for (const auto& item : module.named_buffers(/*recurse=*/true)) out.emplace_back(item.key(), item.value().detach());
  }
  return out;
}

/// The average's tensor for `name`, on `current`'s device (a checkpoint's tensors load on the CPU).
torch::Tensor& average_for(std::map<std::string, torch::Tensor>& average, const std::string& name,
                           const torch::Tensor& current, const char* who) {
  const auto it = average.find(name);
  VOLT_CHECK(it != average.end(),
             "{} holds no average for '{}'. HINT: resume with the module the checkpoint was written for, or "
             "start without ckpt_path.",
             who, name);
  if (it->second.device() != current.device()) it->second = it->second.to(current.device());
  return it->second;
}

// Copies both ways: a checkpoint kept in memory must not follow the average as it moves on.
StateDict tensors_to_state(const std::map<std::string, torch::Tensor>& tensors) {
  StateDict out = make_state_dict();
  for (const auto& [name, tensor] : tensors) out.insert(name, tensor.detach().clone());
  return out;
}

std::map<std::string, torch::Tensor> state_to_tensors(const c10::IValue& value, const char* who) {
  std::map<std::string, torch::Tensor> out;
  if (value.isNone()) return out;
  VOLT_CHECK(value.isGenericDict(),
             "{}'s checkpoint state holds a {} for its averaged weights; expected a dict of tensors. HINT: the "
             "checkpoint was not written by this callback; start without ckpt_path.",
             who, value.tagKind());
  for (const auto& e : value.toGenericDict()) out[e.key().toStringRef()] = e.value().toTensor().detach().clone();
  return out;
}

int64_t int_or(const StateDict& state, const char* key, int64_t fallback) {
  return state.contains(key) && state.at(key).isInt() ? state.at(key).toInt() : fallback;
}

bool has_batch_norm_statistics(LightningModule& module) {
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    const std::string& name = item.key();
    const auto ends_with = [&name](const std::string& suffix) {
      return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (ends_with("running_mean") || ends_with("running_var")) return true;
  }
  return false;
}

}  // namespace

// ---- StochasticWeightAveraging ----

StochasticWeightAveraging::StochasticWeightAveraging(StochasticWeightAveragingOptions options)
    : options_(std::move(options)) {
  const SwaEpochStart& start = options_.swa_epoch_start;
  VOLT_CHECK(!start.epoch || *start.epoch >= 1,
             "StochasticWeightAveraging swa_epoch_start={} is not a 1-based epoch. HINT: pass an epoch >= 1 "
             "(1 is the first) or a fraction of max_epochs between 0 and 1 (e.g. 0.8).",
             start.epoch.value_or(0));
  VOLT_CHECK(!start.fraction || (*start.fraction >= 0.0 && *start.fraction <= 1.0),
             "StochasticWeightAveraging swa_epoch_start={} is a fraction outside [0, 1]. HINT: pass a fraction of "
             "max_epochs between 0 and 1, or an int epoch >= 1.",
             start.fraction.value_or(0.0));
  VOLT_CHECK(!options_.swa_lrs.empty(),
             "StochasticWeightAveraging needs swa_lrs, the learning rates to anneal to. HINT: pass "
             "{{.swa_lrs = {{0.05}}}} (one for every param group) or one value per param group.");
  for (double lr : options_.swa_lrs) {
    VOLT_CHECK(lr > 0.0,
               "StochasticWeightAveraging swa_lrs holds {}; every learning rate must be > 0. HINT: pass positive "
               "learning rates.",
               lr);
  }
  VOLT_CHECK(options_.annealing_epochs >= 0,
             "StochasticWeightAveraging annealing_epochs={} must be >= 0. HINT: 0 switches to swa_lrs at once.",
             options_.annealing_epochs);
  VOLT_CHECK(options_.annealing_strategy == "cos" || options_.annealing_strategy == "linear",
             "StochasticWeightAveraging annealing_strategy=\"{}\"; expected \"cos\" or \"linear\". HINT: use one "
             "of torch's SWALR strategies.",
             options_.annealing_strategy);
}

std::string StochasticWeightAveraging::state_key() const { return "StochasticWeightAveraging"; }

void StochasticWeightAveraging::setup(const FitInfo& info) {
  // A new fit starts a new average (a resume then loads its state); Lightning copies the module here.
  max_epochs_ = info.max_epochs;
  num_lr_schedulers_ = info.num_lr_schedulers;
  average_.clear();
  n_averaged_ = 0;
  latest_update_epoch_ = -1;
  scheduler_step_count_ = 0;
  scheduler_epoch_ = -1;
}

Decision StochasticWeightAveraging::on_fit_start(const CallbackContext& context, CallbackServices&) {
  VOLT_CHECK(max_epochs_.has_value(),
             "StochasticWeightAveraging needs max_epochs: it averages up to the last epoch and then puts the "
             "average into the module. HINT: set TrainerOptions::max_epochs (not -1).");
  VOLT_CHECK(context.optimizers != nullptr && context.optimizers->size() == 1,
             "StochasticWeightAveraging works with 1 optimizer; configure_optimizers returned {}. HINT: return a "
             "single optimizer (one param group per part that needs its own learning rate).",
             context.optimizers == nullptr ? 0 : context.optimizers->size());
  VOLT_CHECK(
      num_lr_schedulers_ == 0,
      "StochasticWeightAveraging drives the learning rates itself (torch's SWALR), but configure_optimizers "
      "returned {} learning-rate scheduler(s). Lightning swaps a single scheduler for SWALR at "
      "swa_epoch_start; Volt's callbacks cannot replace the Trainer's schedulers. HINT: return the optimizer "
      "without a scheduler, or set the learning rate from a callback's on_train_epoch_start before swa_epoch_start.",
      num_lr_schedulers_);
  VOLT_CHECK(
      context.module != nullptr,
      "StochasticWeightAveraging needs the module in on_fit_start. HINT: add the callback to TrainerOptions::callbacks "
      "and let Trainer::fit call it, or set CallbackContext::module when calling the hooks yourself.");
  VOLT_CHECK(!has_batch_norm_statistics(*context.module),
             "StochasticWeightAveraging: module {} has BatchNorm running statistics (running_mean/running_var "
             "buffers). Lightning recomputes them for the averaged weights with an extra pass over the training "
             "data, which Volt's callback cannot run, and statistics of other weights would be wrong. HINT: use "
             "EMAWeightAveraging (it averages the buffers too), or a module without BatchNorm (e.g. LayerNorm or "
             "GroupNorm).",
             context.module->name());
  const size_t groups = context.optimizers->front()->param_groups().size();
  if (options_.swa_lrs.size() == 1 && groups > 1) options_.swa_lrs.assign(groups, options_.swa_lrs.front());
  VOLT_CHECK(options_.swa_lrs.size() == groups,
             "StochasticWeightAveraging has {} swa_lrs but the optimizer has {} param groups. HINT: pass one "
             "learning rate for all groups or one per group.",
             options_.swa_lrs.size(), groups);
  const SwaEpochStart& start = options_.swa_epoch_start;
  // Lightning: int(max_epochs * fraction) as a 1-based epoch, then 0-based.
  const int64_t one_based = start.epoch ? *start.epoch : static_cast<int64_t>(*max_epochs_ * *start.fraction);
  swa_start_ = std::max<int64_t>(one_based - 1, 0);
  swa_end_ = *max_epochs_ - 1;
  return {};
}

void StochasticWeightAveraging::step_swalr(torch::optim::Optimizer& optimizer) {
  // torch.optim.swa_utils.SWALR.get_lr, step for step, so the learning rates are torch's bit for
  // bit: it recovers the learning rate annealing started from out of the current one.
  const auto anneal = [this](double t) {
    return options_.annealing_strategy == "cos" ? (1.0 - std::cos(M_PI * t)) / 2.0 : t;
  };
  ++scheduler_step_count_;
  int64_t step = scheduler_step_count_ - 1;
  const int64_t epochs = options_.annealing_epochs;
  if (epochs == 0) step = std::max<int64_t>(1, step);
  const double span = static_cast<double>(std::max<int64_t>(1, epochs));
  const double prev_alpha = anneal(std::max(0.0, std::min(1.0, static_cast<double>(step - 1) / span)));
  const double alpha = anneal(std::max(0.0, std::min(1.0, static_cast<double>(step) / span)));
  auto& groups = optimizer.param_groups();
  for (size_t i = 0; i < groups.size(); ++i) {
    const double swa_lr = options_.swa_lrs[i];
    const double lr = groups[i].options().get_lr();
    const double initial = prev_alpha == 1.0 ? swa_lr : (lr - prev_alpha * swa_lr) / (1.0 - prev_alpha);
    groups[i].options().set_lr(swa_lr * alpha + initial * (1.0 - alpha));
  }
}

Decision StochasticWeightAveraging::on_train_epoch_start(const CallbackContext& context, CallbackServices&) {
  const int64_t epoch = context.epoch;
  if (epoch < swa_start_ || epoch > swa_end_) return {};
  torch::optim::Optimizer& optimizer = *context.optimizers->front();
  // SWALR steps once an epoch. Lightning steps it after each epoch; stepping before the next one
  // gives the same learning rates to every batch and skips epochs cut short (a resume continues
  // them), whose end Volt's callbacks also see. A resumed epoch's start does not step it again.
  if (scheduler_step_count_ == 0) {
    step_swalr(optimizer);  // SWALR's constructor steps once
    scheduler_epoch_ = epoch;
  } else if (epoch > scheduler_epoch_) {
    step_swalr(optimizer);
    scheduler_epoch_ = epoch;
  }
  if (epoch > latest_update_epoch_) {
    torch::NoGradGuard no_grad;
    for (const auto& [name, current] : weights_of(*context.module, /*buffers=*/false)) {
      if (n_averaged_ == 0) {
        average_[name] = current.clone();
        continue;
      }
      torch::Tensor& average = average_for(average_, name, current, "StochasticWeightAveraging");
      average.copy_(options_.avg_fn ? options_.avg_fn(average, current, n_averaged_)
                                    : average + (current - average) / (n_averaged_ + 1));
    }
    ++n_averaged_;
    latest_update_epoch_ = epoch;
  }
  return {};
}

Decision StochasticWeightAveraging::on_train_end(const CallbackContext& context, CallbackServices&) {
  // Only a run that trained its last epoch gets the average (Lightning: current_epoch - 1 == swa_end).
  if (context.epoch != swa_end_ + 1 || n_averaged_ == 0) return {};
  torch::NoGradGuard no_grad;
  for (const auto& [name, current] : weights_of(*context.module, /*buffers=*/false))
    current.copy_(average_for(average_, name, current, "StochasticWeightAveraging"));
  return {};
}

StateDict StochasticWeightAveraging::state_dict() const {
  StateDict state = make_state_dict();
  state.insert("n_averaged", n_averaged_);
  state.insert("latest_update_epoch", latest_update_epoch_);
  if (scheduler_step_count_ == 0) {
    state.insert("scheduler_state", c10::IValue());
  } else {
    StateDict scheduler = make_state_dict();
    scheduler.insert("_step_count", scheduler_step_count_);
    scheduler.insert("volt_epoch", scheduler_epoch_);
    state.insert("scheduler_state", scheduler);
  }
  state.insert("average_model_state", average_.empty() ? c10::IValue() : c10::IValue(tensors_to_state(average_)));
  return state;
}

void StochasticWeightAveraging::load_state_dict(const StateDict& state) {
  n_averaged_ = int_or(state, "n_averaged", 0);
  latest_update_epoch_ = int_or(state, "latest_update_epoch", -1);
  scheduler_step_count_ = 0;
  scheduler_epoch_ = -1;
  if (state.contains("scheduler_state") && state.at("scheduler_state").isGenericDict()) {
    const StateDict scheduler = state.at("scheduler_state").toGenericDict();
    scheduler_step_count_ = int_or(scheduler, "_step_count", 0);
    // A Lightning state has no epoch: it stepped after the saved epoch, as the next start would.
    scheduler_epoch_ = int_or(scheduler, "volt_epoch", latest_update_epoch_);
  }
  average_ = state_to_tensors(state.contains("average_model_state") ? state.at("average_model_state") : c10::IValue(),
                              "StochasticWeightAveraging");
}

// ---- EMAWeightAveraging ----

EMAWeightAveraging::EMAWeightAveraging(EMAWeightAveragingOptions options) : options_(std::move(options)) {
  VOLT_CHECK(options_.decay >= 0.0 && options_.decay <= 1.0,
             "EMAWeightAveraging decay={} is outside [0, 1]. HINT: pass the weight of the old average, e.g. 0.999.",
             options_.decay);
  VOLT_CHECK(options_.update_every_n_steps >= 0,
             "EMAWeightAveraging update_every_n_steps={} must be >= 0. HINT: 1 updates after every step; 0 only "
             "at epoch ends (with update_starting_at_epoch).",
             options_.update_every_n_steps);
}

std::string EMAWeightAveraging::state_key() const { return "EMAWeightAveraging"; }

void EMAWeightAveraging::setup(const FitInfo&) {
  // A new fit starts a new average (a resume then loads its state); Lightning copies the module here.
  average_.clear();
  n_averaged_ = 0;
  latest_update_step_ = 0;
  latest_update_epoch_ = -1;
  swapped_ = false;
}

bool EMAWeightAveraging::should_update(std::optional<int64_t> step_idx, std::optional<int64_t> epoch_idx) const {
  if (step_idx) {
    const bool started = !options_.update_starting_at_step || *step_idx >= *options_.update_starting_at_step;
    const bool due = options_.update_every_n_steps > 0 && *step_idx % options_.update_every_n_steps == 0;
    if (started && due) return true;
  }
  return epoch_idx && options_.update_starting_at_epoch && *epoch_idx >= *options_.update_starting_at_epoch;
}

Decision EMAWeightAveraging::on_fit_start(const CallbackContext& context, CallbackServices&) {
  VOLT_CHECK(context.module != nullptr,
             "EMAWeightAveraging needs the module in on_fit_start. HINT: add the callback to TrainerOptions::callbacks "
             "and let Trainer::fit call it, or set CallbackContext::module when calling the hooks yourself.");
  // Lightning copies the module when fit begins; a resume brought its average in the state.
  if (!average_.empty()) return {};
  for (const auto& [name, current] : weights_of(*context.module, options_.use_buffers))
    average_[name] = current.clone();
  return {};
}

void EMAWeightAveraging::update(LightningModule& module) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, current] : weights_of(module, options_.use_buffers)) {
    torch::Tensor& average = average_for(average_, name, current, "EMAWeightAveraging");
    // torch's get_ema_avg_fn; the first update copies (AveragedModel).
    average.copy_(n_averaged_ == 0 ? current : options_.decay * average + (1.0 - options_.decay) * current);
  }
  // Without use_buffers the buffers are not averaged: they go on as the module's (AveragedModel).
  ++n_averaged_;
}

Decision EMAWeightAveraging::on_train_batch_end(const CallbackContext& context, CallbackServices&) {
  // Once per optimizer step: with accumulation several batches end at the same global step.
  if (context.global_step > latest_update_step_ && should_update(context.global_step - 1, std::nullopt)) {
    update(*context.module);
    latest_update_step_ = context.global_step;
  }
  return {};
}

Decision EMAWeightAveraging::on_train_epoch_end(const CallbackContext& context, CallbackServices&) {
  if (context.epoch > latest_update_epoch_ && should_update(std::nullopt, context.epoch)) {
    update(*context.module);
    latest_update_epoch_ = context.epoch;
  }
  return {};
}

Decision EMAWeightAveraging::on_train_end(const CallbackContext& context, CallbackServices&) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, current] : weights_of(*context.module, options_.use_buffers))
    current.copy_(average_for(average_, name, current, "EMAWeightAveraging"));
  return {};
}

void EMAWeightAveraging::swap(LightningModule& module) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, current] : weights_of(module, options_.use_buffers)) {
    torch::Tensor& average = average_for(average_, name, current, "EMAWeightAveraging");
    const torch::Tensor held = average.clone();
    average.copy_(current);
    current.copy_(held);
  }
  swapped_ = !swapped_;
}

Decision EMAWeightAveraging::on_validation_epoch_start(const CallbackContext& context, CallbackServices&) {
  // Only during fit (the average exists then), and not twice: validate() has no average to swap.
  if (options_.use_average_for_validation && !average_.empty() && !swapped_ && context.optimizers != nullptr)
    swap(*context.module);
  return {};
}

Decision EMAWeightAveraging::on_validation_epoch_end(const CallbackContext& context, CallbackServices&) {
  if (swapped_) swap(*context.module);
  return {};
}

void EMAWeightAveraging::on_exception(const CallbackContext& context, const std::exception&, CallbackServices&) {
  if (swapped_ && context.module != nullptr) swap(*context.module);
}

void EMAWeightAveraging::on_save_checkpoint(const CallbackContext&, StateDict& checkpoint) {
  // Outside fit there is no average: the module's weights stay the checkpoint's (Lightning too).
  if (average_.empty() || !checkpoint.contains("state_dict") || !checkpoint.at("state_dict").isGenericDict()) return;
  const StateDict module_weights = checkpoint.at("state_dict").toGenericDict();
  StateDict held = make_state_dict();
  for (const auto& e : module_weights) {
    const auto it = average_.find(e.key().toStringRef());
    // Copies: a checkpoint kept in memory must not follow the average as it moves on.
    held.insert(e.key(), it == average_.end() ? e.value() : c10::IValue(it->second.detach().clone()));
  }
  // During a validation pass the module holds the average and the callback the trained weights.
  checkpoint.insert_or_assign("current_model_state", swapped_ ? held : module_weights);
  checkpoint.insert_or_assign("state_dict", swapped_ ? module_weights : held);
  StateDict averaging = make_state_dict();
  averaging.insert("n_averaged", torch::tensor(n_averaged_, torch::kLong));
  checkpoint.insert_or_assign("averaging_state", averaging);
}

void EMAWeightAveraging::on_load_checkpoint(const CallbackContext& context, const StateDict& checkpoint) {
  // The Trainer loaded "state_dict" (the average) into the module; put the trained weights back.
  if (context.module == nullptr || !checkpoint.contains("current_model_state")) return;
  VOLT_CHECK(
      checkpoint.at("current_model_state").isGenericDict() && checkpoint.contains("state_dict") &&
          checkpoint.at("state_dict").isGenericDict(),
      "EMAWeightAveraging: the checkpoint's \"current_model_state\" or \"state_dict\" is not a dict of "
      "tensors. HINT: resume from a checkpoint a fit with EMAWeightAveraging wrote, or start without ckpt_path.");
  const StateDict averaged = checkpoint.at("state_dict").toGenericDict();
  const StateDict current = checkpoint.at("current_model_state").toGenericDict();
  torch::NoGradGuard no_grad;
  average_.clear();
  for (const auto& [name, tensor] : weights_of(*context.module, options_.use_buffers)) {
    VOLT_CHECK(averaged.contains(name) && current.contains(name),
               "EMAWeightAveraging: the checkpoint holds no average or trained weights for '{}'. HINT: resume "
               "with the module the checkpoint was written for, or start without ckpt_path.",
               name);
    average_[name] = averaged.at(name).toTensor().detach().to(tensor.device()).clone();
  }
  for (const auto& [name, tensor] : weights_of(*context.module, /*buffers=*/true)) {
    if (current.contains(name)) tensor.copy_(current.at(name).toTensor());
  }
  if (checkpoint.contains("averaging_state") && checkpoint.at("averaging_state").isGenericDict()) {
    const StateDict averaging = checkpoint.at("averaging_state").toGenericDict();
    if (averaging.contains("n_averaged") && averaging.at("n_averaged").isTensor())
      n_averaged_ = averaging.at("n_averaged").toTensor().item<int64_t>();
  }
}

StateDict EMAWeightAveraging::state_dict() const {
  // The average itself is the checkpoint's "state_dict" (on_save_checkpoint).
  StateDict state = make_state_dict();
  state.insert("latest_update_step", latest_update_step_);
  state.insert("latest_update_epoch", latest_update_epoch_);
  state.insert("n_averaged", n_averaged_);
  return state;
}

void EMAWeightAveraging::load_state_dict(const StateDict& state) {
  latest_update_step_ = int_or(state, "latest_update_step", 0);
  latest_update_epoch_ = int_or(state, "latest_update_epoch", -1);
  n_averaged_ = int_or(state, "n_averaged", 0);
}

}  // namespace volt
