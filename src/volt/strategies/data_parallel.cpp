#include "volt/strategies/data_parallel.h"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/variable.h>

#include <exception>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "volt/base/autograd_compat.h"
#include "volt/core/error.h"
#include "volt/module/lightning_module.h"
#include "volt/module/run_view.h"

namespace volt {

namespace {

/// One replica's log() calls of one step, detached at once (the graph belongs to the loss).
class ReplicaLog : public MetricSink {
 public:
  struct Entry {
    std::string name;
    torch::Tensor value;
    LogOptions options;
  };
  /// `copies`: the replicas are copies of the module (dp over CUDA devices), not the module itself.
  explicit ReplicaLog(bool copies = false) : copies_(copies) {}
  void log(const std::string& name, const torch::Tensor& value, const LogOptions& options) override {
    entries.push_back({name, value.detach(), options});
  }
  void log_metric(const std::string& name, Metric& metric, const LogOptions& options) override {
    // A copy's metric is a copy too: what the other devices add to theirs would never be counted.
    VOLT_CHECK(!copies_,
               "log('{}', metric) under dp over several CUDA devices: each device's copy of the module updates "
               "its own copy of the metric, so most examples would be missed. HINT: use strategy ddp (one "
               "process per device, metrics synced at compute()), or log values instead.",
               name);
    metrics.push_back({name, &metric, options});
  }
  std::vector<Entry> entries;
  /// log(name, metric) calls: the replicas share the module and so the metric; logged once.
  struct MetricEntry {
    std::string name;
    Metric* metric;
    LogOptions options;
  };
  std::vector<MetricEntry> metrics;

 private:
  bool copies_;
};

/// Logs, on the calling thread, one value per name for all replicas (see DataParallel).
void log_combined(LightningModule& module, const std::vector<ReplicaLog>& logs, const std::vector<int64_t>& sizes) {
  std::vector<std::string> order;  // names in the order replica 0 (then the others) logged them
  std::map<std::string, std::vector<std::pair<torch::Tensor, int64_t>>> values;
  std::map<std::string, LogOptions> options;
  for (size_t r = 0; r < logs.size(); ++r) {
    for (const auto& entry : logs[r].entries) {
      auto& list = values[entry.name];
      if (list.empty()) {
        order.push_back(entry.name);
        options[entry.name] = entry.options;
      }
      list.emplace_back(entry.value.to(torch::kCPU, torch::kDouble), entry.options.batch_size.value_or(sizes[r]));
    }
  }
  for (const std::string& name : order) {
    const auto& list = values[name];
    LogOptions merged = options[name];
    torch::Tensor value;
    int64_t weight = 0;
    for (const auto& [v, w] : list) weight += w;
    switch (merged.reduce_fx) {
      case Reduce::kMean:
        for (const auto& [v, w] : list) {
          const torch::Tensor part = v * (static_cast<double>(w) / static_cast<double>(std::max<int64_t>(1, weight)));
          value = value.defined() ? value + part : part;
        }
        break;
      case Reduce::kSum:
        for (const auto& [v, w] : list) value = value.defined() ? value + v : v;
        break;
      case Reduce::kMax:
        for (const auto& [v, w] : list) value = value.defined() ? torch::maximum(value, v) : v;
        break;
      case Reduce::kMin:
        for (const auto& [v, w] : list) value = value.defined() ? torch::minimum(value, v) : v;
        break;
    }
    // A weight the module gave counts the pieces' examples; otherwise the Trainer's (the whole batch).
    if (merged.batch_size) merged.batch_size = weight;
    module.log(name, value, merged);
  }
  std::set<std::string> logged;
  for (const ReplicaLog& log : logs) {
    for (const auto& entry : log.metrics) {
      if (logged.insert(entry.name).second) module.log(entry.name, *entry.metric, entry.options);
    }
  }
}

/// The backward of a copied parameter: its gradient, moved to the root's device, flows into the
/// module parameter it was copied from (Broadcast's backward in PyTorch's DataParallel).
class GradientToRoot : public torch::autograd::Node {
 public:
  explicit GradientToRoot(c10::Device root) : root_(root) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    return {grads.at(0).defined() ? grads[0].to(root_) : torch::Tensor()};
  }
  std::string name() const override { return "volt::GradientToRoot"; }

 private:
  c10::Device root_;
};

/// "'fc.weight' [256, 784]" for messages.
std::string describe(const std::string& name, const torch::Tensor& tensor) {
  return fmt::format("'{}' {}", name, c10::str(tensor.sizes()));
}

/// Checks that `copy` has `module`'s tensors (names, order, shapes) and gives each of them
/// storage on `device` with the module's dtype.
void place_copy(const LightningModule& module, LightningModule& copy, c10::Device device) {
  const auto check_and_place = [&](const auto& mine, const auto& theirs, const char* what) {
    const size_t count = std::max(mine.size(), theirs.size());
    for (size_t i = 0; i < count; ++i) {
      const bool same = i < mine.size() && i < theirs.size() && mine[i].key() == theirs[i].key() &&
                        mine[i].value().sizes() == theirs[i].value().sizes();
      VOLT_CHECK(same,
                 "dp copies {} to every device with make_replica(), but the copy's {} differ from the module's at "
                 "position {}: the module has {}, the copy has {}. HINT: make_replica() must return a new module "
                 "built with the same options (same layers and sizes).",
                 module.name(), what, i, i < mine.size() ? describe(mine[i].key(), mine[i].value()) : "nothing",
                 i < theirs.size() ? describe(theirs[i].key(), theirs[i].value()) : "nothing");
      torch::Tensor target = theirs[i].value();
      target.set_data(mine[i].value().detach().to(device, /*non_blocking=*/false, /*copy=*/true));
      // A frozen parameter's copy must not collect a gradient of its own.
      if (!mine[i].value().requires_grad()) target.requires_grad_(false);
    }
  };
  torch::NoGradGuard no_grad;
  check_and_place(module.named_parameters(/*recurse=*/true).items(), copy.named_parameters(/*recurse=*/true).items(),
                  "parameters");
  check_and_place(module.named_buffers(/*recurse=*/true).items(), copy.named_buffers(/*recurse=*/true).items(),
                  "buffers");
}

/// Copies the module's current values into `copy` and routes each copied parameter's gradient
/// back to the module's parameter.
void refresh_copy(const LightningModule& module, LightningModule& copy) {
  const std::vector<torch::Tensor> params = module.parameters(/*recurse=*/true);
  const std::vector<torch::Tensor> copied = copy.parameters(/*recurse=*/true);
  for (size_t i = 0; i < params.size(); ++i) {
    {
      torch::NoGradGuard no_grad;
      copied[i].detach().copy_(params[i].detach());
    }
    if (!params[i].requires_grad()) continue;
    auto node = compat::make_autograd_node<GradientToRoot>(params[i].device());
    node->set_next_edges(torch::autograd::collect_next_edges(params[i]));
    torch::Tensor copy_param = copied[i];  // the same tensor; LibTorch 1.x takes it by non-const reference
    torch::autograd::set_history(copy_param, node);
  }
  const std::vector<torch::Tensor> buffers = module.buffers(/*recurse=*/true);
  const std::vector<torch::Tensor> copied_buffers = copy.buffers(/*recurse=*/true);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < buffers.size(); ++i) copied_buffers[i].detach().copy_(buffers[i].detach());
}

}  // namespace

std::vector<Batch> split_batch(const Batch& batch, int64_t pieces) {
  VOLT_INTERNAL_ASSERT(pieces >= 1, "split_batch into {} pieces", pieces);
  const bool has_examples = (batch.data.defined() && batch.data.dim() >= 1) || !batch.tensors.empty() ||
                            !batch.lists.empty() || (batch.target.defined() && batch.target.dim() >= 1);
  VOLT_CHECK(has_examples,
             "dp splits each batch along its first dimension, but the batch's data is {} and it has no named tensors "
             "or lists. HINT: return batched tensors (examples along dim 0) from the dataset.",
             batch.data.defined() ? "a scalar" : "undefined");
  batch.check_sizes("dp");
  const int64_t n = batch.size();
  const int64_t chunk = std::max<int64_t>(1, (n + pieces - 1) / pieces);
  std::vector<Batch> out;
  for (int64_t start = 0; start < n || out.empty(); start += chunk) {
    out.push_back(batch.slice(start, std::min(chunk, n - start)));
    if (n == 0) break;
  }
  return out;
}

namespace {

// A copy's view of the run: the module's, except that the copy runs on its own device.
class CopyView : public RunView {
 public:
  CopyView(const RunView& run, torch::Device device) : run_(run), device_(device) {}
  int64_t current_epoch() const override { return run_.current_epoch(); }
  int64_t global_step() const override { return run_.global_step(); }
  const Topology& topology() const override { return run_.topology(); }
  torch::Device device() const override { return device_; }
  Collectives& collectives() const override { return run_.collectives(); }
  void print(const std::string& line) const override { run_.print(line); }

 private:
  const RunView& run_;
  torch::Device device_;
};

}  // namespace

DataParallel::DataParallel(DataParallelOptions options) : options_(std::move(options)) {
  VOLT_CHECK(options_.replicas >= 1,
             "dp needs at least 1 device; got {}. HINT: set replicas to the number of devices each batch is split "
             "across (the default is 2).",
             options_.replicas);
  VOLT_INTERNAL_ASSERT(options_.devices.empty() || static_cast<int64_t>(options_.devices.size()) == options_.replicas,
                       "dp: {} devices for {} replicas", options_.devices.size(), options_.replicas);
}

std::vector<LightningModule*> DataParallel::refresh_replicas(LightningModule& module, size_t count) {
  std::vector<LightningModule*> replicas(count, &module);
  if (options_.devices.empty()) return replicas;
  copies_.resize(std::max(copies_.size(), count - 1));
  for (size_t r = 1; r < count; ++r) {
    std::shared_ptr<LightningModule>& copy = copies_[r - 1];
    if (!copy) {
      copy = module.make_replica();
      VOLT_CHECK(copy != nullptr && copy.get() != &module,
                 "dp on {} devices runs a copy of {} on each device but the first, and its make_replica() returned {}. "
                 "HINT: override make_replica() to return a new module built with the same options, e.g. `return "
                 "std::make_shared<MyModel>(options_);`, or use strategy='ddp' (one process per device), which needs "
                 "no copies.",
                 options_.devices.size(), module.name(), copy ? "the module itself" : "nullptr (the default)");
      // A module that builds its layers late builds the copy's too (values are copied below).
      copy->configure_model();
      place_copy(module, *copy, options_.devices[r]);
    }
    copy->train(module.is_training());
    refresh_copy(module, *copy);
    // A copy's view wraps the module's; made again only when a new stage installed another one,
    // not on every step.
    copy_views_.resize(copies_.size());
    if (module.run_view() != viewed_ || !copy_views_[r - 1]) {
      copy_views_[r - 1] =
          module.run_view() == nullptr ? nullptr : std::make_shared<CopyView>(*module.run_view(), options_.devices[r]);
      internal::ModuleAccess::set_run_view(*copy, copy_views_[r - 1].get());
    }
    replicas[r] = copy.get();
  }
  viewed_ = module.run_view();
  return replicas;
}

torch::Tensor DataParallel::training_step(LightningModule& module, const Batch& batch, int64_t batch_idx) {
  std::vector<Batch> pieces = split_batch(batch, options_.replicas);
  const size_t n = pieces.size();
  const bool copies = !options_.devices.empty();
  const std::vector<LightningModule*> replicas = refresh_replicas(module, n);
  if (copies) {
    // Scatter: each piece goes to its replica's device.
    for (size_t r = 0; r < n; ++r) {
      const c10::Device device = options_.devices[r];
      pieces[r] = pieces[r].map([device](const torch::Tensor& t) { return t.to(device); });
    }
  }
  std::vector<int64_t> sizes(n);
  for (size_t r = 0; r < n; ++r) sizes[r] = pieces[r].size();
  std::vector<torch::Tensor> losses(n);
  std::vector<ReplicaLog> logs(n, ReplicaLog(copies));
  std::vector<std::exception_ptr> errors(n);
  // Grad mode, autocast (how a 16-bit precision plugin runs the forward pass) and dispatch keys
  // are thread-local: the replicas run under the caller's.
  const at::ThreadLocalState caller_state;
  const auto run = [&](size_t r) {
    const at::ThreadLocalStateGuard state(caller_state);
    // A new thread's OpenMP starts with a team per core: give it the process's intra-op threads.
    at::init_num_threads();
    const internal::ThreadMetricSinkScope sink(&logs[r]);
    // The current CUDA device is per thread and not part of ThreadLocalState.
    std::optional<c10::DeviceGuard> device;
    if (copies && !options_.devices[r].is_cpu()) device.emplace(options_.devices[r]);
    try {
      losses[r] = replicas[r]->training_step(pieces[r], batch_idx);
    } catch (...) {
      errors[r] = std::current_exception();
    }
  };
  // Copies own their buffers; threads over the module share its buffers.
  const std::vector<torch::Tensor> buffers = copies ? std::vector<torch::Tensor>{} : module.buffers(/*recurse=*/true);
  if (buffers.empty() && !options_.deterministic) {
    std::vector<std::thread> threads;
    threads.reserve(n - 1);
    for (size_t r = 1; r < n; ++r) threads.emplace_back(run, r);
    run(0);
    for (auto& thread : threads) thread.join();
  } else if (copies) {
    for (size_t r = 0; r < n && errors[0] == nullptr; ++r) run(r);  // deterministic: in replica order
  } else {
    // Buffers are written in place by forward passes: the replicas take turns (still on their
    // own threads, the path CUDA takes) and the root's buffer values are kept. Each graph saved
    // the buffers it updated (BatchNorm saves its running statistics, though its training
    // backward never reads them) at the version its own forward left: every replica starts
    // from a fresh version counter and the buffers end at the version the root saw, so the
    // replicas' graphs all pass autograd's in-place check, as one forward pass would.
    const auto fresh_versions = [&buffers] {
      for (const auto& b : buffers) torch::autograd::impl::set_version_counter(b, c10::VariableVersion(0));
    };
    fresh_versions();
    run(0);
    std::vector<torch::Tensor> root_buffers;
    std::vector<uint32_t> root_versions;
    for (const auto& b : buffers) {
      root_buffers.push_back(b.detach().clone());
      root_versions.push_back(static_cast<uint32_t>(b._version()));
    }
    for (size_t r = 1; r < n && errors[0] == nullptr; ++r) {
      fresh_versions();
      std::thread(run, r).join();
    }
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < buffers.size(); ++i) {
      buffers[i].detach().copy_(root_buffers[i]);
      torch::autograd::impl::set_version_counter(buffers[i], c10::VariableVersion(root_versions[i]));
    }
  }
  for (const auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  // Gather on the root device (a no-op on CPU, where every replica's device is the root's); the
  // copy to the root is differentiable, so each loss's gradient goes back to its replica.
  const torch::Device root = copies                ? options_.devices[0]
                             : losses[0].defined() ? losses[0].device()
                                                   : torch::Device(torch::kCPU);
  for (auto& loss : losses) {
    if (loss.defined()) loss = loss.to(root);
  }
  log_combined(module, logs, sizes);
  return module.training_step_end(losses, sizes);
}

}  // namespace volt
