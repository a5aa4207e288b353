// Activation checkpointing's memory and time, measured (volt::checkpoint): a stack of residual
// MLP blocks (x + drop(down(gelu(up(x)))), 4x wide inside) trained for a few steps plainly and
// with every block checkpointed, each in a process of its own (forked before LibTorch runs
// anything), which reports the peak of its resident memory over its baseline (VmHWM after
// building the model and one small warm-up step). malloc's mmap threshold is pinned at 128 KiB,
// so every tensor above it is mapped on allocation and unmapped when freed (glibc would otherwise
// raise the threshold past the activations' size and keep freed ones on its heap), and the peak
// follows the live tensors. Printed: each peak, their ratio, the ratio the saved
// activations predict, and the step times. With --gpt the stack is the example's GPT
// (examples/gpt: --blocks transformer blocks of --width, --heads, --context tokens, --batch
// windows of random byte tokens), every block checkpointed by the model's own
// activation_checkpointing switch.
#include "volt/nn/activation_checkpoint.h"

#include <fmt/format.h>
#include <malloc.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <fstream>
#include <string>

#include "gpt/gpt_model.h"
#include "volt/cli/run_main.h"

namespace {

struct Options {
  int64_t blocks = 12;
  int64_t width = 256;
  int64_t batch = 4096;
  int64_t steps = 3;
  bool gpt = false;
  int64_t heads = 4;
  int64_t context = 128;
};

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t width) {
    up = register_module("up", torch::nn::Linear(width, 4 * width));
    down = register_module("down", torch::nn::Linear(4 * width, width));
    drop = register_module("drop", torch::nn::Dropout(0.1));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x + drop(down(torch::gelu(up(x)))); }
  torch::nn::Linear up{nullptr}, down{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Block);

/// This process's resident-memory high-water mark in bytes (Linux's VmHWM).
int64_t peak_rss() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

/// Resets the high-water mark to the current resident memory (Linux: write 5 to clear_refs).
void reset_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }

struct Measured {
  double peak_mib;
  double step_ms;
};

/// Peak over baseline and step time of `step(rows)` run o.steps times at o.batch rows, after one
/// warm-up step of 8 rows (gradients allocated, kernels warm).
template <typename Step>
Measured measure(const Options& o, const Step& step) {
  step(8);
  reset_peak();
  const int64_t baseline = peak_rss();
  const auto start = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < o.steps; ++s) step(o.batch);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return {static_cast<double>(peak_rss() - baseline) / (1 << 20), ms / static_cast<double>(o.steps)};
}

/// The example's GPT (no dropout, byte vocabulary) on random windows of o.context tokens.
Measured run_gpt(const Options& o, bool checkpointed) {
  gpt::GptConfig config;
  config.n_layer = o.blocks;
  config.n_head = o.heads;
  config.n_embd = o.width;
  config.n_positions = o.context;
  config.vocab_size = 256;
  config.activation_checkpointing = checkpointed;
  gpt::Gpt model(config);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(1e-3));
  return measure(o, [&](int64_t rows) {
    const torch::Tensor tokens = torch::randint(256, {rows, o.context + 1}, torch::kLong);
    model->training_loss(tokens.narrow(1, 0, o.context), tokens.narrow(1, 1, o.context)).backward();
    sgd.step();
    sgd.zero_grad();
  });
}

Measured run(const Options& o, bool checkpointed) {
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  torch::set_num_threads(1);
  torch::manual_seed(0);
  if (o.gpt) return run_gpt(o, checkpointed);
  std::vector<Block> blocks;
  std::vector<torch::Tensor> parameters;
  for (int64_t i = 0; i < o.blocks; ++i) {
    blocks.emplace_back(o.width);
    for (const auto& p : blocks.back()->parameters()) parameters.push_back(p);
  }
  torch::optim::SGD sgd(parameters, torch::optim::SGDOptions(1e-3));
  return measure(o, [&](int64_t rows) {
    torch::Tensor h = torch::randn({rows, o.width});
    for (Block& block : blocks) {
      h = checkpointed ? volt::checkpoint([block](const torch::Tensor& x) mutable { return block->forward(x); }, h)
                       : block->forward(h);
    }
    h.pow(2).mean().backward();
    sgd.step();
    sgd.zero_grad();
  });
}

/// Runs `run(o, checkpointed)` in a child process; its figures come back through a pipe.
Measured in_child(const Options& o, bool checkpointed) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    const Measured m = run(o, checkpointed);
    const ssize_t written = write(fds[1], &m, sizeof(m));
    _exit(written == static_cast<ssize_t>(sizeof(m)) ? 0 : 1);
  }
  close(fds[1]);
  Measured m{};
  const ssize_t got = read(fds[0], &m, sizeof(m));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (got != static_cast<ssize_t>(sizeof(m)) || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw std::runtime_error(fmt::format("the {} run failed", checkpointed ? "checkpointed" : "plain"));
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  return volt::run_main([&] {
    CLI::App app("Activation checkpointing: peak memory and step time of a block stack, plain and checkpointed",
                 "bench_activation_checkpoint");
    Options o;
    app.add_option("--blocks", o.blocks, "residual MLP blocks")->check(CLI::PositiveNumber);
    app.add_option("--width", o.width, "the model's width (4x inside a block)")->check(CLI::PositiveNumber);
    app.add_option("--batch", o.batch, "rows per step")->check(CLI::PositiveNumber);
    app.add_option("--steps", o.steps, "timed steps per contender")->check(CLI::PositiveNumber);
    app.add_flag("--gpt", o.gpt, "the example's GPT instead: --blocks blocks of --width, --batch windows of --context");
    app.add_option("--heads", o.heads, "--gpt: attention heads")->check(CLI::PositiveNumber);
    app.add_option("--context", o.context, "--gpt: tokens per window")->check(CLI::PositiveNumber);
    CLI11_PARSE(app, argc, argv);
    const Measured plain = in_child(o, false);
    const Measured checkpointed = in_child(o, true);
    // Saved for backward per row of a block, in floats: up's input (w), gelu's input (4w),
    // down's input (4w), and dropout's mask (w bytes, a quarter float each). Checkpointed, every
    // block keeps only its input (w), and one block at a time is recomputed in backward. The
    // backward's own working set (gradients of the activations) is the same in both runs, so the
    // peaks should differ by the difference of the saved activations.
    const auto blocks = static_cast<double>(o.blocks);
    const auto width = static_cast<double>(o.width);
    // A row is a token for the GPT.
    const double mib_per_float_row = static_cast<double>(o.batch * (o.gpt ? o.context : 1)) * 4.0 / (1 << 20);
    // The GPT block's saved tensors per token, in floats (LibTorch 1.13's plain attention): ln_1's
    // input and output (2w); the copies matmul makes of the transposed queries, keys and values
    // (3w); softmax's output (heads x context); the heads' output, c_proj's input (w); ln_2's
    // input and output (2w); gelu's input and c_proj's (8w): 16w + heads x context.
    const double per_block =
        (o.gpt ? 16.0 * width + static_cast<double>(o.heads * o.context) : 9.0 * width + width / 4) * mib_per_float_row;
    const double saved_plain = blocks * per_block;
    const double saved_checkpointed = blocks * width * mib_per_float_row + per_block;
    fmt::print("plain        peak_mib={:.1f} saved_activations_mib={:.1f} step_ms={:.1f}\n", plain.peak_mib,
               saved_plain, plain.step_ms);
    fmt::print("checkpointed peak_mib={:.1f} saved_activations_mib={:.1f} step_ms={:.1f}\n", checkpointed.peak_mib,
               saved_checkpointed, checkpointed.step_ms);
    fmt::print(
        "peak ratio checkpointed/plain={:.3f}; peak drop {:.1f} MiB, saved activations predict {:.1f} MiB "
        "(measured/predicted {:.2f}); step time ratio={:.2f}\n",
        checkpointed.peak_mib / plain.peak_mib, plain.peak_mib - checkpointed.peak_mib,
        saved_plain - saved_checkpointed, (plain.peak_mib - checkpointed.peak_mib) / (saved_plain - saved_checkpointed),
        checkpointed.step_ms / plain.step_ms);
    return 0;
  });
}
