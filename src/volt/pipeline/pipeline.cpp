#include "volt/pipeline/pipeline.h"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <c10/core/DeviceGuard.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "volt/base/autograd_compat.h"
#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/pipeline/balance.h"

namespace volt {

namespace {

using Clock = std::chrono::steady_clock;

/// The ops stage `s` of `k` runs for `m` micro-batches, in order.
std::vector<Pipeline::Op> stage_ops(PipelineSchedule schedule, int64_t s, int64_t k, int64_t m) {
  std::vector<Pipeline::Op> ops;
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

/// What one pipelined pass keeps between its forward and backward phases.
struct Pipeline::Run {
  std::vector<std::pair<int64_t, int64_t>> rows;    // each micro-batch's rows of the batch
  std::vector<std::vector<torch::Tensor>> inputs;   // [stage][micro-batch]: what the stage ran on
  std::vector<std::vector<torch::Tensor>> outputs;  // [stage][micro-batch]: what it produced
  std::vector<torch::Tensor> losses;                // the last stage's, under train_step
  std::vector<torch::Tensor> seeds;                 // the output gradients, under forward_with_graph
  std::vector<torch::Tensor> input_grads;           // stage 0's input gradients, when it needs them
  std::vector<double> busy;                         // seconds each stage computed
  int64_t micro_batches() const { return static_cast<int64_t>(rows.size()); }
};

namespace {

/// The backward of forward_with_graph's output: every micro-batch's backward pass on the stage
/// threads (GPipe's drain), seeded with the output's gradient; returns the input's gradient.
class PipelineBackward : public torch::autograd::Node {
 public:
  explicit PipelineBackward(std::function<torch::Tensor(const torch::Tensor&)> backward)
      : backward_(std::move(backward)) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    return {backward_(grads.at(0))};
  }
  std::string name() const override { return "volt::PipelineBackward"; }

 private:
  std::function<torch::Tensor(const torch::Tensor&)> backward_;
};

}  // namespace

std::shared_ptr<Pipeline::Run> Pipeline::start(const torch::Tensor& input, int64_t chunks) const {
  VOLT_CHECK(chunks >= 1, "pipeline_chunks={} must be >= 1. HINT: 1 runs the batch whole.", chunks);
  VOLT_CHECK(input.dim() >= 1 && input.size(0) >= 1,
             "a pipeline step needs a batch with rows; got shape {}. HINT: the pipeline splits the batch along its "
             "first dimension; check that the data loader yields batches of at least one example.",
             c10::str(input.sizes()));
  auto run = std::make_shared<Run>();
  run->rows = chunk_rows(input.size(0), chunks);
  const auto k = static_cast<size_t>(stages());
  const auto m = static_cast<size_t>(run->micro_batches());
  run->inputs.assign(k, std::vector<torch::Tensor>(m));
  run->outputs = run->inputs;
  run->losses.resize(m);
  run->input_grads.resize(m);
  run->busy.assign(k, 0.0);
  return run;
}

void Pipeline::execute(Run& run, const torch::Tensor& input, const std::function<std::vector<Op>(int64_t)>& ops,
                       const MicroBatchLoss* loss) {
  const int64_t m = run.micro_batches();
  const int64_t k = stages();
  Exchange exchange(k, m);
  if (input.defined()) {
    for (int64_t i = 0; i < m; ++i) {
      const auto [begin, end] = run.rows[static_cast<size_t>(i)];
      exchange.put_activation(0, i, input.narrow(0, begin, end - begin));
    }
  }
  // Grad mode, autocast and dispatch keys are per thread: the stages run under the caller's.
  const at::ThreadLocalState caller_state;
  const auto run_stage = [&](int64_t s) {
    const at::ThreadLocalStateGuard state(caller_state);
    // A new thread's OpenMP starts with a team per core: give it the process's intra-op threads
    // (set_num_threads), as LibTorch's own worker threads do, or every step would make new teams.
    at::init_num_threads();
    const torch::Device device = devices_[static_cast<size_t>(s)];
    // The current CUDA device is per thread and not part of ThreadLocalState.
    std::optional<c10::DeviceGuard> device_guard;
    if (!device.is_cpu()) device_guard.emplace(device);
    std::vector<torch::Tensor>& inputs = run.inputs[static_cast<size_t>(s)];
    std::vector<torch::Tensor>& outputs = run.outputs[static_cast<size_t>(s)];
    const bool last = s + 1 == k;
    for (const Op& op : ops(s)) {
      const auto i = static_cast<size_t>(op.micro_batch);
      std::optional<torch::Tensor> received;
      if (op.forward) {
        received = exchange.take_activation(s, op.micro_batch);
      } else if (!last) {
        received = exchange.take_gradient(s, op.micro_batch);
      } else {
        received = torch::Tensor();
      }
      if (!received) return;  // another stage failed
      const auto began = Clock::now();
      try {
        if (op.forward) {
          torch::Tensor x = received->to(device);
          // A stage's backward ends at its own input: a leaf that receives the gradient to send back.
          if (x.is_floating_point() && torch::GradMode::is_enabled() && (s > 0 || x.requires_grad())) {
            x = x.detach().requires_grad_(true);
          }
          inputs[i] = x;
          outputs[i] = stages_[static_cast<size_t>(s)]->forward(x);
          if (!last) {
            exchange.put_activation(s + 1, op.micro_batch, outputs[i]);
          } else if (loss != nullptr) {
            const auto [begin, end] = run.rows[i];
            run.losses[i] = (*loss)(outputs[i], begin, end);
          }
        } else {
          if (last && loss != nullptr) {
            if (run.losses[i].requires_grad()) torch::autograd::backward({run.losses[i]});
          } else if (outputs[i].requires_grad()) {
            const torch::Tensor& seed = last ? run.seeds[i] : *received;
            torch::autograd::backward({outputs[i]}, {seed.to(device)});
          }
          if (inputs[i].requires_grad()) {
            const torch::Tensor& grad = inputs[i].grad();
            const torch::Tensor sent = grad.defined() ? grad : torch::zeros_like(inputs[i]);
            if (s > 0) {
              exchange.put_gradient(s - 1, op.micro_batch, sent);
            } else {
              run.input_grads[i] = sent;
            }
          } else if (s > 0) {
            exchange.put_gradient(s - 1, op.micro_batch, torch::zeros_like(inputs[i]));
          }
          inputs[i] = torch::Tensor();
          outputs[i] = torch::Tensor();
        }
      } catch (const std::exception& e) {
        int64_t first = 0;
        for (int64_t t = 0; t < s; ++t) first += balance_[static_cast<size_t>(t)];
        exchange.fail(fmt::format("pipeline stage {} (layers {}-{}) failed in the {} pass of micro-batch {} of {}: {}",
                                  s, first, first + balance_[static_cast<size_t>(s)] - 1,
                                  op.forward ? "forward" : "backward", op.micro_batch, m, e.what()));
        return;
      }
      run.busy[static_cast<size_t>(s)] += std::chrono::duration<double>(Clock::now() - began).count();
    }
  };
  std::vector<std::thread> threads;
  for (int64_t s = 0; s < k; ++s) threads.emplace_back(run_stage, s);
  for (std::thread& t : threads) t.join();
  if (const auto failure = exchange.failure()) {
    throw Error(*failure +
                ". HINT: the error is the stage's own; the other stages stopped without finishing the step.");
  }
}

torch::Tensor Pipeline::train_step(const torch::Tensor& input, int64_t chunks, PipelineSchedule schedule,
                                   const MicroBatchLoss& loss, PipelineStepStats* stats) {
  const std::shared_ptr<Run> run = start(input, chunks);
  const int64_t k = stages();
  const int64_t m = run->micro_batches();
  const auto began = Clock::now();
  execute(
      *run, input, [&](int64_t s) { return stage_ops(schedule, s, k, m); }, &loss);
  if (stats != nullptr) {
    stats->seconds = std::chrono::duration<double>(Clock::now() - began).count();
    stats->busy = run->busy;
  }
  torch::Tensor total = run->losses[0].detach();
  for (size_t i = 1; i < run->losses.size(); ++i) total = total + run->losses[i].detach();
  return total;
}

torch::Tensor Pipeline::forward_with_graph(const torch::Tensor& input, int64_t chunks) {
  const std::shared_ptr<Run> run = start(input, chunks);
  const int64_t m = run->micro_batches();
  const auto forwards = [m](int64_t) {
    std::vector<Op> ops;
    for (int64_t i = 0; i < m; ++i) ops.push_back({true, i});
    return ops;
  };
  execute(*run, input, forwards, nullptr);
  const int64_t k = stages();
  std::vector<torch::Tensor> outputs;
  for (const torch::Tensor& out : run->outputs[static_cast<size_t>(k - 1)]) outputs.push_back(out.detach());
  torch::Tensor output = torch::cat(outputs);
  if (!torch::GradMode::is_enabled()) return output;
  const bool input_grad = input.requires_grad();
  // The graph holds the run until its backward (or until it is dropped unused).
  auto node = compat::make_autograd_node<PipelineBackward>([this, run, m, input_grad](const torch::Tensor& grad) {
    for (int64_t i = 0; i < m; ++i) {
      const auto [begin, end] = run->rows[static_cast<size_t>(i)];
      run->seeds.push_back(grad.narrow(0, begin, end - begin));
    }
    const auto drain = [m](int64_t) {
      std::vector<Op> ops;
      for (int64_t i = m - 1; i >= 0; --i) ops.push_back({false, i});
      return ops;
    };
    execute(*run, torch::Tensor(), drain, nullptr);
    run->seeds.clear();
    return input_grad ? torch::cat(run->input_grads) : torch::Tensor();
  });
  node->set_next_edges(torch::autograd::collect_next_edges(input));
  torch::autograd::set_history(output, node);
  return output;
}

torch::Tensor Pipeline::forward(const torch::Tensor& input, int64_t chunks) {
  const torch::NoGradGuard no_grad;  // the stages take the caller's grad mode
  return forward_with_graph(input, chunks);
}

}  // namespace volt
