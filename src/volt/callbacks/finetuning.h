// Fine-tuning: Lightning's BaseFinetuning and BackboneFinetuning.
//
// A fine-tune freezes part of the model (a pretrained backbone) before the optimizers are built
// and unfreezes it later, adding its parameters to an optimizer as a new param group with a lower
// learning rate. Both the frozen flags and the added groups are state: a checkpoint records them,
// and a resume rebuilds the groups before the optimizers' saved states load (they would not fit
// otherwise), so a run resumed after the unfreeze, even inside an epoch, ends bit-identical to one
// that never stopped.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "volt/callbacks/callback.h"

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace volt {

/// What BaseFinetuning::unfreeze_and_add_param_group did.
struct ParamGroupChange {
  /// Parameters put into the new param group (0: no group was added).
  size_t added = 0;
  /// Frozen parameters that the optimizer held already (one built over all parameters): they were
  /// left in their group and train at its learning rate, not the new one (Lightning warns). Those
  /// that trained all along (BatchNorm with train_bn) are expected there and not counted.
  size_t already_in_optimizer = 0;
};

/// Base class of fine-tuning callbacks (Lightning's BaseFinetuning): freeze_before_training runs
/// once per fit after the module's configure_model and before configure_optimizers, and
/// finetune_function at the start of every training epoch, for each optimizer. The param groups
/// it adds and the parameters' requires_grad flags are saved in checkpoints and rebuilt on resume.
/// Each epoch's finetune_function runs once per run: a resume inside an epoch does not repeat it.
/// Under ddp the strategy re-arms gradient synchronization when the trainable parameters change.
class BaseFinetuning : public Callback {
 public:
  /// Freezes what a later epoch unfreezes (called before configure_optimizers, so an optimizer
  /// built over the trainable parameters leaves the frozen ones out).
  virtual void freeze_before_training(LightningModule& module) = 0;
  /// Unfreezes at `epoch` what that epoch should train, e.g. with unfreeze_and_add_param_group;
  /// `optimizer_idx` is the optimizer's place in configure_optimizers' list.
  virtual void finetune_function(LightningModule& module, int64_t epoch, torch::optim::Optimizer& optimizer,
                                 size_t optimizer_idx) = 0;

  /// Sets requires_grad=false on every parameter of `module` and its children, except those of
  /// BatchNorm layers (torch::nn::BatchNorm1d/2d/3d, volt::SyncBatchNorm) when `train_bn` is true.
  /// (Their running statistics keep updating in training mode: LibTorch's BatchNorm has no switch
  /// to stop that; put such layers in eval mode in a hook if they must not.)
  static void freeze(torch::nn::Module& module, bool train_bn = true);
  /// Sets requires_grad=true on every parameter of `module` and its children.
  static void make_trainable(torch::nn::Module& module);
  /// Makes `module` trainable and adds its trainable parameters that `optimizer` does not hold yet
  /// as a new param group with learning rate `lr`, or the first group's learning rate divided by
  /// `initial_denom_lr` when `lr` is unset (Lightning's rule); its other options (momentum, weight
  /// decay, ...) are the optimizer's defaults, as in Lightning. With `train_bn` false, BatchNorm
  /// parameters stay frozen and out of the group.
  static ParamGroupChange unfreeze_and_add_param_group(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                                       std::optional<double> lr = std::nullopt,
                                                       double initial_denom_lr = 10.0, bool train_bn = true);

  void on_before_configure_optimizers(LightningModule& module) override;
  Decision on_train_epoch_start(const CallbackContext& context, CallbackServices& services) override;
  void restore_optimizer_layout(LightningModule& module,
                                const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;

 private:
  /// Records every optimizer's groups (parameter names and learning rate) for the checkpoint.
  void store_layout(LightningModule& module, const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers);

  /// One param group as saved: its parameters' names and its learning rate.
  struct SavedGroup {
    std::vector<std::string> params;
    double lr = 0.0;
  };
  /// Per optimizer, every group, recorded at each epoch start (empty until the first).
  std::vector<std::vector<SavedGroup>> layout_;
  /// Names of the module's parameters with requires_grad=false at the last epoch start.
  std::vector<std::string> frozen_;
  /// The last epoch finetune_function ran for; -1: none yet.
  int64_t last_epoch_ = -1;
  /// Set by load_state_dict until restore_optimizer_layout has rebuilt the groups.
  bool restoring_ = false;
};

/// Options of BackboneFinetuning, with Lightning's defaults.
///
/// Example: `BackboneFinetuning({.unfreeze_backbone_at_epoch = 5, .backbone_initial_ratio_lr = 0.05})`.
struct BackboneFinetuningOptions {
  /// The epoch (0-based) at which the backbone starts training.
  int64_t unfreeze_backbone_at_epoch = 10;
  /// The factor the backbone's learning rate is multiplied by at each later epoch (given the
  /// epoch + 1, as Lightning calls it); unset: 2 (Lightning's `multiplicative`).
  std::function<double(int64_t)> lambda_func;
  /// The backbone's first learning rate as a fraction of the first param group's.
  double backbone_initial_ratio_lr = 0.1;
  /// The backbone's first learning rate; overrides backbone_initial_ratio_lr when set.
  std::optional<double> backbone_initial_lr;
  /// Keep the backbone's learning rate at or below the first group's.
  bool should_align = true;
  /// Kept for Lightning's signature: the backbone's learning rate is always given explicitly here,
  /// so, as in Lightning, this divisor does not apply.
  double initial_denom_lr = 10.0;
  /// Whether the backbone's BatchNorm layers train while the rest of it is frozen.
  bool train_bn = true;
  /// Print the learning rates at the unfreeze and at every change.
  bool verbose = false;
  /// Digits after the point in verbose output.
  int rounding = 12;
  /// The name the module registered its backbone under (register_module("backbone", ...)); a
  /// dotted path reaches a grandchild ("encoder.features"). Lightning reads `pl_module.backbone`.
  std::string backbone = "backbone";
};

/// Lightning's BackboneFinetuning: freezes the module's backbone before training; at epoch
/// unfreeze_backbone_at_epoch adds it to the first optimizer (configure_optimizers' number 0) as
/// a new param group with learning rate backbone_initial_lr (or backbone_initial_ratio_lr times
/// the first group's), and at each later epoch multiplies that rate by lambda_func(epoch + 1),
/// capped at the first group's rate with should_align. Lightning adds the backbone to every
/// optimizer with one shared rate; with one optimizer, the usual fine-tune, the two agree.
/// Learning-rate schedulers built in configure_optimizers keep scheduling the groups they were
/// built with; the backbone's group follows this callback's rule.
class BackboneFinetuning : public BaseFinetuning {
 public:
  /// Throws volt::Error for a negative epoch or a ratio, learning rate or divisor that is not > 0.
  explicit BackboneFinetuning(BackboneFinetuningOptions options = {});

  std::string state_key() const override { return "BackboneFinetuning"; }
  /// Throws volt::Error naming the module's children when it has no module called options.backbone.
  void freeze_before_training(LightningModule& module) override;
  void finetune_function(LightningModule& module, int64_t epoch, torch::optim::Optimizer& optimizer,
                         size_t optimizer_idx) override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;

  /// The backbone's learning rate as last set; unset before the unfreeze.
  std::optional<double> previous_backbone_lr() const { return previous_backbone_lr_; }

 private:
  BackboneFinetuningOptions options_;
  std::optional<double> previous_backbone_lr_;
};

}  // namespace volt
