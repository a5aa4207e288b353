// Optimizer state as plain values, in PyTorch's `optimizer.state_dict()` layout, so that
// Volt checkpoints hold the same structure as Lightning's and can be read without LibTorch's
// C++ archive format.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include <string>

namespace volt {

/// The key under which the optimizer's kind ("SGD", "Adam", ...) is stored.
inline constexpr const char* kOptimizerKindKey = "volt_optimizer";
/// The key under which an optimizer Volt does not know is stored as LibTorch's own archive.
inline constexpr const char* kLibtorchArchiveKey = "volt_libtorch_archive";

/// The optimizer's state in PyTorch's `optimizer.state_dict()` layout:
///
///     {"volt_optimizer": "Adam",
///      "state": {0: {"step": tensor(3.), "exp_avg": tensor, "exp_avg_sq": tensor}, 1: {...}},
///      "param_groups": [{"lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-08,
///                        "weight_decay": 0.0, "amsgrad": false, "params": [0, 1]}]}
///
/// Parameters are numbered across groups in order, as in PyTorch; "state" holds only parameters
/// that have state. SGD, Adam, AdamW, RMSprop and Adagrad use PyTorch's key names and store
/// `step` as torch 1.13's Python side does (a float32 scalar tensor for Adam, AdamW and Adagrad,
/// an int for RMSprop). Any other optimizer is stored as the bytes of its own
/// `save(OutputArchive&)` in a uint8 tensor under "volt_libtorch_archive", next to
/// "param_groups" holding each group's "lr" (when its options implement get_lr) and "params".
///
/// Holds only values c10::IValue pickles (dicts with string or int keys, lists, strings, numbers,
/// bools, tensors). State tensors share memory with the optimizer, as in PyTorch: serialize the
/// result before the optimizer steps again, or clone it.
c10::IValue optimizer_state_dict(const torch::optim::Optimizer& optimizer);

/// Volt's name for the kind of `optimizer`: "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", or the
/// C++ type of any other optimizer (e.g. "torch::optim::LBFGS"). Saved under kOptimizerKindKey so
/// that one optimizer's state is never loaded into another; learning rates are named after it.
std::string optimizer_kind(const torch::optim::Optimizer& optimizer);

/// Restores what optimizer_state_dict wrote into an optimizer built over the same parameters.
///
/// Restores both the per-parameter state (copied onto each parameter's device) and each group's
/// hyperparameters (lr, betas, ...), as PyTorch's `load_state_dict` does. Checks everything before
/// changing anything: on a mismatch (optimizer kind, number of groups, parameters per group,
/// tensor shapes, missing or mistyped fields) it throws volt::CheckpointError listing every
/// problem, and the optimizer is left as it was.
void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const c10::IValue& state);

}  // namespace volt
