// The main job: trains, validates and tests an MLP or CNN on Fashion-MNIST.
//
//   fashion_mnist --model cnn --max-epochs 3
//   fashion_mnist --model mlp --max-epochs 3 --limit-train-batches 0.1 --seed 1
//   fashion_mnist --config run.yaml --max-epochs 1    (run.yaml: `fashion_mnist --print-config`)
//   fashion_mnist --no-train --weights model.ckpt      (test weights from Volt, Lightning or torch.save)
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <utility>

#include "fashion_mnist/fashion_mnist_module.h"
#include "volt/checkpoint/checkpoint_state.h"
#include "volt/cli/cli_config.h"
#include "volt/cli/trainer_flags.h"
#include "volt/core/error.h"

int main(int argc, char** argv) {
  return volt::run_main([&] {
    CLI::App app("Train a classifier on Fashion-MNIST with Volt.", "fashion_mnist");
    fashion_mnist::ModuleOptions module_options;
    volt::TrainerOptions trainer_options;
    trainer_options.max_epochs = 3;
    volt::TrainerFlagText flag_text;
    volt::add_trainer_flags(app, trainer_options, flag_text);
    // The groups are the config file's sections: `model:` and `data:` (LightningCLI's layout).
    app.add_option("--model", module_options.model, "mlp or cnn")->capture_default_str()->group("Model");
    app.add_option("--lr", module_options.lr, "Adam's learning rate")->capture_default_str()->group("Model");
    app.add_option("--lr-gamma", module_options.lr_gamma, "StepLR decay per epoch (1.0: constant)")
        ->capture_default_str()
        ->group("Model");
    app.add_option("--hidden", module_options.hidden, "MLP hidden width")->capture_default_str()->group("Model");
    app.add_option("--batch-size", module_options.batch_size, "examples per batch")
        ->capture_default_str()
        ->group("Data");
    app.add_option("--val-size", module_options.val_size, "training images held out for validation")
        ->capture_default_str()
        ->group("Data");
    app.add_option("--data-dir", module_options.data_dir,
                   "directory of the IDX files, or of train/ and test/ image folders or .npy shards")
        ->capture_default_str()
        ->group("Data");
    app.add_option("--num-workers", module_options.num_workers, "threads that make batches ahead of the step")
        ->capture_default_str()
        ->group("Data");
    app.add_flag("--pin-memory", module_options.pin_memory, "page-lock training batches for the copy to a GPU")
        ->group("Data");
    app.add_option("--examples-per-shard", module_options.examples_per_shard,
                   "with .npy shards: examples per shard, the unit dealt to processes and workers")
        ->capture_default_str()
        ->check(CLI::PositiveNumber)
        ->group("Data");
    app.add_flag("--skip-unreadable-images", module_options.skip_unreadable,
                 "with an image folder: leave out files that cannot be decoded (reported at the end)")
        ->group("Data");
    int64_t save_top_k = 1;
    app.add_option("--save-top-k", save_top_k, "best checkpoints to keep by val/acc")->capture_default_str();
    bool save_weights_only = false;
    app.add_flag("--save-weights-only", save_weights_only,
                 "checkpoints hold only the weights (smaller; --weights loads them, --ckpt-path cannot resume)");
    int64_t patience = 0;
    app.add_option("--early-stopping-patience", patience, "stop when val/loss stalls this many epochs (0: off)");
    bool throughput = false;
    app.add_flag("--throughput-monitor", throughput,
                 "log samples/s and batches/s every log_every_n_steps batches (ThroughputMonitor)");
    bool device_stats = false;
    app.add_flag("--device-stats-monitor", device_stats,
                 "log memory and CPU share every log_every_n_steps batches (DeviceStatsMonitor)");
    bool auto_lr_find = false;
    app.add_flag("--auto-lr-find", auto_lr_find,
                 "before training, sweep the learning rate (Tuner::lr_find), train with the suggested one and write "
                 "lr_find.csv beside the logs (draw it: volt plot lr_find.csv --x lr --logx --metrics loss)");
    std::string auto_scale_batch_size;
    app.add_option("--auto-scale-batch-size", auto_scale_batch_size,
                   "before training, find the largest batch size that fits (Tuner::scale_batch_size): power or "
                   "binsearch")
        // Empty is what --print-config writes for "not given".
        ->check(CLI::Validator(
            [](std::string& text) {
              if (!text.empty()) (void)volt::parse_batch_size_mode(text);
              return std::string();
            },
            "power|binsearch"));
    double tune_max_memory_mb = 0;
    app.add_option("--tune-max-memory-mb", tune_max_memory_mb,
                   "--auto-scale-batch-size: the most memory (MiB) a batch may add; 0: until it runs out of memory "
                   "(on a CPU with plenty of memory: the whole data set)")
        ->check(CLI::NonNegativeNumber);
    bool skip_test = false;
    app.add_flag("--no-test", skip_test, "do not run the test set after training");
    std::string weights;
    app.add_option("--weights", weights,
                   "start from these weights only: a Volt or Lightning checkpoint, or a torch.save'd state_dict "
                   "(--ckpt-path resumes a whole run instead)");
    bool skip_training = false;
    app.add_flag("--no-train", skip_training, "only test the weights of --weights or --ckpt-path");
    bool print_plan = false;
    app.add_flag("--print-plan", print_plan, "print the resolved run plan and exit")->configurable(false);
    if (const std::optional<int> code = volt::parse_command_line(app, argc, argv)) return *code;
    volt::apply_trainer_flags(flag_text, trainer_options);
    // Saved beside the logs and in every checkpoint, so a run can be repeated from its folder.
    trainer_options.config = volt::resolved_config(app);
    // Without validation (--val-size 0, --limit-val-batches 0, .npy shards without val/) there
    // is no val/acc to rank by: keep the latest checkpoints instead of failing at the end of the
    // first epoch.
    const volt::BatchLimit& val_limit = trainer_options.limit_val_batches;
    const bool validates = fashion_mnist::has_validation_data(module_options) &&
                           (val_limit.is_fraction() ? val_limit.fraction() > 0 : val_limit.count() > 0);
    if (trainer_options.enable_checkpointing) {
      trainer_options.callbacks.push_back(std::make_shared<volt::ModelCheckpoint>(
          validates ? volt::ModelCheckpointOptions{.filename = "{epoch}-{step}-{val/acc:.4f}",
                                                   .monitor = "val/acc",
                                                   .mode = volt::Mode::kMax,
                                                   .save_top_k = save_top_k,
                                                   .save_last = true,
                                                   .save_weights_only = save_weights_only}
                    : volt::ModelCheckpointOptions{.filename = "{epoch}-{step}",
                                                   .save_top_k = std::min<int64_t>(save_top_k, 1),
                                                   .save_last = true,
                                                   .save_weights_only = save_weights_only}));
    }
    VOLT_CHECK(patience >= 0, "--early-stopping-patience={} must be >= 0 (0: off).", patience);
    if (patience > 0 && !validates) {
      throw volt::Error(
          "--early-stopping-patience needs validation, which --val-size 0, --limit-val-batches 0 or .npy "
          "shards without a val/ folder turn off. HINT: drop one of them, or add val/ shards.");
    }
    if (patience > 0) {
      trainer_options.callbacks.push_back(std::make_shared<volt::EarlyStopping>(
          volt::EarlyStoppingOptions{.monitor = "val/loss", .patience = patience}));
    }
    if (throughput) {
      trainer_options.callbacks.push_back(std::make_shared<volt::ThroughputMonitor>(
          volt::ThroughputMonitorOptions{.log_every_n_batches = trainer_options.log_every_n_steps}));
    }
    if (device_stats) {
      trainer_options.callbacks.push_back(std::make_shared<volt::DeviceStatsMonitor>(
          volt::DeviceStatsMonitorOptions{.log_every_n_batches = trainer_options.log_every_n_steps}));
    }
    volt::Trainer trainer(trainer_options);
    if (print_plan) {
      std::cout << trainer.plan().describe();
      return 0;
    }
    VOLT_CHECK(weights.empty() || trainer_options.ckpt_path.empty(),
               "--weights={} and --ckpt-path={} were both given. HINT: --ckpt-path resumes a whole run (weights, "
               "optimizer, epoch); --weights starts from weights only: pass one of them.",
               weights, trainer_options.ckpt_path);
    VOLT_CHECK(!skip_training || !skip_test, "--no-train and --no-test leave nothing to do. HINT: drop one of them.");
    // The Trainer seeded LibTorch (seed_everything), so the weights drawn here are reproducible.
    module_options.pipelined = trainer_options.strategy == volt::StrategyRequest::kPipeline;
    module_options.fsdp_units = trainer_options.sharding_strategy == volt::ShardingStrategy::kFullShard;
    fashion_mnist::FashionMnistModule model(module_options);
    if (!weights.empty()) volt::load_weights(model, weights);
    // The seed documents' auto_scale_batch_size and auto_lr_find, in Lightning's order (trainer.tune).
    if (!skip_training && (auto_lr_find || !auto_scale_batch_size.empty())) {
      volt::Tuner tuner(trainer_options);
      if (!auto_scale_batch_size.empty()) {
        const int64_t size = tuner.scale_batch_size(
            model,
            {.mode = volt::parse_batch_size_mode(auto_scale_batch_size),
             .set_batch_size = [&model](int64_t b) { model.set_batch_size(b); },
             .max_memory_mb = tune_max_memory_mb > 0 ? std::optional<double>(tune_max_memory_mb) : std::nullopt});
        std::cout << "auto_scale_batch_size: training with batch size " << size << "\n";
      }
      if (auto_lr_find) {
        const volt::LrFindResult found = tuner.lr_find(model);
        const std::filesystem::path csv = std::filesystem::path(trainer.plan().root_dir) / "lr_find.csv";
        std::filesystem::create_directories(csv.parent_path());
        std::ofstream(csv) << found.to_csv();
        VOLT_CHECK(found.suggestion().has_value(),
                   "--auto-lr-find found no learning rate: only {} steps had a finite loss (see {}). HINT: lower "
                   "the sweep's start or pass --lr yourself.",
                   found.loss.size(), csv.string());
        model.set_lr(*found.suggestion());
        std::cout << "auto_lr_find: training with lr " << *found.suggestion() << " (the sweep is in " << csv.string()
                  << "; draw it: volt plot " << csv.string() << " --x lr --logx --metrics loss --vline "
                  << *found.suggestion() << ")\n";
      }
    }
    if (skip_training) {
      // Lightning's trainer.test(model, ckpt_path=...): the weights of a checkpoint, or the ones
      // --weights loaded.
      VOLT_CHECK(!weights.empty() || !trainer_options.ckpt_path.empty(),
                 "--no-train tests a model as loaded, but neither --weights nor --ckpt-path was given. HINT: pass "
                 "--weights PATH (a checkpoint or a torch.save'd state_dict).");
      const volt::EvalResult test = trainer.test(model, {}, trainer_options.ckpt_path);
      if (trainer.plan().is_global_zero()) std::cout << test.report();
      trainer.teardown();
      return 0;
    }
    // --ckpt-path (TrainerOptions::ckpt_path) resumes fit only; test() below tests the model just
    // trained.
    const volt::FitResult result = trainer.fit(model);
    // SLURM is about to end this run and start the job again, which resumes from the HPC
    // checkpoint: testing now would only be cut off. Under --max-restarts this process only
    // supervised the workers, which ran the whole program.
    if (result.requeued() || result.supervised) {
      trainer.teardown();
      return 0;
    }
    // Under ddp every process runs this program; only rank 0 reports.
    const bool report = trainer.plan().is_global_zero();
    if (report) std::cout << result.full_report();
    if (!skip_test && result.reason != volt::StopReason::kInterrupted) {
      const volt::EvalResult test = trainer.test(model);
      if (report) std::cout << test.report();
    }
    if (const std::vector<std::string> skipped = model.skipped_images(); report && !skipped.empty()) {
      std::cout << "skipped " << skipped.size() << " unreadable image(s):\n";
      for (const std::string& why : skipped) std::cout << "  " << why << "\n";
    }
    if (report) std::cout << result.brief_report() << "\n";
    // A local rank this process launched that failed after the last collective is an error too.
    trainer.teardown();
    return result.reason == volt::StopReason::kInterrupted ? 130 : 0;
  });
}
