// SyncBatchNorm: BatchNorm whose batch statistics (forward) and gradient sums (backward) are
// reduced across the processes of a ddp run, so that N processes with B/N examples each
// normalize as one process with B examples would (Lightning's `sync_batchnorm`).
//
// Why a layer users declare rather than a conversion: LibTorch's modules cannot be swapped in
// place. A `torch::nn::BatchNorm2d bn_` member keeps pointing at its module even when the
// registry entry is replaced, so PyTorch's convert_sync_batchnorm has no C++ equivalent. A model
// declares volt::SyncBatchNorm instead, which is plain BatchNorm (bit for bit) until collectives
// are attached, so the same model runs on one process unchanged.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/options/batchnorm.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "volt/base/collectives.h"

namespace volt {

/// Batch normalization over inputs of any rank >= 2 ([N, C], [N, C, L], [N, C, H, W],
/// [N, C, D, H, W]) whose training statistics span every process of the attached Collectives.
///
/// Unsynchronized (no collectives attached, a world of one process, or eval mode) it calls the
/// same ATen batch_norm as torch::nn::BatchNorm{1,2,3}d and gives bit-identical outputs,
/// gradients and running statistics. Synchronized in training, each forward all-reduces the
/// per-channel sum, sum of squares and count (one collective), normalizes with the global mean
/// and biased variance, and updates running_var with the unbiased variance of the global count
/// (as PyTorch's SyncBatchNorm); each backward all-reduces the per-channel sums of grad_output
/// and grad_output * x_hat (one collective), so input gradients equal those of the whole batch.
/// weight and bias gradients stay local: ddp's gradient synchronization averages them. Ranks
/// may hold different batch sizes, including none.
///
/// Parameters and buffers are BatchNorm's, with its names (weight, bias, running_mean,
/// running_var, num_batches_tracked), so state dicts and checkpoints move between this layer,
/// torch::nn::BatchNorm*d and PyTorch's nn.SyncBatchNorm.
///
/// Every rank must run the forward (and, in training, the backward) of every synchronized layer
/// in the same order, like any collective: a layer whose output one rank does not use in its
/// loss never runs its backward there, and the others wait until the collective times out.
///
/// Example:
/// ```
/// volt::SyncBatchNorm bn(torch::nn::BatchNormOptions(16).momentum(0.01));
/// torch::Tensor y = bn(torch::randn({8, 16, 4, 4}));
/// ```
class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  /// A layer over `options.num_features()` channels; weight 1, bias 0, running mean 0, running
  /// variance 1, as BatchNorm starts.
  explicit SyncBatchNormImpl(const torch::nn::BatchNormOptions& options);

  /// Registers the parameters and buffers afresh (Cloneable's contract) and resets them.
  void reset() override;
  /// Running mean 0, running variance 1, no batches tracked (when track_running_stats).
  void reset_running_stats();
  /// reset_running_stats(), then weight 1 and bias 0 (when affine).
  void reset_parameters();

  /// Normalizes `input` ([N, C, ...], C = num_features); see the class comment for when the
  /// statistics are synchronized. Throws volt::Error for an input of rank < 2 or the wrong
  /// channel count, and, when training, for fewer than two values per channel in the batch
  /// (across every rank when synchronized).
  torch::Tensor forward(const torch::Tensor& input);

  /// Prints `volt::SyncBatchNorm(16, eps=1e-05, momentum=0.1, affine=true, track_running_stats=true)`.
  void pretty_print(std::ostream& stream) const override;

  /// Synchronizes this layer over `collectives` from the next training forward on. The layer
  /// keeps a pointer: `collectives` must outlive every forward and backward that follows, or
  /// detach_collectives() must come first (a Trainer's process group lives until teardown,
  /// after fit returns). A clone shares the attachment.
  void attach_collectives(Collectives& collectives);
  /// Back to plain BatchNorm behaviour (no collectives called).
  void detach_collectives();
  /// The attached collectives, or nullptr.
  Collectives* collectives() const { return collectives_; }
  /// True when the next forward in training mode reduces its statistics across processes:
  /// collectives attached whose world has more than one process.
  bool synchronized() const;

  /// The options this layer was made with (eps and momentum may be changed later; BatchNorm's
  /// semantics).
  torch::nn::BatchNormOptions options;
  /// The learned scale, [C]; undefined unless `affine`.
  torch::Tensor weight;
  /// The learned shift, [C]; undefined unless `affine`.
  torch::Tensor bias;
  /// The running mean, [C]; undefined unless `track_running_stats`.
  torch::Tensor running_mean;
  /// The running (unbiased) variance, [C]; undefined unless `track_running_stats`.
  torch::Tensor running_var;
  /// Training forwards seen, a long scalar; undefined unless `track_running_stats`.
  torch::Tensor num_batches_tracked;

 private:
  // Not owned; see attach_collectives for its lifetime.
  Collectives* collectives_ = nullptr;
};

/// A ModuleHolder for SyncBatchNormImpl (a shared pointer, like torch::nn::BatchNorm2d).
TORCH_MODULE(SyncBatchNorm);

/// Attaches `collectives` to every SyncBatchNorm in `module`'s tree (the module itself
/// included); see SyncBatchNormImpl::attach_collectives for the lifetime it requires.
void enable_sync_batchnorm(torch::nn::Module& module, Collectives& collectives);
/// Detaches the collectives of every SyncBatchNorm in `module`'s tree.
void disable_sync_batchnorm(torch::nn::Module& module);

/// Attaches `collectives` to every SyncBatchNorm in `module` for a scope and detaches them at
/// its end, also when the scope ends in an exception (the Trainer's `sync_batchnorm` for a fit);
/// nullptr attaches nothing.
class SyncBatchNormScope {
 public:
  /// Attaches `collectives` (when not nullptr) until the scope ends.
  SyncBatchNormScope(torch::nn::Module& module, Collectives* collectives)
      : module_(collectives != nullptr ? &module : nullptr) {
    if (module_ != nullptr) enable_sync_batchnorm(module, *collectives);
  }
  ~SyncBatchNormScope() {
    if (module_ != nullptr) disable_sync_batchnorm(*module_);
  }
  SyncBatchNormScope(const SyncBatchNormScope&) = delete;
  SyncBatchNormScope& operator=(const SyncBatchNormScope&) = delete;

 private:
  torch::nn::Module* module_;
};

/// Whether `module` is a BatchNorm layer: torch::nn::BatchNorm1d/2d/3d or volt::SyncBatchNorm
/// (what PyTorch's _BatchNorm covers; fine-tuning's train_bn asks it).
bool is_batchnorm(const torch::nn::Module& module);

/// Calls `visit` on `module` and on every module below it. Unlike named_modules(include_self),
/// it needs no shared_ptr owning `module` (a LightningModule on the stack has none).
void for_each_module(torch::nn::Module& module, const std::function<void(torch::nn::Module&)>& visit);

/// The paths (as in named_modules: "features.1") of the torch::nn::BatchNorm1d/2d/3d layers in
/// `module`'s tree, which a synchronized run would leave unsynchronized; "" is `module` itself.
std::vector<std::string> plain_batchnorm_paths(const torch::nn::Module& module);

/// The error for `sync_batchnorm = true` on a model whose `paths` (from plain_batchnorm_paths)
/// hold plain BatchNorm layers: names them, says why Volt cannot convert them, and hints at
/// volt::SyncBatchNorm.
std::string plain_batchnorm_message(const std::vector<std::string>& paths);

}  // namespace volt
