#include "volt/strategies/data_parallel.h"

#include <ATen/ThreadLocalState.h>
#include <torch/csrc/autograd/variable.h>

#include <exception>
#include <map>
#include <string>
#include <thread>

#include "volt/core/error.h"
#include "volt/module/lightning_module.h"

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
  void log(const std::string& name, const torch::Tensor& value, const LogOptions& options) override {
    entries.push_back({name, value.detach(), options});
  }
  std::vector<Entry> entries;
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
}

}  // namespace

std::vector<Batch> split_batch(const Batch& batch, int64_t pieces) {
  VOLT_INTERNAL_ASSERT(pieces >= 1, "split_batch into {} pieces", pieces);
  VOLT_CHECK(batch.data.defined() && batch.data.dim() >= 1,
             "dp splits each batch along its first dimension, but the batch's data is {}. HINT: return batched "
             "tensors (examples along dim 0) from the dataset.",
             batch.data.defined() ? "a scalar" : "undefined");
  const int64_t n = batch.data.size(0);
  VOLT_CHECK(!batch.target.defined() || (batch.target.dim() >= 1 && batch.target.size(0) == n),
             "dp splits data and target along dim 0, but the batch has {} examples of data and a target of shape {}. "
             "HINT: give the target one row per example.",
             n, c10::str(batch.target.sizes()));
  const int64_t chunk = std::max<int64_t>(1, (n + pieces - 1) / pieces);
  std::vector<Batch> out;
  for (int64_t start = 0; start < n || out.empty(); start += chunk) {
    const int64_t length = std::min(chunk, n - start);
    Batch piece;
    piece.data = batch.data.narrow(0, start, length);
    if (batch.target.defined()) piece.target = batch.target.narrow(0, start, length);
    out.push_back(std::move(piece));
    if (n == 0) break;
  }
  return out;
}

DataParallel::DataParallel(DataParallelOptions options) : options_(options) {
  VOLT_CHECK(options_.replicas >= 1, "dp needs at least 1 device; got {}.", options_.replicas);
}

torch::Tensor DataParallel::training_step(LightningModule& module, const Batch& batch, int64_t batch_idx) const {
  const std::vector<Batch> pieces = split_batch(batch, options_.replicas);
  const size_t n = pieces.size();
  std::vector<int64_t> sizes(n);
  for (size_t r = 0; r < n; ++r) sizes[r] = pieces[r].data.size(0);
  std::vector<torch::Tensor> losses(n);
  std::vector<ReplicaLog> logs(n);
  std::vector<std::exception_ptr> errors(n);
  // Grad mode, autocast (how a 16-bit precision plugin runs the forward pass) and dispatch keys
  // are thread-local: the replicas run under the caller's.
  const at::ThreadLocalState caller_state;
  const auto run = [&](size_t r) {
    const at::ThreadLocalStateGuard state(caller_state);
    const internal::ThreadMetricSinkScope sink(&logs[r]);
    try {
      losses[r] = module.training_step(pieces[r], batch_idx);
    } catch (...) {
      errors[r] = std::current_exception();
    }
  };
  const std::vector<torch::Tensor> buffers = module.buffers(/*recurse=*/true);
  if (buffers.empty() && !options_.deterministic) {
    std::vector<std::thread> threads;
    threads.reserve(n - 1);
    for (size_t r = 1; r < n; ++r) threads.emplace_back(run, r);
    run(0);
    for (auto& thread : threads) thread.join();
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
  // Gather on the root device (a no-op on CPU, where every replica's device is the root's).
  const torch::Device root = losses[0].defined() ? losses[0].device() : torch::Device(torch::kCPU);
  for (auto& loss : losses) {
    if (loss.defined()) loss = loss.to(root);
  }
  log_combined(module, logs, sizes);
  return module.training_step_end(losses, sizes);
}

}  // namespace volt
