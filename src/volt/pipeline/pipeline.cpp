#include "volt/pipeline/pipeline.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/pipeline/balance.h"

namespace volt {

namespace {

using Clock = std::chrono::steady_clock;

/// One pass of one micro-batch on one stage.
struct Op {
  bool forward;
  int64_t micro_batch;
};

/// The ops stage `s` of `k` runs for `m` micro-batches, in order.
std::vector<Op> stage_ops(PipelineSchedule schedule, int64_t s, int64_t k, int64_t m) {
  std::vector<Op> ops;
  if (schedule == PipelineSchedule::kGPipe) {
    for (int64_t i = 0; i < m; ++i) ops.push_back({true, i});
    for (int64_t i = m - 1; i >= 0; --i) ops.push_back({false, i});
    return ops;
  }
  // 1F1B (PipeDream-flush): the later a stage, the fewer forwards it runs ahead of its first
  // backward, so at most k - s micro-batches' activations are alive on stage s.
  const int64_t warmup = std::min(k - s - 1, m);
  for (int64_t i = 0; i < warmup; ++i) ops.push_back({true, i});
  for (int64_t i = 0; i + warmup < m; ++i) {
    ops.push_back({true, i + warmup});
    ops.push_back({false, i});
  }
  for (int64_t i = m - warmup; i < m; ++i) ops.push_back({false, i});
  return ops;
}

/// The tensors that flow between stages during one step, with a wait that ends when any stage
/// failed (so no stage waits for a neighbour that stopped).
class Exchange {
 public:
  Exchange(int64_t stages, int64_t micro_batches)
      : activations_(static_cast<size_t>(stages), std::vector<std::optional<torch::Tensor>>(micro_batches)),
        gradients_(activations_) {}

  void put_activation(int64_t stage, int64_t i, torch::Tensor t) { put(activations_, stage, i, std::move(t)); }
  void put_gradient(int64_t stage, int64_t i, torch::Tensor t) { put(gradients_, stage, i, std::move(t)); }
  /// The tensor, or nullopt when the step failed elsewhere.
  std::optional<torch::Tensor> take_activation(int64_t stage, int64_t i) { return take(activations_, stage, i); }
  std::optional<torch::Tensor> take_gradient(int64_t stage, int64_t i) { return take(gradients_, stage, i); }

  /// Records the first failure and wakes every waiting stage.
  void fail(std::string message) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (!failure_) failure_ = std::move(message);
    }
    cv_.notify_all();
  }
  std::optional<std::string> failure() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return failure_;
  }

 private:
  using Slots = std::vector<std::vector<std::optional<torch::Tensor>>>;
  void put(Slots& slots, int64_t stage, int64_t i, torch::Tensor t) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      slots[static_cast<size_t>(stage)][static_cast<size_t>(i)] = std::move(t);
    }
    cv_.notify_all();
  }
  std::optional<torch::Tensor> take(Slots& slots, int64_t stage, int64_t i) {
    std::unique_lock<std::mutex> lock(mutex_);
    auto& slot = slots[static_cast<size_t>(stage)][static_cast<size_t>(i)];
    cv_.wait(lock, [&] { return slot.has_value() || failure_.has_value(); });
    if (!slot) return std::nullopt;
    torch::Tensor t = std::move(*slot);
    slot.reset();
    return t;
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  Slots activations_;
  Slots gradients_;
  std::optional<std::string> failure_;
};

/// Row ranges of torch.chunk(rows, chunks).
std::vector<std::pair<int64_t, int64_t>> chunk_rows(int64_t rows, int64_t chunks) {
  const int64_t size = (rows + chunks - 1) / chunks;
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t begin = 0; begin < rows; begin += size) out.emplace_back(begin, std::min(rows, begin + size));
  return out;
}

}  // namespace

const char* to_string(PipelineSchedule schedule) {
  switch (schedule) {
    case PipelineSchedule::kGPipe:
      return "gpipe";
    case PipelineSchedule::k1F1B:
      return "1f1b";
  }
  return "?";
}

PipelineSchedule parse_pipeline_schedule(const std::string& text) {
  const std::string name = to_lower(trim(text));
  if (name == "gpipe") return PipelineSchedule::kGPipe;
  if (name == "1f1b") return PipelineSchedule::k1F1B;
  throw Error(fmt::format("pipeline_schedule='{}' is not supported; supported: 'gpipe', '1f1b'. HINT: 'gpipe' runs "
                          "every forward before the backwards; '1f1b' keeps fewer activations alive.",
                          text));
}

double PipelineStepStats::bubble() const {
  if (busy.empty() || seconds <= 0) return 0;
  double sum = 0;
  for (const double b : busy) sum += b;
  return 1.0 - sum / (static_cast<double>(busy.size()) * seconds);
}

Pipeline::Pipeline(const torch::nn::Sequential& layers, std::vector<int64_t> balance,
                   std::vector<torch::Device> devices)
    : balance_(std::move(balance)), devices_(std::move(devices)) {
  check_balance(balance_, static_cast<int64_t>(layers->size()));
  VOLT_CHECK(devices_.size() == balance_.size(),
             "a pipeline of {} stages needs one device per stage; got {}. HINT: pass as many devices as balance has "
             "entries.",
             balance_.size(), devices_.size());
  auto it = layers->begin();
  for (size_t s = 0; s < balance_.size(); ++s) {
    torch::nn::Sequential stage;
    for (int64_t i = 0; i < balance_[s]; ++i, ++it) stage->push_back(*it);
    stage->to(devices_[s]);
    stages_.push_back(stage);
  }
}

torch::Tensor Pipeline::train_step(const torch::Tensor& input, int64_t chunks, PipelineSchedule schedule,
                                   const MicroBatchLoss& loss, PipelineStepStats* stats) {
  VOLT_CHECK(chunks >= 1, "pipeline_chunks={} must be >= 1. HINT: 1 runs the batch whole.", chunks);
  VOLT_CHECK(input.dim() >= 1 && input.size(0) >= 1, "a pipeline step needs a batch with rows; got shape {}.",
             c10::str(input.sizes()));
  const std::vector<std::pair<int64_t, int64_t>> rows = chunk_rows(input.size(0), chunks);
  const auto m = static_cast<int64_t>(rows.size());
  const int64_t k = stages();
  Exchange exchange(k, m);
  for (int64_t i = 0; i < m; ++i) {
    exchange.put_activation(0, i, input.narrow(0, rows[i].first, rows[i].second - rows[i].first));
  }
  std::vector<torch::Tensor> losses(static_cast<size_t>(m));
  std::vector<double> busy(static_cast<size_t>(k), 0.0);
  const auto start = Clock::now();
  const auto run_stage = [&](int64_t s) {
    const torch::Device device = devices_[static_cast<size_t>(s)];
    std::vector<torch::Tensor> inputs(static_cast<size_t>(m));
    std::vector<torch::Tensor> outputs(static_cast<size_t>(m));
    for (const Op& op : stage_ops(schedule, s, k, m)) {
      const auto i = static_cast<size_t>(op.micro_batch);
      std::optional<torch::Tensor> received =
          op.forward ? exchange.take_activation(s, op.micro_batch) : (s + 1 < k ? exchange.take_gradient(s, op.micro_batch)
                                                                              : std::optional<torch::Tensor>(torch::Tensor()));
      if (!received) return;  // another stage failed
      const auto began = Clock::now();
      try {
        if (op.forward) {
          torch::Tensor x = received->to(device);
          // A stage's backward ends at its own input: a leaf that receives the gradient to send back.
          if (s > 0 && x.is_floating_point()) x = x.detach().requires_grad_(true);
          inputs[i] = x;
          outputs[i] = stages_[static_cast<size_t>(s)]->forward(x);
          if (s + 1 < k) {
            exchange.put_activation(s + 1, op.micro_batch, outputs[i]);
          } else {
            losses[i] = loss(outputs[i], rows[i].first, rows[i].second);
          }
        } else {
          if (s + 1 == k) {
            if (losses[i].requires_grad()) torch::autograd::backward({losses[i]});
          } else if (outputs[i].requires_grad()) {
            torch::autograd::backward({outputs[i]}, {received->to(device)});
          }
          if (s > 0) {
            const torch::Tensor& grad = inputs[i].grad();
            exchange.put_gradient(s - 1, op.micro_batch, grad.defined() ? grad : torch::zeros_like(inputs[i]));
          }
          inputs[i] = torch::Tensor();
          outputs[i] = torch::Tensor();
        }
      } catch (const std::exception& e) {
        int64_t first = 0;
        for (int64_t t = 0; t < s; ++t) first += balance_[static_cast<size_t>(t)];
        exchange.fail(fmt::format("pipeline stage {} (layers {}-{}) failed in the {} pass of micro-batch {} of {}: {}", s,
                                  first, first + balance_[static_cast<size_t>(s)] - 1,
                                  op.forward ? "forward" : "backward", op.micro_batch, m, e.what()));
        return;
      }
      busy[static_cast<size_t>(s)] += std::chrono::duration<double>(Clock::now() - began).count();
    }
  };
  std::vector<std::thread> threads;
  for (int64_t s = 0; s < k; ++s) threads.emplace_back(run_stage, s);
  for (std::thread& t : threads) t.join();
  if (const auto failure = exchange.failure()) {
    throw Error(*failure + ". HINT: the error is the stage's own; the other stages stopped without finishing the step.");
  }
  if (stats != nullptr) {
    stats->seconds = std::chrono::duration<double>(Clock::now() - start).count();
    stats->busy = busy;
  }
  torch::Tensor total = losses[0].detach();
  for (size_t i = 1; i < losses.size(); ++i) total = total + losses[i].detach();
  return total;
}

torch::Tensor Pipeline::forward(const torch::Tensor& input, int64_t chunks) {
  VOLT_CHECK(chunks >= 1, "pipeline_chunks={} must be >= 1. HINT: 1 runs the batch whole.", chunks);
  const std::vector<std::pair<int64_t, int64_t>> rows = chunk_rows(input.size(0), chunks);
  const auto m = static_cast<int64_t>(rows.size());
  const int64_t k = stages();
  Exchange exchange(k + 1, m);  // the last slot row collects the outputs
  for (int64_t i = 0; i < m; ++i) {
    exchange.put_activation(0, i, input.narrow(0, rows[i].first, rows[i].second - rows[i].first));
  }
  const auto run_stage = [&](int64_t s) {
    const torch::NoGradGuard no_grad;  // grad mode is per thread
    for (int64_t i = 0; i < m; ++i) {
      std::optional<torch::Tensor> x = exchange.take_activation(s, i);
      if (!x) return;
      try {
        exchange.put_activation(s + 1, i, stages_[static_cast<size_t>(s)]->forward(x->to(devices_[static_cast<size_t>(s)])));
      } catch (const std::exception& e) {
        exchange.fail(fmt::format("pipeline stage {} failed in the forward pass of micro-batch {} of {}: {}", s, i, m,
                                  e.what()));
        return;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int64_t s = 0; s < k; ++s) threads.emplace_back(run_stage, s);
  for (std::thread& t : threads) t.join();
  if (const auto failure = exchange.failure()) throw Error(*failure);
  std::vector<torch::Tensor> outputs;
  for (int64_t i = 0; i < m; ++i) outputs.push_back(*exchange.take_activation(k, i));
  return torch::cat(outputs);
}

}  // namespace volt
