// What snapshots cost a run (issue #32, docs/failures.md): the example's GPT trained for --steps in
// one process, three ways, interleaved and repeated in this one run:
//   none   no checkpoint at all
//   async  a snapshot every --every steps (snapshot_every_n_steps: a copy to host memory at the
//          step's end, written by a background thread)
//   sync   a full checkpoint every --every steps written at once (ModelCheckpoint with
//          every_n_train_steps, keeping them all), what a run without snapshots would do
// It prints the median step time of each (min and max over the repeats), async's and sync's
// overhead against none, the stall per snapshot (the copy), and the synchronous save's time in
// steps. The target (issue #32): async within 2% of none where a synchronous save costs many steps.
// A --warmup past --every leaves the first snapshot out of the timing: it allocates the host buffers
// the later ones reuse (pinned for a GPU's tensors: 0.76 s for 1.5 GB on the first GPU machine), a
// cost a run pays once; its stall is printed apart.
// The stall's share of the steps between snapshots is the part of the overhead the training thread
// pays for certain; the medians add what the background write costs it (memory bandwidth, a core).
// Trainer flags (--accelerator gpu --devices 1 --precision bf16-mixed) apply to every contender:
// scripts/device/checks.sh runs it so on a GPU.
#include <algorithm>
#include <filesystem>
#include <iostream>

#include "bench_mlp.h"  // StepClock, steady_step_ms, bare_trainer_options
#include "bench_stats.h"
#include "crash_trace.h"
#include "gpt/gpt_module.h"
#include "volt/cli/trainer_flags.h"
#include "volt/core/error.h"
#include "volt/volt.h"

namespace {

using volt::bench::median;

enum class Contender { kNone, kAsync, kSync };

const char* name_of(Contender c) {
  switch (c) {
    case Contender::kNone:
      return "none";
    case Contender::kAsync:
      return "async";
    case Contender::kSync:
      return "sync";
  }
  return "?";
}

struct Outcome {
  double step_ms = 0.0;
  double final_loss = 0.0;
  volt::SnapshotStats snapshots;
};

/// The loss of the last step, to show that the contenders trained alike.
class LastLoss : public volt::Callback {
 public:
  std::string state_key() const override { return "LastLoss"; }
  volt::Decision on_train_batch_end(const volt::CallbackContext& context, volt::CallbackServices&) override {
    if (context.outputs != nullptr && context.outputs->defined()) loss = context.outputs->item<double>();
    return {};
  }
  double loss = 0.0;
};

Outcome run_one(Contender contender, const volt::TrainerOptions& base, const gpt::GptModuleOptions& module,
                int64_t steps, int64_t every, int64_t warmup, const std::filesystem::path& dir) {
  std::filesystem::remove_all(dir);
  volt::TrainerOptions options = base;
  options.max_steps = steps;
  options.default_root_dir = dir.string();
  auto clock = std::make_shared<volt::bench::StepClock>();
  auto last = std::make_shared<LastLoss>();
  options.callbacks = {clock, last};
  if (contender == Contender::kAsync) options.snapshot_every_n_steps = every;
  if (contender == Contender::kSync) {
    options.enable_checkpointing = true;
    volt::ModelCheckpointOptions checkpoints;
    checkpoints.dirpath = (dir / "sync").string();
    checkpoints.every_n_train_steps = every;
    checkpoints.save_top_k = -1;
    options.callbacks.push_back(std::make_shared<volt::ModelCheckpoint>(checkpoints));
  }
  volt::Trainer trainer(options);
  gpt::GptModule gpt_module(module);
  const volt::FitResult result = trainer.fit(gpt_module);
  trainer.teardown();
  std::filesystem::remove_all(dir);
  return Outcome{volt::bench::steady_step_ms(clock->stamps, warmup), last->loss, result.snapshots};
}

}  // namespace

int main(int argc, char** argv) {
  volt::bench::print_stack_on_crash();
  return volt::run_main([&] {
    CLI::App app("What snapshots cost: none, asynchronous snapshots and synchronous saves, interleaved",
                 "bench_snapshot_overhead");
    // The trainer flags (--accelerator gpu --devices 1 --precision bf16-mixed on a GPU machine)
    // apply to every contender; the steps, the checkpoints and the folder are the bench's own.
    volt::TrainerOptions base = volt::bench::bare_trainer_options();
    base.limit_val_batches = volt::BatchLimit(int64_t{0});
    volt::TrainerFlagText text;
    volt::add_trainer_flags(app, base, text);
    gpt::GptModuleOptions module;
    module.val_fraction = 0;
    module.sample.max_new_tokens = 0;
    module.warmup_steps = 10;
    gpt::GptConfig& model = module.model;
    // By default a model whose synchronous save costs many steps (issue #32's condition): 19 M
    // parameters (230 MB with Adam's moments), and a step of 8 tokens.
    model.n_layer = 6;
    model.n_head = 8;
    model.n_embd = 512;
    model.n_positions = 8;
    module.batch_size = 1;
    app.add_option("--n-layer", model.n_layer)->capture_default_str();
    app.add_option("--n-head", model.n_head)->capture_default_str();
    app.add_option("--n-embd", model.n_embd)->capture_default_str();
    app.add_option("--block-size", model.n_positions)->capture_default_str();
    app.add_option("--batch-size", module.batch_size)->capture_default_str();
    app.add_option("--text", module.text, "the text whose bytes are the tokens")->required();
    int64_t steps = 160;
    int64_t every = 50;
    int64_t warmup = 5;
    int64_t repeats = 5;
    std::string dir = (std::filesystem::temp_directory_path() / "volt-bench-snapshots").string();
    app.add_option("--steps", steps, "optimizer steps per run")->capture_default_str();
    app.add_option("--every", every, "steps between snapshots (and synchronous saves)")->capture_default_str();
    app.add_option("--warmup", warmup, "steps left out of the timing")->capture_default_str();
    app.add_option("--repeats", repeats, "runs of each contender, interleaved")->capture_default_str();
    app.add_option("--dir", dir, "where the checkpoints go (removed after each run)")->capture_default_str();
    CLI11_PARSE(app, argc, argv);
    volt::apply_trainer_flags(text, base);
    // The saves inside the timed steps (after --warmup, none at the last step). A warmup past the
    // first save leaves out its one-time cost: allocating the host buffers the later ones reuse.
    const int64_t saves = (steps - 1) / every - warmup / every;
    VOLT_CHECK(every >= 1 && warmup >= 0 && saves >= 1,
               "--warmup={} --every={} --steps={}: no save falls in the timed steps (after the warmup, before the "
               "last). HINT: e.g. --steps 160 --every 50 --warmup 10, or --steps 460 --every 150 --warmup 155 to "
               "leave the first snapshot out.",
               warmup, every, steps);

    const std::vector<Contender> contenders{Contender::kNone, Contender::kAsync, Contender::kSync};
    std::map<Contender, std::vector<double>> step_ms;
    std::map<Contender, double> loss;
    volt::SnapshotStats stats;
    for (int64_t r = 0; r < repeats; ++r) {
      for (Contender c : contenders) {
        const Outcome outcome = run_one(c, base, module, steps, every, warmup, std::filesystem::path(dir) / name_of(c));
        step_ms[c].push_back(outcome.step_ms);
        loss[c] = outcome.final_loss;
        if (c == Contender::kAsync) stats = outcome.snapshots;
        std::cout << fmt::format("repeat {} {}: {:.2f} ms/step\n", r, name_of(c), outcome.step_ms) << std::flush;
      }
    }
    const double none = median(step_ms[Contender::kNone]);
    for (Contender c : contenders) {
      const auto [lo, hi] = std::minmax_element(step_ms[c].begin(), step_ms[c].end());
      std::cout << fmt::format("{:5}  median {:.2f} ms/step (min {:.2f}, max {:.2f}), {:+.2f}% against none\n",
                               name_of(c), median(step_ms[c]), *lo, *hi, 100.0 * (median(step_ms[c]) / none - 1.0));
    }
    const double timed_steps = static_cast<double>(steps - 1 - warmup);
    const double sync_save_ms = (median(step_ms[Contender::kSync]) - none) * timed_steps / static_cast<double>(saves);
    // The stall of the snapshots after the first, which allocated the buffers they reuse.
    const double stall_ms = stats.saved > 1 ? 1000.0 * (stats.copy_seconds - stats.first_copy_seconds) /
                                                  static_cast<double>(stats.saved - 1)
                                            : 1000.0 * stats.copy_seconds;
    std::cout << fmt::format(
        "stall per snapshot (copy to host): {:.1f} ms, {:.2f}% of the {} steps between snapshots (the first, which "
        "allocated the buffers: {:.1f} ms, {}); background write {:.1f} ms per snapshot; a synchronous save: {:.1f} ms "
        "= {:.1f} steps\n",
        stall_ms, 100.0 * stall_ms / (none * static_cast<double>(every)), every, 1000.0 * stats.first_copy_seconds,
        warmup >= every ? "before the timed steps" : "timed",
        stats.saved > 0 ? 1000.0 * stats.write_seconds / static_cast<double>(stats.saved) : 0.0, sync_save_ms,
        sync_save_ms / none);
    std::cout << fmt::format(
        "same final loss in every contender: {}\n",
        loss[Contender::kNone] == loss[Contender::kAsync] && loss[Contender::kNone] == loss[Contender::kSync] ? "yes"
                                                                                                              : "no");
    return 0;
  });
}
