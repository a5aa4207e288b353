// The pipeline's schedule and balance, measured (volt::Pipeline, volt::balance_by_time):
//  1. the bubble: k equal stages and m micro-batches idle (k - 1) / (m + k - 1) of the time under
//     GPipe; printed measured against that, for k = 2, 3 and m = 1, 2, 4, 8;
//  2. balance "auto" on a model whose layer 2 is 8x slower than the others: the partition
//     profile_layers + balance_by_time choose, its slowest stage against the best of every
//     possible partition (by brute force over the measured costs), and its step time against
//     the equal-layer-count split.
// Layers sleep (forward and backward) instead of computing, so the stages overlap as they would
// on k devices however few cores this machine has.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <iostream>
#include <thread>

#include "volt/cli/run_main.h"
#include "volt/pipeline/balance.h"
#include "volt/pipeline/pipeline.h"

namespace {

/// y = x * w, sleeping `ms` in forward and again in backward.
struct Sleep : torch::autograd::Function<Sleep> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, double ms) {
    ctx->saved_data["ms"] = ms;
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ctx->saved_data["ms"].toDouble()));
    return {grad[0], torch::Tensor()};
  }
};

struct SleepLayerImpl : torch::nn::Module {
  explicit SleepLayerImpl(double ms) : ms(ms) { w = register_parameter("w", torch::ones({1})); }
  torch::Tensor forward(const torch::Tensor& x) {
    // Per row, so a micro-batch of r rows takes r / rows of the batch's time.
    return Sleep::apply(x * w, ms * static_cast<double>(x.size(0)) / kRows);
  }
  static constexpr double kRows = 64;
  double ms;
  torch::Tensor w;
};
TORCH_MODULE(SleepLayer);

torch::nn::Sequential sleepers(const std::vector<double>& ms) {
  torch::nn::Sequential model;
  for (const double m : ms) model->push_back(SleepLayer(m));
  return model;
}

double step_seconds(volt::Pipeline& pipeline, int64_t chunks, int repeats, double* bubble = nullptr) {
  const torch::Tensor x = torch::ones({static_cast<int64_t>(SleepLayerImpl::kRows), 4});
  std::vector<double> seconds;
  std::vector<double> bubbles;
  for (int r = 0; r < repeats; ++r) {
    volt::PipelineStepStats stats;
    pipeline.train_step(
        x, chunks, volt::PipelineSchedule::kGPipe, [](const torch::Tensor& out, int64_t, int64_t) { return out.sum(); },
        &stats);
    seconds.push_back(stats.seconds);
    bubbles.push_back(stats.bubble());
  }
  std::sort(seconds.begin(), seconds.end());
  std::sort(bubbles.begin(), bubbles.end());
  if (bubble != nullptr) *bubble = bubbles[bubbles.size() / 2];
  return seconds[seconds.size() / 2];
}

double slowest(const std::vector<volt::LayerCost>& costs, const std::vector<int64_t>& balance) {
  const std::vector<double> s = volt::stage_seconds(costs, balance);
  return *std::max_element(s.begin(), s.end());
}

}  // namespace

int main(int argc, char** argv) {
  return volt::run_main([&] {
    CLI::App app("Pipeline bubble and balance (volt::Pipeline)", "bench_pipeline_balance");
    int repeats = 5;
    double layer_ms = 4;
    app.add_option("--repeats", repeats, "steps per measurement (the median counts)");
    app.add_option("--layer-ms", layer_ms, "each layer's forward (and backward) time per batch");
    CLI11_PARSE(app, argc, argv);

    std::cout << "1. bubble, GPipe, k equal stages of 2 layers, m micro-batches\n";
    for (const int64_t k : {2, 3}) {
      torch::nn::Sequential model = sleepers(std::vector<double>(static_cast<size_t>(2 * k), layer_ms));
      volt::Pipeline pipeline(model, std::vector<int64_t>(static_cast<size_t>(k), 2),
                              std::vector<torch::Device>(static_cast<size_t>(k), torch::kCPU));
      for (const int64_t m : {1, 2, 4, 8}) {
        double bubble = 0;
        step_seconds(pipeline, m, repeats, &bubble);
        const double theory = static_cast<double>(k - 1) / static_cast<double>(m + k - 1);
        std::cout << fmt::format("bubble k={} m={} measured={:.3f} theory={:.3f} difference={:+.3f}\n", k, m, bubble,
                                 theory, bubble - theory);
      }
    }

    std::cout << "2. balance auto, 6 layers, layer 2 8x slower, 3 stages, 8 micro-batches\n";
    std::vector<double> ms(6, layer_ms);
    ms[2] = 8 * layer_ms;
    torch::nn::Sequential model = sleepers(ms);
    const std::vector<volt::LayerCost> costs = volt::profile_layers(model, torch::ones({64, 4}), 3);
    const std::vector<int64_t> chosen = volt::balance_by_time(costs, 3);
    double best = 1e300;
    std::vector<int64_t> best_balance;
    for (int64_t a = 1; a <= 4; ++a) {
      for (int64_t b = 1; a + b <= 5; ++b) {
        const std::vector<int64_t> candidate{a, b, 6 - a - b};
        if (slowest(costs, candidate) < best) {
          best = slowest(costs, candidate);
          best_balance = candidate;
        }
      }
    }
    std::cout << "auto: " << volt::describe_balance(costs, chosen) << "\n";
    std::cout << fmt::format("auto slowest stage / best possible = {:.3f} (best [{}])\n", slowest(costs, chosen) / best,
                             fmt::join(best_balance, ", "));
    volt::Pipeline balanced(model, chosen, std::vector<torch::Device>(3, torch::kCPU));
    const double auto_seconds = step_seconds(balanced, 8, repeats);
    volt::Pipeline even(model, {2, 2, 2}, std::vector<torch::Device>(3, torch::kCPU));
    const double even_seconds = step_seconds(even, 8, repeats);
    std::cout << fmt::format("step ms: auto [{}] {:.1f}, equal layer counts [2, 2, 2] {:.1f} -> auto {:.2f}x faster\n",
                             fmt::join(chosen, ", "), auto_seconds * 1000, even_seconds * 1000,
                             even_seconds / auto_seconds);
    return 0;
  });
}
