// Volt's side of the ddp benchmark (bench/ddp_vs_pytorch.sh runs it against PyTorch's own
// DistributedDataParallel, bench/fsdp_vs_ddp.sh against itself under --strategy fsdp): the MLP
// 784-256-256-10 on Fashion-MNIST, Adam, batch 64 per process, 1 thread per process. Rank 0
// prints the steady-state time per step; every rank prints the bytes it holds for training.
#include <chrono>
#include <iostream>

#include "bench_mlp.h"
#include "volt/cli/trainer_flags.h"
#include "volt/core/error.h"
#include "volt/datasets/fashion_mnist.h"
#include "volt/strategies/fsdp_strategy.h"
#include "volt/volt.h"

namespace {

/// Prints what this process held for the parameters, their gradients and the optimizer state
/// after the last step (between steps: whole gradients under ddp, shards under fsdp; full_shard's
/// units are made whole again for a checkpoint at the end of training, so not read then).
class MemoryReport : public volt::Callback {
 public:
  std::string state_key() const override { return "MemoryReport"; }
  volt::Decision on_train_batch_end(const volt::CallbackContext& context, volt::CallbackServices&) override {
    memory_ = volt::training_memory(*context.module, *context.optimizers);
    return {};
  }
  volt::Decision on_train_end(const volt::CallbackContext& context, volt::CallbackServices&) override {
    std::cout << "memory rank=" << context.module->global_rank() << " parameters=" << memory_.parameters
              << " gradients=" << memory_.gradients << " optimizer_state=" << memory_.optimizer_state << "\n"
              << std::flush;
    return {};
  }

 private:
  volt::TrainingMemory memory_;
};

}  // namespace

int main(int argc, char** argv) {
  return volt::run_main([&] {
    CLI::App app("Volt ddp throughput (one side of bench/ddp_vs_pytorch.sh)", "bench_ddp_throughput");
    volt::TrainerOptions options = volt::bench::bare_trainer_options();
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
    options.callbacks.push_back(std::make_shared<MemoryReport>());
    volt::Trainer trainer(options);
    const auto train = volt::datasets::load_fashion_mnist(data_dir, volt::datasets::Split::kTrain);
    volt::bench::BenchMlp model(std::make_shared<volt::TensorDataset>(train.images, train.labels),
                                {.batch_size = 64, .shuffle = true},
                                /*fsdp_units=*/options.sharding_strategy == volt::ShardingStrategy::kFullShard);
    const volt::FitResult result = trainer.fit(model);
    trainer.teardown();
    if (!trainer.plan().is_global_zero()) return 0;
    const double per_step_ms = volt::bench::steady_step_ms(clock->stamps, warmup);
    std::cout << "volt processes=" << trainer.plan().topology.world_size << " step_ms=" << per_step_ms
              << " samples_per_s=" << 64.0 * trainer.plan().topology.world_size * 1000.0 / per_step_ms
              << " steps=" << result.global_step << "\n";
    return 0;
  });
}
