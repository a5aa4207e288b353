#include "volt/nn/sync_batch_norm.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/autograd.h>
#include <torch/nn/functional/batchnorm.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/batchnorm.h>

#include <memory>
#include <utility>

#include "volt/base/reduce.h"
#include "volt/core/error.h"
#include "volt/core/strings.h"

namespace volt {
namespace {

// The collectives travel from forward to backward in the autograd context, which holds IValues.
struct CollectivesHandle : torch::CustomClassHolder {
  explicit CollectivesHandle(Collectives* c) : collectives(c) {}
  Collectives* collectives;
};

// The other ranks, for messages: the peers one of which stopped when a collective fails.
std::string peers(const Collectives& collectives) {
  const int64_t world = collectives.world_size();
  const int64_t rank = collectives.rank();
  if (world == 2) return fmt::format("rank {}", 1 - rank);
  if (world > 8) return fmt::format("{} other ranks", world - 1);
  std::vector<std::string> others;
  for (int64_t r = 0; r < world; ++r) {
    if (r != rank) others.push_back(std::to_string(r));
  }
  return "ranks " + join(others, ", ");
}

// Throws the error of a failed collective: which one of the layer's, and whom this rank waited for.
[[noreturn]] void fail_collective(const Collectives& collectives, const char* what, const std::string& cause) {
  throw Error(fmt::format(
      "rank {} of {}: SyncBatchNorm's all-reduce of {} failed while waiting for {}: {}. HINT: every rank must "
      "run the forward and backward of every SyncBatchNorm layer in the same order; a rank that stopped, "
      "crashed or skipped the layer fails the others here (look for its own error), and one slower than the "
      "process group's timeout looks the same.",
      collectives.rank(), collectives.world_size(), what, peers(collectives), cause));
}

// Sums `values` across ranks; a failure (a peer that died, hung or skipped the layer) becomes a
// volt::Error that says which collective of the layer it was and whom this rank waited for.
void sum_across_ranks(Collectives& collectives, torch::Tensor& values, const char* what) {
  try {
    collectives.all_reduce(values, Reduce::kSum);
  } catch (const InternalError&) {
    throw;
  } catch (const c10::Error& e) {
    // c10's what() appends a C++ backtrace, which would bury the message.
    fail_collective(collectives, what, e.what_without_backtrace());
  } catch (const std::exception& e) {
    fail_collective(collectives, what, e.what());
  }
}

// Per-channel dimensions of [N, C, ...]: every dimension but 1.
std::vector<int64_t> reduced_dims(const torch::Tensor& input) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

// [C] -> [1, C, 1, ...], to broadcast against an input of `dim` dimensions.
torch::Tensor per_channel(const torch::Tensor& values, int64_t dim) {
  std::vector<int64_t> shape(static_cast<size_t>(dim), 1);
  shape[1] = values.size(0);
  return values.view(shape);
}

// The global per-channel mean and biased variance of one training batch.
struct GlobalStats {
  torch::Tensor mean;  // [C], float64
  torch::Tensor var;   // [C], float64, biased
  double count = 0;    // values per channel over every rank
};

// Reduces the batch statistics of `input` across ranks in one collective: [sum (C), sum of
// squares (C), count]. Each rank computes its own mean and variance first (ATen's stable
// reduction) and sends n*mean and n*(var + mean^2) in float64, so the one subtraction left,
// E[x^2] - mean^2, loses little even where |mean| >> std.
GlobalStats reduce_stats(const torch::Tensor& input, Collectives& collectives) {
  const int64_t channels = input.size(1);
  const int64_t count = input.numel() / channels;
  torch::Tensor packed = torch::zeros({2 * channels + 1}, input.options().dtype(torch::kDouble));
  // An empty rank sends zeros: it adds nothing to the sums (its own mean would be NaN).
  if (count > 0) {
    auto [var, mean] = torch::var_mean(input, reduced_dims(input), /*unbiased=*/false, /*keepdim=*/false);
    const torch::Tensor mean64 = mean.to(torch::kDouble);
    packed.narrow(0, 0, channels).copy_(mean64 * count);
    packed.narrow(0, channels, channels).copy_((var.to(torch::kDouble) + mean64 * mean64) * count);
    packed[2 * channels].fill_(static_cast<double>(count));
  }
  sum_across_ranks(collectives, packed, "the batch statistics (forward)");
  GlobalStats stats;
  stats.count = packed[2 * channels].item<double>();
  VOLT_CHECK(stats.count > 1,
             "SyncBatchNorm was given {} value(s) per channel in this training batch over all {} ranks (this rank: "
             "input of shape [{}]); expected more than 1. HINT: a batch of one example with no spatial dimensions "
             "has no variance; use larger batches, or drop_last in the loader so no tiny final batch remains.",
             static_cast<int64_t>(stats.count), collectives.world_size(), fmt::join(input.sizes(), ", "));
  stats.mean = packed.narrow(0, 0, channels) / stats.count;
  stats.var = (packed.narrow(0, channels, channels) / stats.count - stats.mean * stats.mean).clamp_min(0);
  return stats;
}

// Normalizes with statistics already reduced across ranks; its backward reduces the gradient sums
// that the mean and variance carry, so every rank's input gradient is the whole batch's.
class SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
                               const torch::Tensor& weight, const torch::Tensor& bias, const torch::Tensor& mean,
                               const torch::Tensor& invstd, Collectives* collectives, double count) {
    ctx->save_for_backward({input, weight, mean, invstd});
    ctx->saved_data["collectives"] = c10::IValue::make_capsule(c10::make_intrusive<CollectivesHandle>(collectives));
    ctx->saved_data["count"] = count;
    // y = x * scale + shift, as ATen's CPU batch norm computes it.
    const torch::Tensor scale = invstd * weight;
    const torch::Tensor shift = bias - mean * scale;
    return input * per_channel(scale, input.dim()) + per_channel(shift, input.dim());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& input = saved[0];
    const torch::Tensor& weight = saved[1];
    const torch::Tensor& mean = saved[2];
    const torch::Tensor& invstd = saved[3];
    const torch::Tensor& grad_output = grad_outputs[0];
    const int64_t dim = input.dim();
    const int64_t channels = input.size(1);
    const std::vector<int64_t> dims = reduced_dims(input);

    const torch::Tensor x_hat = (input - per_channel(mean, dim)) * per_channel(invstd, dim);
    const torch::Tensor sum_dy = grad_output.sum(dims);
    const torch::Tensor sum_dy_x_hat = (grad_output * x_hat).sum(dims);

    torch::autograd::variable_list grads(7);
    if (ctx->needs_input_grad(1)) grads[1] = sum_dy_x_hat;
    if (ctx->needs_input_grad(2)) grads[2] = sum_dy;
    // PyTorch's SyncBatchNorm also skips the collective when no rank needs the input's gradient
    // (the same model on every rank decides the same way).
    if (!ctx->needs_input_grad(0)) return grads;

    const auto handle = ctx->saved_data["collectives"].toCapsule();
    Collectives& collectives = *static_cast<CollectivesHandle*>(handle.get())->collectives;
    const double count = ctx->saved_data["count"].toDouble();
    torch::Tensor packed = torch::cat({sum_dy, sum_dy_x_hat}).to(torch::kDouble);
    sum_across_ranks(collectives, packed, "the gradient sums (backward)");
    const torch::Tensor mean_dy = (packed.narrow(0, 0, channels) / count).to(input.scalar_type());
    const torch::Tensor mean_dy_x_hat = (packed.narrow(0, channels, channels) / count).to(input.scalar_type());
    const torch::Tensor scale = invstd * weight;
    grads[0] =
        (grad_output - per_channel(mean_dy, dim) - x_hat * per_channel(mean_dy_x_hat, dim)) * per_channel(scale, dim);
    return grads;
  }
};

// LibTorch's BatchNorm layers, which a synchronized run cannot convert.
bool is_plain_batchnorm(const torch::nn::Module& module) {
  return dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&module) != nullptr ||
         dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&module) != nullptr ||
         dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&module) != nullptr;
}

// Calls `visit` on `module` and every module below it. named_modules(include_self) needs a module
// owned by a shared_ptr; a LightningModule on the stack is not, so the root is visited by hand.
template <typename Module, typename Visit>
void for_each_module(Module& module, const Visit& visit) {
  visit(std::string(), module);
  for (const auto& item : module.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    visit(item.key(), *item.value());
  }
}

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::BatchNormOptions& options) : options(options) { reset(); }

void SyncBatchNormImpl::reset() {
  // BatchNorm's registrations, names and all (an undefined tensor where an option is off), so
  // that state dicts are interchangeable with torch::nn::BatchNorm*d.
  const int64_t features = options.num_features();
  if (options.affine()) {
    weight = register_parameter("weight", torch::empty({features}));
    bias = register_parameter("bias", torch::empty({features}));
  } else {
    weight = register_parameter("weight", torch::Tensor(), /*requires_grad=*/false);
    bias = register_parameter("bias", torch::Tensor(), /*requires_grad=*/false);
  }
  if (options.track_running_stats()) {
    running_mean = register_buffer("running_mean", torch::zeros({features}));
    running_var = register_buffer("running_var", torch::ones({features}));
    num_batches_tracked = register_buffer("num_batches_tracked", torch::tensor(0, torch::dtype(torch::kLong)));
  } else {
    running_mean = register_buffer("running_mean", torch::Tensor());
    running_var = register_buffer("running_var", torch::Tensor());
    num_batches_tracked = register_buffer("num_batches_tracked", torch::Tensor());
  }
  reset_parameters();
}

void SyncBatchNormImpl::reset_running_stats() {
  if (!options.track_running_stats()) return;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

void SyncBatchNormImpl::reset_parameters() {
  reset_running_stats();
  if (!options.affine()) return;
  torch::nn::init::ones_(weight);
  torch::nn::init::zeros_(bias);
}

void SyncBatchNormImpl::attach_collectives(Collectives& collectives) { collectives_ = &collectives; }

void SyncBatchNormImpl::detach_collectives() { collectives_ = nullptr; }

bool SyncBatchNormImpl::synchronized() const { return collectives_ != nullptr && collectives_->world_size() > 1; }

torch::Tensor SyncBatchNormImpl::forward(const torch::Tensor& input) {
  VOLT_CHECK(input.dim() >= 2,
             "SyncBatchNorm was given an input of {} dimension(s) (shape [{}]); expected at least 2, [N, C, ...]. "
             "HINT: a single example needs a batch dimension: input.unsqueeze(0).",
             input.dim(), fmt::join(input.sizes(), ", "));
  VOLT_CHECK(input.size(1) == options.num_features(),
             "SyncBatchNorm({}) was given an input with {} channels (shape [{}]); expected {} in dimension 1. HINT: "
             "make num_features the channel count of the layer before it, with channels in dimension 1 ([N, C, ...]).",
             options.num_features(), input.size(1), fmt::join(input.sizes(), ", "), options.num_features());
  // BatchNormImplBase::forward, step for step, so that unsynchronized this layer is BatchNorm.
  double average_factor = options.momentum().value_or(0.0);
  if (is_training() && options.track_running_stats() && num_batches_tracked.defined()) {
    num_batches_tracked += 1;
    // No momentum: the cumulative moving average.
    if (!options.momentum()) average_factor = 1.0 / num_batches_tracked.item<double>();
  }
  // Without running statistics, eval mode also normalizes with the batch's (BatchNorm's rule);
  // PyTorch's SyncBatchNorm synchronizes only in training, and so does this layer.
  if (!is_training() || !synchronized()) {
    return torch::nn::functional::detail::batch_norm(input, running_mean, running_var, weight, bias,
                                                     is_training() || !options.track_running_stats(), average_factor,
                                                     options.eps());
  }

  torch::Tensor mean;
  torch::Tensor invstd;
  double count = 0;
  {
    torch::NoGradGuard no_grad;
    const GlobalStats stats = reduce_stats(input, *collectives_);
    count = stats.count;
    if (running_mean.defined()) {
      running_mean.mul_(1 - average_factor).add_(stats.mean.to(running_mean.scalar_type()), average_factor);
      // The unbiased variance of the whole batch: the count is every rank's.
      running_var.mul_(1 - average_factor)
          .add_((stats.var * (count / (count - 1))).to(running_var.scalar_type()), average_factor);
    }
    mean = stats.mean.to(input.scalar_type());
    invstd = (stats.var + options.eps()).rsqrt().to(input.scalar_type());
  }
  // A custom autograd Function takes no undefined tensors: without `affine`, a constant scale of
  // 1 and shift of 0 stand in (they need no gradient, so backward computes none).
  const torch::Tensor scale = weight.defined() ? weight : torch::ones_like(mean);
  const torch::Tensor shift = bias.defined() ? bias : torch::zeros_like(mean);
  return SyncBatchNormFunction::apply(input, scale, shift, mean, invstd, collectives_, count);
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << std::boolalpha << "volt::SyncBatchNorm(" << options.num_features() << ", eps=" << options.eps()
         << ", momentum=";
  if (options.momentum()) {
    stream << *options.momentum();
  } else {
    stream << "None";
  }
  stream << ", affine=" << options.affine() << ", track_running_stats=" << options.track_running_stats() << ")";
}

void enable_sync_batchnorm(torch::nn::Module& module, Collectives& collectives) {
  for_each_module(module, [&](const std::string&, torch::nn::Module& each) {
    if (auto* layer = dynamic_cast<SyncBatchNormImpl*>(&each)) layer->attach_collectives(collectives);
  });
}

void disable_sync_batchnorm(torch::nn::Module& module) {
  for_each_module(module, [](const std::string&, torch::nn::Module& each) {
    if (auto* layer = dynamic_cast<SyncBatchNormImpl*>(&each)) layer->detach_collectives();
  });
}

bool is_batchnorm(const torch::nn::Module& module) {
  return is_plain_batchnorm(module) || dynamic_cast<const SyncBatchNormImpl*>(&module) != nullptr;
}

void for_each_module(torch::nn::Module& module, const std::function<void(torch::nn::Module&)>& visit) {
  for_each_module(module, [&](const std::string&, torch::nn::Module& each) { visit(each); });
}

std::vector<std::string> plain_batchnorm_paths(const torch::nn::Module& module) {
  std::vector<std::string> paths;
  for_each_module(module, [&](const std::string& path, const torch::nn::Module& each) {
    if (is_plain_batchnorm(each)) paths.push_back(path);
  });
  return paths;
}

std::string plain_batchnorm_message(const std::vector<std::string>& paths) {
  std::vector<std::string> named;
  for (const std::string& path : paths) named.push_back(path.empty() ? "(the model itself)" : "'" + path + "'");
  return fmt::format(
      "sync_batchnorm=true, but the model has {} plain BatchNorm layer(s) that would stay unsynchronized: {}. "
      "LibTorch cannot replace a module in place (a `torch::nn::BatchNorm2d bn_` member keeps pointing at its "
      "module), so Volt cannot convert them as PyTorch's convert_sync_batchnorm does. HINT: declare those layers "
      "as volt::SyncBatchNorm (`volt::SyncBatchNorm bn_{{nullptr}};` and "
      "`bn_ = register_module(\"bn\", volt::SyncBatchNorm(torch::nn::BatchNormOptions(channels)));` from "
      "<volt/nn/nn.h>): it is plain BatchNorm when not synchronized, with the same state dict keys, so the "
      "model and its checkpoints work on one process too; or set sync_batchnorm=false.",
      paths.size(), join(named, ", "));
}

}  // namespace volt
