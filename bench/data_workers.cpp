// What loader worker threads buy when making a batch is slow.
//
// The same MLP (784-256-256-10, Adam, batch 64, 1 intra-op thread) trains on the same synthetic
// data three ways, interleaved per repetition so machine noise hits all alike:
//   in_memory   the data is a TensorDataset: a batch is one gather (the baseline step)
//   slow_w0     every batch first sleeps `--sleep-ms` (4 ms: a decode, a read), 0 workers: the
//               step's thread waits for it, so a step costs about baseline + 4 ms
//   slow_wN     the same dataset with `--workers` threads (4) making batches ahead
// It prints each contender's median step time and its ratio to in_memory (target for slow_wN:
// within 5%), and the time from the start of a pass to its first batch with 0 and N workers.
// Every contender ends with the same parameters (exit 1 otherwise): workers change when a batch
// is made, never what it holds.
//
//   bench_data_workers                        # 400 steps x 3 repetitions
//   bench_data_workers --steps 40 --repeats 1 # what CTest runs
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <iomanip>
#include <iostream>
#include <map>
#include <thread>
#include <vector>

#include "bench_mlp.h"
#include "bench_stats.h"
#include "volt/volt.h"

namespace {

using Clock = std::chrono::steady_clock;
using volt::bench::median;

/// A dataset whose batches take `sleep` to make, on top of the gather.
class SlowDataset : public volt::TensorDataset {
 public:
  SlowDataset(torch::Tensor x, torch::Tensor y, std::chrono::microseconds sleep)
      : volt::TensorDataset(std::move(x), std::move(y)), sleep_(sleep) {}
  volt::Batch get_batch(const torch::Tensor& indices) const override {
    std::this_thread::sleep_for(sleep_);
    return volt::TensorDataset::get_batch(indices);
  }

 private:
  std::chrono::microseconds sleep_;
};

struct Outcome {
  double step_ms = 0;
  std::vector<torch::Tensor> parameters;
};

Outcome train(std::shared_ptr<const volt::Dataset> data, int64_t workers, int64_t steps, int64_t warmup) {
  torch::manual_seed(0);  // the same initial weights for every contender
  volt::bench::BenchMlp model(std::move(data), {.batch_size = 64, .shuffle = true, .num_workers = workers});
  const auto stamps = volt::bench::time_steps(model, steps);
  std::vector<double> gaps;
  for (size_t i = static_cast<size_t>(warmup) + 1; i < stamps.size(); ++i)
    gaps.push_back(std::chrono::duration<double, std::milli>(stamps[i] - stamps[i - 1]).count());
  std::sort(gaps.begin(), gaps.end());
  Outcome out;
  out.step_ms = gaps.empty() ? 0 : gaps[gaps.size() / 2];
  for (const auto& p : model.parameters()) out.parameters.push_back(p.detach().clone());
  return out;
}

/// Milliseconds from the start of a pass to its first batch.
double first_batch_ms(const std::shared_ptr<const volt::Dataset>& data, int64_t workers) {
  volt::DataLoader loader(data, {.batch_size = 64, .num_workers = workers});
  loader.set_epoch(0);
  const auto start = Clock::now();
  volt::BatchStream stream = loader.stream(0, loader.num_batches());
  stream.next();
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Step time with slow batches, with and without loader workers", "bench_data_workers");
  int64_t steps = 400;
  int64_t warmup = 20;
  int64_t repeats = 3;
  int64_t workers = 4;
  double sleep_ms = 4.0;
  app.add_option("--steps", steps, "optimizer steps per run")->capture_default_str();
  app.add_option("--warmup", warmup, "steps left out of the median")->capture_default_str();
  app.add_option("--repeats", repeats, "repetitions of the three runs")->capture_default_str();
  app.add_option("--workers", workers, "worker threads of slow_wN")->capture_default_str();
  app.add_option("--sleep-ms", sleep_ms, "time to make one slow batch")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({64 * 200, 784});
  const torch::Tensor y = torch::randint(0, 10, {64 * 200});
  const auto fast = std::make_shared<volt::TensorDataset>(x, y);
  const auto slow =
      std::make_shared<SlowDataset>(x, y, std::chrono::microseconds(static_cast<int64_t>(sleep_ms * 1000)));
  const std::string slow_n = "slow_w" + std::to_string(workers);
  const std::vector<std::string> names = {"in_memory", "slow_w0", slow_n};

  std::map<std::string, std::vector<double>> times;
  std::vector<torch::Tensor> reference;
  for (int64_t r = 0; r < repeats; ++r) {
    for (size_t k = 0; k < names.size(); ++k) {
      const std::string& name = names[(k + static_cast<size_t>(r)) % names.size()];
      const Outcome outcome = name == "in_memory" ? train(fast, 0, steps, warmup)
                              : name == "slow_w0" ? train(slow, 0, steps, warmup)
                                                  : train(slow, workers, steps, warmup);
      times[name].push_back(outcome.step_ms);
      if (reference.empty()) reference = outcome.parameters;
      for (size_t i = 0; i < reference.size(); ++i) {
        if (!torch::equal(reference[i], outcome.parameters[i])) {
          std::cerr << name << " ended with other parameters than the first run\n";
          return 1;
        }
      }
    }
  }
  const double base = median(times["in_memory"]);
  std::cout << std::fixed << std::setprecision(3);
  for (const std::string& name : names) {
    std::cout << name << " step_ms=" << median(times[name]) << " ratio=" << median(times[name]) / base << "\n";
  }
  std::cout << "first_batch_ms workers=0 " << first_batch_ms(slow, 0) << " workers=" << workers << " "
            << first_batch_ms(slow, workers) << "\n";
  std::cout << "same parameters in every run: yes\n";
  return 0;
}
