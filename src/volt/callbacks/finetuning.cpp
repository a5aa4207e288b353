#include "volt/callbacks/finetuning.h"

#include <fmt/format.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cmath>
#include <set>
#include <unordered_map>

#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/module/lightning_module.h"
#include "volt/nn/sync_batch_norm.h"

namespace volt {
namespace {

/// The trainable parameters of `module` and every module below it; BatchNorm layers' only with `train_bn`.
void collect_trainable(torch::nn::Module& module, bool train_bn, std::vector<torch::Tensor>& out) {
  for_each_module(module, [&](torch::nn::Module& each) {
    if (!train_bn && is_batchnorm(each)) return;
    for (const auto& parameter : each.parameters(/*recurse=*/false)) {
      if (parameter.requires_grad()) out.push_back(parameter);
    }
  });
}

/// The module's parameter names by tensor, to save param groups by name (Lightning's layout).
std::unordered_map<const void*, std::string> parameter_names(LightningModule& module) {
  std::unordered_map<const void*, std::string> names;
  for (const auto& item : module.named_parameters(/*recurse=*/true))
    names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  return names;
}

int64_t int_or(const StateDict& state, const char* key, int64_t fallback) {
  return state.contains(key) && state.at(key).isInt() ? state.at(key).toInt() : fallback;
}

std::vector<std::string> strings_of(const c10::IValue& value, const std::string& where) {
  VOLT_CHECK(value.isList(),
             "BaseFinetuning's checkpoint state holds a {} at {}; expected a list of parameter names. HINT: the "
             "checkpoint was not written by this callback; start without ckpt_path.",
             value.tagKind(), where);
  std::vector<std::string> out;
  for (const auto& each : value.toListRef()) {
    VOLT_CHECK(each.isString(),
               "BaseFinetuning's checkpoint state holds a {} in {}; expected a parameter name. HINT: the checkpoint "
               "was not written by this callback; start without ckpt_path.",
               each.tagKind(), where);
    out.push_back(each.toStringRef());
  }
  return out;
}

c10::List<std::string> string_list(const std::vector<std::string>& values) {
  c10::List<std::string> out;
  for (const auto& value : values) out.push_back(value);
  return out;
}

/// The submodule at dotted `path` under `module`, or nullptr.
std::shared_ptr<torch::nn::Module> find_submodule(LightningModule& module, const std::string& path) {
  for (const auto& item : module.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    if (item.key() == path) return item.value();
  }
  return nullptr;
}

}  // namespace

void BaseFinetuning::freeze(torch::nn::Module& module, bool train_bn) {
  for_each_module(module, [&](torch::nn::Module& each) {
    const bool trains = train_bn && is_batchnorm(each);
    for (auto& parameter : each.parameters(/*recurse=*/false)) parameter.requires_grad_(trains);
  });
}

void BaseFinetuning::make_trainable(torch::nn::Module& module) {
  for (auto& parameter : module.parameters(/*recurse=*/true)) parameter.requires_grad_(true);
}

ParamGroupChange BaseFinetuning::unfreeze_and_add_param_group(torch::nn::Module& module,
                                                              torch::optim::Optimizer& optimizer,
                                                              std::optional<double> lr, double initial_denom_lr,
                                                              bool train_bn) {
  VOLT_CHECK(initial_denom_lr > 0,
             "unfreeze_and_add_param_group: initial_denom_lr is {}; expected > 0. HINT: 10 gives the new group a "
             "tenth of the first group's learning rate.",
             initial_denom_lr);
  std::set<const void*> was_frozen;
  for (const auto& parameter : module.parameters(/*recurse=*/true)) {
    if (!parameter.requires_grad()) was_frozen.insert(parameter.unsafeGetTensorImpl());
  }
  make_trainable(module);
  if (!train_bn) {
    for_each_module(module, [](torch::nn::Module& each) {
      if (!is_batchnorm(each)) return;
      for (auto& parameter : each.parameters(/*recurse=*/false)) parameter.requires_grad_(false);
    });
  }
  std::vector<torch::Tensor> candidates;
  collect_trainable(module, train_bn, candidates);
  std::set<const void*> held;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& parameter : group.params()) held.insert(parameter.unsafeGetTensorImpl());
  }
  ParamGroupChange change;
  std::vector<torch::Tensor> fresh;
  for (const auto& parameter : candidates) {
    if (held.count(parameter.unsafeGetTensorImpl()) != 0) {
      change.already_in_optimizer += was_frozen.count(parameter.unsafeGetTensorImpl());
    } else {
      fresh.push_back(parameter);
    }
  }
  if (fresh.empty()) return change;
  VOLT_CHECK(!optimizer.param_groups().empty(),
             "unfreeze_and_add_param_group: the optimizer has no param group. HINT: build the optimizer with at least "
             "one param group; the new group copies its options.");
  std::unique_ptr<torch::optim::OptimizerOptions> options = optimizer.defaults().clone();
  const double first_lr = optimizer.param_groups().front().options().get_lr();
  options->set_lr(lr.has_value() ? *lr : first_lr / initial_denom_lr);
  change.added = fresh.size();
  optimizer.add_param_group(torch::optim::OptimizerParamGroup(std::move(fresh), std::move(options)));
  return change;
}

void BaseFinetuning::on_before_configure_optimizers(LightningModule& module) { freeze_before_training(module); }

Decision BaseFinetuning::on_train_epoch_start(const CallbackContext& context, CallbackServices& services) {
  if (context.module == nullptr || context.optimizers == nullptr) return {};
  // A resume inside an epoch whose finetune already ran (the checkpoint holds its groups).
  if (context.epoch <= last_epoch_) return {};
  for (size_t i = 0; i < context.optimizers->size(); ++i)
    finetune_function(*context.module, context.epoch, *(*context.optimizers)[i], i);
  last_epoch_ = context.epoch;
  store_layout(*context.module, *context.optimizers);
  return {};
}

void BaseFinetuning::store_layout(LightningModule& module,
                                  const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) {
  const auto names = parameter_names(module);
  layout_.clear();
  for (const auto& optimizer : optimizers) {
    std::vector<SavedGroup> groups;
    for (const auto& group : optimizer->param_groups()) {
      SavedGroup saved;
      for (const auto& parameter : group.params()) {
        const auto it = names.find(parameter.unsafeGetTensorImpl());
        // An optimizer may hold a tensor that is no parameter of the module: saved without a
        // name, it cannot be found again, and a resume that needs it refuses to guess.
        saved.params.push_back(it == names.end() ? std::string() : it->second);
      }
      saved.lr = group.options().get_lr();
      groups.push_back(std::move(saved));
    }
    layout_.push_back(std::move(groups));
  }
  frozen_.clear();
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) frozen_.push_back(item.key());
  }
}

void BaseFinetuning::restore_optimizer_layout(LightningModule& module,
                                              const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) {
  if (!restoring_) return;
  restoring_ = false;
  if (layout_.empty()) return;  // saved before the first epoch started: nothing was changed yet
  // The requires_grad flags first: the re-added groups hold trainable parameters.
  const std::set<std::string> frozen(frozen_.begin(), frozen_.end());
  std::unordered_map<std::string, torch::Tensor> by_name;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    item.value().requires_grad_(frozen.count(item.key()) == 0);
    by_name.emplace(item.key(), item.value());
  }
  VOLT_CHECK(layout_.size() == optimizers.size(),
             "{}'s checkpoint state records {} optimizer(s); configure_optimizers returned {}. HINT: resume with the "
             "optimizer setup the checkpoint was written with.",
             state_key(), layout_.size(), optimizers.size());
  for (size_t i = 0; i < optimizers.size(); ++i) {
    torch::optim::Optimizer& optimizer = *optimizers[i];
    const std::vector<SavedGroup>& saved = layout_[i];
    const size_t have = optimizer.param_groups().size();
    VOLT_CHECK(have <= saved.size(),
               "{}'s checkpoint state records {} param group(s) for optimizer {}, but configure_optimizers built {}. "
               "HINT: resume with the optimizer setup the checkpoint was written with.",
               state_key(), saved.size(), i, have);
    for (size_t g = have; g < saved.size(); ++g) {
      std::vector<torch::Tensor> params;
      for (const std::string& name : saved[g].params) {
        const auto it = by_name.find(name);
        VOLT_CHECK(it != by_name.end(),
                   "{}'s checkpoint state puts parameter '{}' into param group {} of optimizer {}, but the module has "
                   "no parameter of that name. HINT: resume with the module the checkpoint was written for.",
                   state_key(), name.empty() ? "(unnamed)" : name, g, i);
        params.push_back(it->second);
      }
      std::unique_ptr<torch::optim::OptimizerOptions> options = optimizer.defaults().clone();
      options->set_lr(saved[g].lr);  // the optimizer's saved state sets every option right after
      optimizer.add_param_group(torch::optim::OptimizerParamGroup(std::move(params), std::move(options)));
    }
  }
}

StateDict BaseFinetuning::state_dict() const {
  StateDict state = make_state_dict();
  c10::impl::GenericList optimizers(c10::AnyType::get());
  for (const auto& groups : layout_) {
    c10::impl::GenericList saved(c10::AnyType::get());
    for (const auto& group : groups) {
      StateDict entry = make_state_dict();
      entry.insert("params", string_list(group.params));
      entry.insert("lr", group.lr);
      saved.push_back(entry);
    }
    optimizers.push_back(saved);
  }
  state.insert("optimizer_param_groups", optimizers);
  state.insert("frozen_parameters", string_list(frozen_));
  state.insert("last_epoch", last_epoch_);
  return state;
}

void BaseFinetuning::load_state_dict(const StateDict& state) {
  layout_.clear();
  frozen_.clear();
  last_epoch_ = int_or(state, "last_epoch", -1);
  if (state.contains("optimizer_param_groups")) {
    const c10::IValue& optimizers = state.at("optimizer_param_groups");
    VOLT_CHECK(optimizers.isList(),
               "{}'s checkpoint state holds a {} for optimizer_param_groups; expected a list. HINT: the checkpoint was "
               "not written by this callback; start without ckpt_path.",
               state_key(), optimizers.tagKind());
    for (const auto& groups : optimizers.toListRef()) {
      VOLT_CHECK(groups.isList(),
                 "{}'s checkpoint state holds a {} for an optimizer's param groups; expected a list. HINT: the "
                 "checkpoint was not written by this callback; start without ckpt_path.",
                 state_key(), groups.tagKind());
      std::vector<SavedGroup> saved;
      for (const auto& group : groups.toListRef()) {
        VOLT_CHECK(group.isGenericDict() && group.toGenericDict().contains("params"),
                   "{}'s checkpoint state holds a param group without 'params'. HINT: the checkpoint was not written "
                   "by this callback; start without ckpt_path.",
                   state_key());
        const StateDict dict = group.toGenericDict();
        SavedGroup each;
        each.params = strings_of(dict.at("params"), "optimizer_param_groups");
        each.lr = dict.contains("lr") && dict.at("lr").isDouble() ? dict.at("lr").toDouble() : 0.0;
        saved.push_back(std::move(each));
      }
      layout_.push_back(std::move(saved));
    }
  }
  if (state.contains("frozen_parameters")) frozen_ = strings_of(state.at("frozen_parameters"), "frozen_parameters");
  restoring_ = true;
}

BackboneFinetuning::BackboneFinetuning(BackboneFinetuningOptions options) : options_(std::move(options)) {
  VOLT_CHECK(options_.unfreeze_backbone_at_epoch >= 0,
             "BackboneFinetuning's unfreeze_backbone_at_epoch is {}; expected >= 0 (0-based). HINT: 0 trains the "
             "backbone from the first epoch.",
             options_.unfreeze_backbone_at_epoch);
  VOLT_CHECK(options_.backbone_initial_ratio_lr > 0,
             "BackboneFinetuning's backbone_initial_ratio_lr is {}; expected > 0. HINT: 0.1 starts the backbone at a "
             "tenth of the first group's learning rate.",
             options_.backbone_initial_ratio_lr);
  VOLT_CHECK(!options_.backbone_initial_lr || *options_.backbone_initial_lr > 0,
             "BackboneFinetuning's backbone_initial_lr is {}; expected > 0. HINT: leave it unset to use "
             "backbone_initial_ratio_lr.",
             options_.backbone_initial_lr.value_or(0.0));
  VOLT_CHECK(options_.initial_denom_lr > 0,
             "BackboneFinetuning's initial_denom_lr is {}; expected > 0. HINT: leave the default 10; the backbone's "
             "learning rate comes from backbone_initial_lr or backbone_initial_ratio_lr.",
             options_.initial_denom_lr);
  VOLT_CHECK(!options_.backbone.empty(),
             "BackboneFinetuning's backbone is empty; expected the name of a module the model registered. HINT: "
             "leave the default \"backbone\" and register_module(\"backbone\", ...) in the model.");
  if (!options_.lambda_func) options_.lambda_func = [](int64_t) { return 2.0; };
}

void BackboneFinetuning::freeze_before_training(LightningModule& module) {
  const std::shared_ptr<torch::nn::Module> backbone = find_submodule(module, options_.backbone);
  if (backbone == nullptr) {
    std::vector<std::string> children;
    for (const auto& item : module.named_children()) children.push_back("'" + item.key() + "'");
    throw Error(fmt::format(
        "BackboneFinetuning: {} has no module named '{}' to fine-tune (its children: {}). HINT: register the "
        "pretrained part as `backbone_ = register_module(\"backbone\", ...)`, or name yours in "
        "BackboneFinetuningOptions::backbone (a dotted path reaches deeper).",
        module.name(), options_.backbone, children.empty() ? "none" : join(children, ", ")));
  }
  freeze(*backbone, options_.train_bn);
}

void BackboneFinetuning::finetune_function(LightningModule& module, int64_t epoch, torch::optim::Optimizer& optimizer,
                                           size_t optimizer_idx) {
  if (optimizer_idx != 0) return;
  const auto rounded = [this](double value) {
    const double scale = std::pow(10.0, options_.rounding);
    return std::round(value * scale) / scale;
  };
  const double current_lr = optimizer.param_groups().front().options().get_lr();
  if (epoch == options_.unfreeze_backbone_at_epoch) {
    const double initial = options_.backbone_initial_lr.value_or(current_lr * options_.backbone_initial_ratio_lr);
    previous_backbone_lr_ = initial;
    const std::shared_ptr<torch::nn::Module> backbone = find_submodule(module, options_.backbone);
    VOLT_CHECK(backbone != nullptr,
               "BackboneFinetuning: {} no longer has a module named '{}'. HINT: keep the backbone registered under "
               "that name for the whole fit; do not replace or rename it after training starts.",
               module.name(), options_.backbone);
    const ParamGroupChange change =
        unfreeze_and_add_param_group(*backbone, optimizer, initial, options_.initial_denom_lr, options_.train_bn);
    if (change.already_in_optimizer > 0) {
      module.print(fmt::format(
          "warning: BackboneFinetuning: {} of the backbone's parameters were in the optimizer already; they train "
          "at the first group's learning rate, not the backbone's {}. HINT: build the optimizer over the trainable "
          "parameters only (those with requires_grad) in configure_optimizers.",
          change.already_in_optimizer, initial));
    }
    if (options_.verbose) {
      module.print(fmt::format("Current lr: {}, Backbone lr: {}", rounded(current_lr), rounded(initial)));
    }
  } else if (epoch > options_.unfreeze_backbone_at_epoch && previous_backbone_lr_.has_value()) {
    double next = options_.lambda_func(epoch + 1) * *previous_backbone_lr_;
    if (options_.should_align && next > current_lr) next = current_lr;
    // The backbone's group is the last one, as Lightning assumes.
    optimizer.param_groups().back().options().set_lr(next);
    previous_backbone_lr_ = next;
    if (options_.verbose) {
      module.print(fmt::format("Current lr: {}, Backbone lr: {}", rounded(current_lr), rounded(next)));
    }
  }
}

StateDict BackboneFinetuning::state_dict() const {
  StateDict state = BaseFinetuning::state_dict();
  // Lightning's key; None before the unfreeze.
  state.insert("previous_backbone_lr", previous_backbone_lr_ ? c10::IValue(*previous_backbone_lr_) : c10::IValue());
  return state;
}

void BackboneFinetuning::load_state_dict(const StateDict& state) {
  BaseFinetuning::load_state_dict(state);
  previous_backbone_lr_.reset();
  if (state.contains("previous_backbone_lr") && state.at("previous_backbone_lr").isDouble()) {
    previous_backbone_lr_ = state.at("previous_backbone_lr").toDouble();
  }
}

}  // namespace volt
