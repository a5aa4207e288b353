#include "volt/module/lightning_module.h"

#include <torch/nn/utils/clip_grad.h>

#include <cmath>
#include <set>

#include "volt/base/collectives.h"
#include "volt/core/console.h"
#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/distributed/topology.h"
#include "volt/module/run_view.h"
#include "volt/optim/lr_scheduler.h"

namespace volt {

namespace {
// Set only on dp's replica threads; nullptr everywhere else.
thread_local MetricSink* t_thread_sink = nullptr;
}  // namespace

namespace internal {
ThreadMetricSinkScope::ThreadMetricSinkScope(MetricSink* sink) : previous_(t_thread_sink) { t_thread_sink = sink; }
ThreadMetricSinkScope::~ThreadMetricSinkScope() { t_thread_sink = previous_; }
}  // namespace internal

LightningModule::~LightningModule() = default;

int64_t LightningModule::current_epoch() const { return run_view_ ? run_view_->current_epoch() : 0; }

int64_t LightningModule::global_step() const { return run_view_ ? run_view_->global_step() : 0; }

std::optional<int64_t> LightningModule::estimated_stepping_batches() const {
  return run_view_ ? run_view_->estimated_stepping_batches() : std::nullopt;
}

int64_t LightningModule::global_rank() const { return run_view_ ? run_view_->topology().global_rank : 0; }

int64_t LightningModule::local_rank() const { return run_view_ ? run_view_->topology().local_rank : 0; }

int64_t LightningModule::node_rank() const { return run_view_ ? run_view_->topology().node_rank : 0; }

int64_t LightningModule::world_size() const { return run_view_ ? run_view_->topology().world_size : 1; }

bool LightningModule::is_global_zero() const { return global_rank() == 0; }

torch::Device LightningModule::device() const {
  if (run_view_) return run_view_->device();
  const std::vector<torch::Tensor> params = parameters();
  return params.empty() ? torch::Device(torch::kCPU) : params.front().device();
}

std::vector<torch::Tensor> LightningModule::all_gather(const torch::Tensor& tensor) {
  const torch::NoGradGuard no_grad;
  return (run_view_ ? run_view_->collectives() : local_collectives()).all_gather(tensor.detach());
}

torch::Tensor LightningModule::all_reduce(const torch::Tensor& tensor, Reduce op) {
  const torch::NoGradGuard no_grad;
  torch::Tensor values = tensor.detach().clone();
  (run_view_ ? run_view_->collectives() : local_collectives()).all_reduce(values, op);
  return values;
}

void LightningModule::print(const std::string& line) const {
  if (!run_view_) {
    // No run, so no run's console: the process's own, as the Trainer's default is.
    make_stdio_console()->info(line);
  } else if (is_global_zero()) {
    run_view_->print(line);
  }
}

void LightningOptimizer::zero_grad() { optimizer().zero_grad(); }

torch::optim::Optimizer& LightningOptimizer::optimizer() const { return *loop_->optimization().optimizers.at(index_); }

namespace {

ManualOptimization& manual_loop(ManualOptimization* loop, const LightningModule& module, const char* call) {
  VOLT_CHECK(!module.automatic_optimization(),
             "{}::{}() is for manual optimization, but automatic_optimization() is true: the Trainer backpropagates "
             "and steps itself. HINT: call set_automatic_optimization(false) in the module's constructor.",
             module.name(), call);
  VOLT_CHECK(loop != nullptr,
             "{}::{}() was called outside fit's training (no optimizers are set up there). HINT: call it from "
             "training_step or the training hooks.",
             module.name(), call);
  return *loop;
}

}  // namespace

void LightningModule::manual_backward(const torch::Tensor& loss) {
  manual_loop(manual_, *this, "manual_backward").backward(loss);
}

std::vector<LightningOptimizer> LightningModule::optimizers() {
  ManualOptimization& loop = manual_loop(manual_, *this, "optimizers");
  std::vector<LightningOptimizer> out;
  for (size_t i = 0; i < loop.optimization().optimizers.size(); ++i) out.emplace_back(loop, i);
  return out;
}

std::vector<std::shared_ptr<LRScheduler>> LightningModule::lr_schedulers() {
  std::vector<std::shared_ptr<LRScheduler>> out;
  for (const SchedulerConfig& config : manual_loop(manual_, *this, "lr_schedulers").optimization().schedulers) {
    out.push_back(config.scheduler);
  }
  return out;
}

void LightningModule::toggle_optimizer(const LightningOptimizer& optimizer) {
  const OptimizerConfig& optimization = manual_loop(manual_, *this, "toggle_optimizer").optimization();
  untoggle_optimizer(optimizer);
  std::set<const void*> own;
  for (const auto& group : optimizer.optimizer().param_groups())
    for (const auto& p : group.params()) own.insert(p.unsafeGetTensorImpl());
  for (const auto& other : optimization.optimizers) {
    for (const auto& group : other->param_groups()) {
      for (const auto& p : group.params()) {
        if (own.count(p.unsafeGetTensorImpl()) != 0 || !p.requires_grad()) continue;
        toggled_.push_back(p);
        p.set_requires_grad(false);
      }
    }
  }
}

void LightningModule::untoggle_optimizer(const LightningOptimizer& optimizer) {
  for (torch::Tensor& p : toggled_) p.set_requires_grad(true);
  toggled_.clear();
}

void LightningModule::clip_gradients(const LightningOptimizer& optimizer, double value,
                                     GradientClipAlgorithm algorithm) {
  VOLT_CHECK(value >= 0.0, "{}::clip_gradients got value={}; expected >= 0. HINT: 0 does not clip.", name(), value);
  manual_loop(manual_, *this, "clip_gradients").clip_gradients(optimizer.index(), value, algorithm);
}

std::vector<DataLoader> LightningModule::val_dataloaders() { return as_loaders(val_dataloader()); }

std::vector<DataLoader> LightningModule::test_dataloaders() { return as_loaders(test_dataloader()); }

torch::Tensor LightningModule::training_step_end(const std::vector<torch::Tensor>& losses,
                                                 const std::vector<int64_t>& batch_sizes) {
  VOLT_INTERNAL_ASSERT(!losses.empty() && losses.size() == batch_sizes.size(), "training_step_end: {} losses, {} sizes",
                       losses.size(), batch_sizes.size());
  // One piece: returned as is, so a single process trains bit-identically with or without this hook.
  if (losses.size() == 1) return losses.front();
  int64_t total = 0;
  for (int64_t n : batch_sizes) total += n;
  torch::Tensor sum;
  for (size_t i = 0; i < losses.size(); ++i) {
    VOLT_CHECK(losses[i].defined() && losses[i].numel() == 1,
               "{}::training_step returned {} for replica {}; the default training_step_end expects scalar losses. "
               "HINT: return a scalar loss, or override training_step_end to combine your outputs.",
               name(),
               losses[i].defined() ? fmt::format("shape {}", c10::str(losses[i].sizes())) : "an undefined tensor", i);
    const torch::Tensor weighted =
        losses[i].reshape({}) * (static_cast<double>(batch_sizes[i]) / static_cast<double>(total));
    sum = sum.defined() ? sum + weighted : weighted;
  }
  return sum;
}

Batch LightningModule::transfer_batch_to_device(Batch batch, torch::Device device, int64_t /*dataloader_idx*/) {
  // A batch the loader pinned is copied to the GPU without blocking the step's thread.
  return batch.map([&](const torch::Tensor& t) { return t.to(device, /*non_blocking=*/t.is_pinned()); });
}

void LightningModule::configure_gradient_clipping(torch::optim::Optimizer& optimizer,
                                                  std::optional<double> gradient_clip_val,
                                                  GradientClipAlgorithm gradient_clip_algorithm) {
  if (gradient_clip_val) clip_gradients(optimizer, *gradient_clip_val, gradient_clip_algorithm);
}

void LightningModule::clip_gradients(torch::optim::Optimizer& optimizer, double value,
                                     GradientClipAlgorithm algorithm) {
  VOLT_CHECK(value >= 0.0, "{}::clip_gradients got value={}; expected >= 0. HINT: 0 does not clip.", name(), value);
  if (value == 0.0) return;
  std::vector<torch::Tensor> params;
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params()) params.push_back(p);
  if (algorithm == GradientClipAlgorithm::kNorm && run_view_ != nullptr && run_view_->shards_gradients()) {
    // Each process holds a shard of the gradients (fsdp): the norm is over all of them, so every
    // process scales by the same factor, as clip_grad_norm_ would over the whole gradients.
    torch::NoGradGuard no_grad;
    torch::Tensor squares = torch::zeros({1}, torch::kDouble);
    for (const torch::Tensor& p : params) {
      if (p.grad().defined()) squares += p.grad().to(torch::kDouble).pow(2).sum().cpu();
    }
    run_view_->collectives().all_reduce(squares, Reduce::kSum);
    const double coefficient = value / (std::sqrt(squares.item<double>()) + 1e-6);
    if (coefficient < 1.0) {
      for (const torch::Tensor& p : params)
        if (p.grad().defined()) p.grad().mul_(coefficient);
    }
  } else if (algorithm == GradientClipAlgorithm::kNorm) {
    torch::nn::utils::clip_grad_norm_(params, value);
  } else {
    torch::nn::utils::clip_grad_value_(params, value);
  }
}

void LightningModule::lr_scheduler_step(LRScheduler& scheduler, std::optional<double> metric) {
  scheduler.step(metric);
}

torch::Tensor LightningModule::predict_step(const Batch& batch, int64_t batch_idx) {
  throw Error(
      fmt::format("{} does not implement predict_step, so Trainer::predict has nothing to run. "
                  "HINT: override `torch::Tensor predict_step(const volt::Batch&, int64_t)`.",
                  name()));
}

void LightningModule::log(const std::string& name, const torch::Tensor& value, const LogOptions& options) {
  MetricSink* sink = t_thread_sink != nullptr ? t_thread_sink : sink_;
  VOLT_CHECK(sink != nullptr,
             "log('{}') was called outside a Trainer stage. HINT: call log() only from the steps and "
             "hooks the Trainer runs.",
             name);
  sink->log(name, value, options);
}

void LightningModule::log(const std::string& name, double value, const LogOptions& options) {
  log(name, torch::scalar_tensor(value, torch::kDouble), options);
}

void LightningModule::log_dict(const std::map<std::string, torch::Tensor>& values, const LogOptions& options) {
  for (const auto& [name, value] : values) log(name, value, options);
}

void LightningModule::log(const std::string& name, Metric& metric, const LogOptions& options) {
  MetricSink* sink = t_thread_sink != nullptr ? t_thread_sink : sink_;
  VOLT_CHECK(sink != nullptr,
             "log('{}', metric) was called outside a Trainer stage. HINT: call log() only from the steps and "
             "hooks the Trainer runs, or call metric.compute() yourself.",
             name);
  sink->log_metric(name, metric, options);
}

void MetricSink::log_metric(const std::string& name, Metric& metric, const LogOptions& options) {
  throw Error(
      fmt::format("log('{}', metric): this stage's log takes values only. HINT: log the value of "
                  "metric.compute() instead.",
                  name));
}

void LightningModule::register_metric(const std::string& name, Metric& metric) {
  for (const auto& [known, registered] : metrics_) {
    VOLT_CHECK(known != name,
               "register_metric('{}'): a metric is registered under that name already. HINT: give "
               "each metric its own name.",
               name);
    VOLT_CHECK(registered != &metric,
               "register_metric('{}'): this metric is registered already as '{}'. HINT: "
               "register each metric once.",
               name, known);
  }
  VOLT_CHECK(!name.empty(), "register_metric: the name is empty. HINT: name the metric, e.g. \"train_acc\".");
  metrics_.emplace_back(name, &metric);
}

Collectives& LightningModule::collectives() const { return run_view_ ? run_view_->collectives() : local_collectives(); }

}  // namespace volt
