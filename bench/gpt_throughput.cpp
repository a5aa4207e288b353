// Volt's side of bench/gpt_vs_pytorch.sh: the example's GPT (gpt::GptModule: AdamW in two
// groups, linear warmup then cosine decay per step) trained for --max-steps on the byte windows of
// --text, 1 thread per process. It writes the initial weights to --init-out (safetensors, rank 0),
// which the plain PyTorch loop and Lightning (bench/pytorch_gpt.py) load, so all three train the
// same model from the same weights on the same batches. Rank 0 prints the steady-state time per
// step, tokens and model FLOPs per second, and the loss of every step.
#include <chrono>
#include <iostream>

#include "bench_mlp.h"  // StepClock
#include "gpt/gpt_module.h"
#include "volt/checkpoint/safetensors.h"
#include "volt/cli/trainer_flags.h"
#include "volt/core/error.h"
#include "volt/volt.h"

namespace {

/// The loss of every step, for the check that the contenders train alike.
class LossLog : public volt::Callback {
 public:
  std::string state_key() const override { return "LossLog"; }
  volt::Decision on_train_batch_end(const volt::CallbackContext& context, volt::CallbackServices&) override {
    if (context.outputs != nullptr && context.outputs->defined()) losses.push_back(context.outputs->item<double>());
    return {};
  }
  /// One loss per step, in order.
  std::vector<double> losses;
};

}  // namespace

int main(int argc, char** argv) {
  return volt::run_main([&] {
    CLI::App app("Volt GPT throughput (one side of bench/gpt_vs_pytorch.sh)", "bench_gpt_throughput");
    volt::TrainerOptions options = volt::bench::bare_trainer_options();
    options.limit_val_batches = volt::BatchLimit(int64_t{0});
    volt::TrainerFlagText text;
    volt::add_trainer_flags(app, options, text);
    gpt::GptModuleOptions module;
    module.val_fraction = 0;
    module.sample.max_new_tokens = 0;
    module.warmup_steps = 10;
    gpt::GptConfig& model = module.model;
    app.add_option("--n-layer", model.n_layer)->capture_default_str();
    app.add_option("--n-head", model.n_head)->capture_default_str();
    app.add_option("--n-embd", model.n_embd)->capture_default_str();
    app.add_option("--block-size", model.n_positions)->capture_default_str();
    app.add_option("--batch-size", module.batch_size, "windows per process and step")->capture_default_str();
    app.add_option("--warmup-steps", module.warmup_steps)->capture_default_str();
    app.add_flag("--activation-checkpointing", model.activation_checkpointing);
    app.add_option("--text", module.text, "the text whose bytes are the tokens")->required();
    int64_t warmup = 10;
    app.add_option("--warmup", warmup, "steps left out of the timing")->capture_default_str();
    std::string init_out;
    app.add_option("--init-out", init_out, "write the initial weights here (safetensors)");
    CLI11_PARSE(app, argc, argv);
    volt::apply_trainer_flags(text, options);
    model.fsdp_units = options.sharding_strategy == volt::ShardingStrategy::kFullShard;
    auto clock = std::make_shared<volt::bench::StepClock>();
    auto losses = std::make_shared<LossLog>();
    options.callbacks.push_back(clock);
    options.callbacks.push_back(losses);
    volt::Trainer trainer(options);  // seeds LibTorch, so the weights below are the seed's
    gpt::GptModule gpt_module(module);
    if (!init_out.empty() && trainer.plan().is_global_zero()) {
      volt::NamedTensors weights;
      for (const auto& item : gpt_module.named_parameters()) weights.emplace_back(item.key(), item.value().detach());
      volt::save_safetensors(init_out, weights);
    }
    const volt::FitResult result = trainer.fit(gpt_module);
    trainer.teardown();
    if (!trainer.plan().is_global_zero()) return 0;
    const double step_ms = volt::bench::steady_step_ms(clock->stamps, warmup);
    const int64_t world = trainer.plan().topology.world_size;
    const double tokens_per_step = static_cast<double>(module.batch_size * model.n_positions * world);
    // Model FLOPs per token (PaLM's appendix B): 6 per weight that multiplies (every parameter but
    // the position embedding; the token embedding counts once, as the LM head) plus attention's
    // 12 L E T.
    const double weights = static_cast<double>(model.parameter_count() - model.n_positions * model.n_embd);
    const double flops_per_token =
        6.0 * weights + 12.0 * static_cast<double>(model.n_layer * model.n_embd * model.n_positions);
    std::cout << "volt processes=" << world << " step_ms=" << step_ms
              << " tokens_per_s=" << tokens_per_step * 1000.0 / step_ms
              << " flops_per_s=" << flops_per_token * tokens_per_step * 1000.0 / step_ms
              << " steps=" << result.global_step << "\nlosses";
    for (double loss : losses->losses) std::cout << " " << loss;
    std::cout << "\n";
    return 0;
  });
}
