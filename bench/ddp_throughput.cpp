// Volt's side of the ddp benchmark (bench/ddp_vs_pytorch.sh runs it against PyTorch's own
// DistributedDataParallel): the MLP 784-256-256-10 on Fashion-MNIST, Adam, batch 64 per
// process, 1 thread per process. Rank 0 prints the steady-state time per step.
#include <chrono>
#include <iostream>

#include "bench_mlp.h"
#include "volt/cli/trainer_flags.h"
#include "volt/core/error.h"
#include "volt/datasets/fashion_mnist.h"
#include "volt/volt.h"

int main(int argc, char** argv) {
  return volt::run_main([&] {
    CLI::App app("Volt ddp throughput (one side of bench/ddp_vs_pytorch.sh)", "bench_ddp_throughput");
    volt::TrainerOptions options;
    options.enable_progress_bar = false;
    options.enable_model_summary = false;
    options.enable_checkpointing = false;
    options.logger = false;
    options.num_threads = 1;
    options.seed = 0;
    volt::TrainerFlagText text;
    volt::add_trainer_flags(app, options, text);
    int64_t warmup = 50;
    app.add_option("--warmup", warmup, "steps left out of the timing");
    std::string data_dir = volt::datasets::kFashionMnistDefaultDir;
    app.add_option("--data-dir", data_dir, "Fashion-MNIST IDX files");
    CLI11_PARSE(app, argc, argv);
    volt::apply_trainer_flags(text, options);
    auto clock = std::make_shared<volt::bench::StepClock>();
    options.callbacks.push_back(clock);
    volt::Trainer trainer(options);
    const auto train = volt::datasets::load_fashion_mnist(data_dir, volt::datasets::Split::kTrain);
    volt::bench::BenchMlp model(std::make_shared<volt::TensorDataset>(train.images, train.labels),
                                {.batch_size = 64, .shuffle = true});
    const volt::FitResult result = trainer.fit(model);
    trainer.teardown();
    const auto& t = clock->stamps;
    if (!trainer.plan().is_global_zero()) return 0;
    VOLT_CHECK(static_cast<int64_t>(t.size()) > warmup + 1, "ran {} steps; need more than --warmup={}", t.size(),
               warmup);
    const double seconds = std::chrono::duration<double>(t.back() - t[static_cast<size_t>(warmup)]).count();
    const double per_step_ms = 1000.0 * seconds / static_cast<double>(t.size() - 1 - static_cast<size_t>(warmup));
    std::cout << "volt processes=" << trainer.plan().topology.world_size << " step_ms=" << per_step_ms
              << " samples_per_s=" << 64.0 * trainer.plan().topology.world_size * 1000.0 / per_step_ms
              << " steps=" << result.global_step << "\n";
    return 0;
  });
}
