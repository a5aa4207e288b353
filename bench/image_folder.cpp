// Volt's side of bench/image_folder_vs_pytorch.sh: trains the MLP (784-256-256-10, Adam 1e-3,
// batch 64, shuffled, 1 intra-op thread) on a PNG image folder decoded per batch by
// volt::datasets::ImageFolder with `--workers` loader threads, and prints samples per second over
// the steps after `--warmup`, the time to the first step, and the process's peak RSS.
//
//   bench_image_folder --folder /tmp/fashion-png/train --workers 2 --steps 300
#include "volt/datasets/image_folder.h"

#include <sys/resource.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <iomanip>
#include <iostream>

#include "bench_mlp.h"
#include "volt/datasets/fashion_mnist.h"
#include "volt/volt.h"

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Training throughput from a PNG image folder", "bench_image_folder");
  std::string folder;
  int64_t workers = 2;
  int64_t steps = 300;
  int64_t warmup = 20;
  app.add_option("--folder", folder, "the image folder (one subfolder per class)")->required();
  app.add_option("--workers", workers, "loader worker threads")->capture_default_str();
  app.add_option("--steps", steps, "optimizer steps")->capture_default_str();
  app.add_option("--warmup", warmup, "steps left out of the throughput")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const auto start = Clock::now();
  volt::datasets::ImageFolderOptions options{
      .channels = 1,
      .transform = volt::datasets::normalize({volt::datasets::kFashionMnistMean}, {volt::datasets::kFashionMnistStd})};
  auto data = std::make_shared<volt::datasets::ImageFolder>(folder, options);
  torch::manual_seed(0);
  volt::bench::BenchMlp model(data, {.batch_size = 64, .shuffle = true, .num_workers = workers});
  const auto stamps = volt::bench::time_steps(model, steps);
  const auto& t = stamps;
  const double seconds =
      std::chrono::duration<double>(t.back() - t[static_cast<size_t>(std::min<int64_t>(warmup, steps - 1))]).count();
  const double samples = 64.0 * static_cast<double>(steps - 1 - std::min<int64_t>(warmup, steps - 1));
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::cout << std::fixed << std::setprecision(1) << "volt workers=" << workers
            << " samples_per_s=" << samples / seconds
            << " first_step_ms=" << std::chrono::duration<double, std::milli>(t.front() - start).count()
            << " peak_rss_mb=" << static_cast<double>(usage.ru_maxrss) / 1024.0 << "\n";
  return 0;
}
