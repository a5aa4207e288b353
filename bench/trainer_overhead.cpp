// How much the Trainer costs per step over a hand-written LibTorch loop.
//
// Both contenders train the same MLP (784-256-256-10) with Adam (lr 1e-3), batch 64 and
// cross-entropy on Fashion-MNIST's training split, on 1 intra-op thread, from the same initial
// weights, on the same batches in the same order. The hand loop draws its batches from
// volt::DataLoader too: the data path is the same code, so the comparison isolates what the
// Trainer adds around the step (hooks, metrics, callbacks, loggers, progress).
//
// Contenders, interleaved per repetition (the order rotates each repetition so no contender
// always runs first) so machine noise hits all of them alike:
//   hand             a plain loop: zero_grad, forward, cross_entropy, backward, step
//   trainer_bare     Trainer without logger, progress bar, checkpointing, summary or sanity steps
//   trainer_profiled trainer_bare with profiler="simple" (its table goes to a file with stdout):
//                    what the simple profiler costs, printed as its ratio to trainer_bare (target 2%)
//   trainer_defaults Trainer as a user gets it: CSV logger, progress bar (stdout not a TTY: it is
//                    sent to a file during the run), a ModelCheckpoint at epoch end, the summary
//
// Every run ends with bit-identical parameters (checked with torch::equal; exit 1 otherwise).
//
// Each step is stamped with the wall clock and the process CPU clock right after its optimizer
// step. Wall time is what a user waits for; CPU time is what the code costs and barely moves
// when other jobs share the machine, so its ratio is the steadier one on a busy host.
//
//   bench_trainer_overhead --steps 1200 --repeats 3               # the defaults
//   valgrind --tool=callgrind bench_trainer_overhead --steps 40 --repeats 1 --contenders trainer_bare
//   bench_trainer_overhead --steps 60 --repeats 1          # what CTest runs: it runs and agrees
//   bench_trainer_overhead --no-tune-allocator             # both contenders on glibc's defaults
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <torch/torch.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "bench_stats.h"
#include "volt/datasets/fashion_mnist.h"
#include "volt/plan/process_setup.h"
#include "volt/volt.h"

namespace {

using Clock = std::chrono::steady_clock;
using volt::bench::median;

/// What the benchmark is asked to do.
struct BenchOptions {
  int64_t steps = 1200;  // crosses one epoch end (938 batches), where checkpoints are written
  int64_t warmup = 50;
  int64_t repeats = 3;
  uint64_t seed = 42;
  bool tune_allocator = true;
  bool log_loss = false;
  std::string data_dir = volt::datasets::kFashionMnistDefaultDir;
};

/// A moment on both clocks, in milliseconds.
struct Stamp {
  double wall_ms = 0;
  double cpu_ms = 0;

  static Stamp now() {
    timespec cpu{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu);
    return {std::chrono::duration<double, std::milli>(Clock::now().time_since_epoch()).count(),
            static_cast<double>(cpu.tv_sec) * 1e3 + static_cast<double>(cpu.tv_nsec) * 1e-6};
  }
};

/// The moments of one run.
struct StepTimes {
  Stamp start;                  // fit() called / the loop started
  Stamp train_start;            // on_train_start / the loop's setup done, before the first batch
  std::vector<Stamp> step_end;  // right after each optimizer step
  Stamp finish;                 // fit() returned / the loop ended
};

/// The MLP as a LightningModule; the hand loop uses the same class, calling net() directly.
class BenchMlp : public volt::LightningModule {
 public:
  /// `times` receives a timestamp at the end of every training batch (after the optimizer step).
  BenchMlp(StepTimes* times, bool log_loss) : volt::LightningModule("BenchMlp"), times_(times), log_loss_(log_loss) {
    namespace nn = torch::nn;
    net_ = register_module("net", nn::Sequential(nn::Flatten(), nn::Linear(784, 256), nn::ReLU(), nn::Linear(256, 256),
                                                 nn::ReLU(), nn::Linear(256, 10)));
  }

  /// The logits for images shaped [N, 1, 28, 28].
  torch::Tensor forward(const torch::Tensor& images) { return net_->forward(images); }

  torch::Tensor training_step(const volt::Batch& batch, int64_t) override {
    torch::Tensor loss = torch::nn::functional::cross_entropy(forward(batch.data), batch.target);
    if (log_loss_) log("train/loss", loss, {.prog_bar = true, .on_step = true, .on_epoch = true});
    return loss;
  }

  volt::OptimizerConfig configure_optimizers() override {
    return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-3));
  }

  void on_train_start() override { times_->train_start = Stamp::now(); }

  // The Trainer calls this right after the optimizer step: the same point the hand loop stamps.
  void on_train_batch_end(const torch::Tensor&, const volt::Batch&, int64_t) override {
    times_->step_end.push_back(Stamp::now());
  }

 private:
  torch::nn::Sequential net_{nullptr};
  StepTimes* times_;
  bool log_loss_;
};

/// A fresh model with the benchmark's initial weights (the global generator seeds the init).
std::unique_ptr<BenchMlp> make_model(const BenchOptions& o, StepTimes* times) {
  torch::manual_seed(o.seed);
  return std::make_unique<BenchMlp>(times, o.log_loss);
}

volt::DataLoader make_loader(const std::shared_ptr<volt::TensorDataset>& data, const BenchOptions& o) {
  return volt::DataLoader(data, {.batch_size = 64, .shuffle = true, .seed = o.seed});
}

/// The hand-written loop, in the Trainer's order: zero_grad once, then per step forward,
/// backward, step, zero_grad; the loader reshuffles per epoch exactly as the Trainer asks it to.
void run_hand(BenchMlp& model, volt::DataLoader loader, const BenchOptions& o, StepTimes& times) {
  times.start = Stamp::now();
  torch::manual_seed(o.seed);  // the Trainer seeds at fit start too; nothing here draws from it
  model.train();
  torch::optim::Adam optimizer(model.parameters(), torch::optim::AdamOptions(1e-3));
  optimizer.zero_grad();
  times.train_start = Stamp::now();
  int64_t step = 0;
  for (int64_t epoch = 0; step < o.steps; ++epoch) {
    loader.set_epoch(epoch);
    const int64_t batches = loader.num_batches();
    for (int64_t i = 0; i < batches && step < o.steps; ++i, ++step) {
      const volt::Batch batch = loader.batch(i);
      const torch::Tensor loss = torch::nn::functional::cross_entropy(model.forward(batch.data), batch.target);
      loss.backward();
      optimizer.step();
      optimizer.zero_grad();
      times.step_end.push_back(Stamp::now());
    }
  }
  times.finish = Stamp::now();
}

/// Sends stdout to `path` while alive, so the progress bar sees no TTY and the table stays readable.
class StdoutToFile {
 public:
  explicit StdoutToFile(const std::string& path) {
    std::cout.flush();
    std::fflush(stdout);
    saved_ = ::dup(STDOUT_FILENO);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (saved_ < 0 || fd < 0) throw std::runtime_error("cannot redirect stdout to " + path);
    ::dup2(fd, STDOUT_FILENO);
    ::close(fd);
  }
  ~StdoutToFile() {
    std::cout.flush();
    std::fflush(stdout);
    ::dup2(saved_, STDOUT_FILENO);
    ::close(saved_);
  }
  StdoutToFile(const StdoutToFile&) = delete;
  StdoutToFile& operator=(const StdoutToFile&) = delete;

 private:
  int saved_ = -1;
};

void run_trainer(BenchMlp& model, volt::DataLoader loader, const BenchOptions& o, bool defaults, bool profiled,
                 const std::string& root_dir, StepTimes& times) {
  volt::TrainerOptions options;
  options.num_threads = 1;
  options.tune_allocator = o.tune_allocator;
  options.max_steps = o.steps;
  options.seed = o.seed;
  options.default_root_dir = root_dir;
  if (!defaults) {
    options.logger = false;
    options.enable_progress_bar = false;
    options.enable_checkpointing = false;
    options.enable_model_summary = false;
    options.num_sanity_val_steps = 0;
  }
  if (profiled) options.profiler = volt::ProfilerKind::kSimple;
  volt::Trainer trainer(options);
  std::filesystem::create_directories(root_dir);
  std::unique_ptr<StdoutToFile> redirect;
  if (defaults || profiled) redirect = std::make_unique<StdoutToFile>(root_dir + "/stdout.txt");
  times.start = Stamp::now();
  const volt::FitResult result = trainer.fit(model, std::move(loader));
  times.finish = Stamp::now();
  redirect.reset();
  if (result.global_step != o.steps) {
    throw std::runtime_error("the Trainer ran " + std::to_string(result.global_step) + " steps, not " +
                             std::to_string(o.steps));
  }
}

/// The figures of one run on one clock, in milliseconds.
struct RunStats {
  double setup = 0;         // start to the first batch (fit()'s setup; the loop's optimizer)
  double first_step = 0;    // start to the end of the first optimizer step
  double mean_step = 0;     // (end of step N-1 - end of step warmup-1) / (N - warmup)
  double median_step = 0;   // median of the step-to-step intervals after warm-up
  double slowest_step = 0;  // the longest interval after warm-up (an epoch end's checkpoint shows here)
  double total = 0;         // start to fit()/loop return, teardown (final checkpoint) included
};

RunStats summarize(const StepTimes& t, int64_t warmup, double Stamp::*clock) {
  RunStats s;
  const auto at = [clock](const Stamp& stamp) { return stamp.*clock; };
  s.setup = at(t.train_start) - at(t.start);
  s.first_step = at(t.step_end.front()) - at(t.start);
  s.total = at(t.finish) - at(t.start);
  std::vector<double> deltas;
  for (size_t i = static_cast<size_t>(std::max<int64_t>(warmup, 1)); i < t.step_end.size(); ++i)
    deltas.push_back(at(t.step_end[i]) - at(t.step_end[i - 1]));
  s.mean_step = std::accumulate(deltas.begin(), deltas.end(), 0.0) / static_cast<double>(deltas.size());
  s.slowest_step = *std::max_element(deltas.begin(), deltas.end());
  std::nth_element(deltas.begin(), deltas.begin() + static_cast<std::ptrdiff_t>(deltas.size() / 2), deltas.end());
  s.median_step = deltas[deltas.size() / 2];
  return s;
}

double checksum(BenchMlp& model) {
  double sum = 0;
  for (const auto& p : model.parameters()) sum += p.to(torch::kDouble).sum().item<double>();
  return sum;
}

/// True when every parameter of `a` equals the one of `b` bit for bit.
bool same_parameters(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return true;
}

std::vector<torch::Tensor> snapshot(BenchMlp& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model.parameters()) out.push_back(p.detach().clone());
  return out;
}

std::string fixed(double v, int digits) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << v;
  return s.str();
}

/// Prints one clock's table; ratios pair each Trainer run with the hand run of the same
/// repetition (interleaving cancels slow drifts of the machine) and take the median over them.
void print_table(const std::string& clock_name, double Stamp::*clock, const std::vector<std::string>& names,
                 const std::vector<std::vector<StepTimes>>& runs, const BenchOptions& o,
                 std::vector<std::string>& verdicts) {
  std::cout << "\n"
            << clock_name << " (ms; medians over repeats; ratios: median [min, max] over repeats)\n"
            << std::left << std::setw(18) << "contender" << std::right << std::setw(8) << "setup" << std::setw(12)
            << "first step" << std::setw(11) << "mean step" << std::setw(13) << "median step" << std::setw(9)
            << "slowest" << std::setw(10) << "total"
            << "   mean ratio vs hand     median ratio\n";
  const bool have_hand = !runs[0].empty();
  for (size_t c = 0; c < names.size(); ++c) {
    if (runs[c].empty()) continue;
    std::vector<double> setup, first, mean, med, slowest, total, rmean, rmed;
    for (size_t r = 0; r < runs[c].size(); ++r) {
      const RunStats s = summarize(runs[c][r], o.warmup, clock);
      setup.push_back(s.setup);
      first.push_back(s.first_step);
      mean.push_back(s.mean_step);
      med.push_back(s.median_step);
      slowest.push_back(s.slowest_step);
      total.push_back(s.total);
      if (have_hand) {
        const RunStats h = summarize(runs[0][r], o.warmup, clock);
        rmean.push_back(s.mean_step / h.mean_step);
        rmed.push_back(s.median_step / h.median_step);
      }
    }
    std::cout << std::left << std::setw(18) << names[c] << std::right << std::setw(8) << fixed(median(setup), 2)
              << std::setw(12) << fixed(median(first), 2) << std::setw(11) << fixed(median(mean), 4) << std::setw(13)
              << fixed(median(med), 4) << std::setw(9) << fixed(median(slowest), 2) << std::setw(10)
              << fixed(median(total), 1);
    if (!have_hand) {
      std::cout << "\n";
      continue;
    }
    const auto [rmin, rmax] = std::minmax_element(rmean.begin(), rmean.end());
    std::cout << "   " << fixed(median(rmean), 4) << " [" << fixed(*rmin, 3) << ", " << fixed(*rmax, 3) << "]   "
              << fixed(median(rmed), 4) << "\n";
    if (c == 0) continue;
    const double ratio = median(rmean);
    verdicts.push_back(names[c] + "/hand step time ratio (" + clock_name + "): " + fixed(ratio, 3) + " mean, " +
                       fixed(median(rmed), 3) + " median" + (ratio > 1.03 ? "  ABOVE the 3% target" : ""));
  }
}

int run(int argc, char** argv) {
  BenchOptions o;
  CLI::App app("Per-step cost of volt::Trainer against a hand-written LibTorch loop.", "bench_trainer_overhead");
  app.add_option("--steps", o.steps, "optimizer steps per run")->capture_default_str();
  app.add_option("--warmup", o.warmup, "steps left out of the steady-state figures")->capture_default_str();
  app.add_option("--repeats", o.repeats, "interleaved repetitions of every contender")->capture_default_str();
  app.add_option("--seed", o.seed, "weights and shuffle seed")->capture_default_str();
  app.add_option("--data-dir", o.data_dir, "directory of the Fashion-MNIST IDX files")->capture_default_str();
  std::vector<std::string> contenders = {"hand", "trainer_bare", "trainer_profiled", "trainer_defaults"};
  app.add_option("--contenders", contenders, "which to run (profiling one alone: --contenders trainer_bare)")
      ->delimiter(',')
      ->check(CLI::IsMember({"hand", "trainer_bare", "trainer_profiled", "trainer_defaults"}))
      ->capture_default_str();
  bool no_tune = false;
  app.add_flag("--no-tune-allocator", no_tune, "leave glibc malloc's thresholds alone in both contenders");
  app.add_flag("--log-loss", o.log_loss, "training_step logs train/loss (the Trainer pays for it; the hand loop not)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  o.tune_allocator = !no_tune;
  if (o.steps < 2 || o.repeats < 1 || o.warmup < 0) {
    std::cerr << "need --steps >= 2, --repeats >= 1, --warmup >= 0\n";
    return 2;
  }
  o.warmup = std::min(o.warmup, o.steps - 1);  // keep at least one steady-state interval

  // Process-wide settings both contenders share; the Trainer applies the same ones at fit().
  if (o.tune_allocator) volt::internal::tune_allocator();
  torch::set_num_threads(1);

  // 77: CTest's "skipped", for machines without Debian's dataset-fashion-mnist.
  const std::filesystem::path images = std::filesystem::path(o.data_dir) / "train-images-idx3-ubyte";
  if (!std::filesystem::exists(images) && !std::filesystem::exists(images.string() + ".gz")) {
    std::cerr << "skipped: no Fashion-MNIST under " << o.data_dir << " (apt install dataset-fashion-mnist)\n";
    return 77;
  }
  const auto data = volt::datasets::load_fashion_mnist(o.data_dir, volt::datasets::Split::kTrain);
  const auto dataset = std::make_shared<volt::TensorDataset>(data.images, data.labels);

  std::string tmp_template = (std::filesystem::temp_directory_path() / "volt_bench_XXXXXX").string();
  if (::mkdtemp(tmp_template.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  const std::string root_dir = tmp_template;

  const std::vector<std::string> names = {"hand", "trainer_bare", "trainer_profiled", "trainer_defaults"};
  std::vector<size_t> selected;  // in the table's order, whatever the flag's
  for (size_t c = 0; c < names.size(); ++c)
    if (std::find(contenders.begin(), contenders.end(), names[c]) != contenders.end()) selected.push_back(c);
  std::vector<std::vector<StepTimes>> runs(names.size());
  std::vector<torch::Tensor> reference;
  double reference_checksum = 0;
  bool all_equal = true;
  std::cout << std::setprecision(17);
  for (int64_t r = 0; r < o.repeats; ++r) {
    for (size_t k = 0; k < selected.size(); ++k) {
      const size_t c = selected[(k + static_cast<size_t>(r)) % selected.size()];
      StepTimes times;
      times.step_end.reserve(static_cast<size_t>(o.steps));
      auto model = make_model(o, &times);
      if (c == 0) {
        run_hand(*model, make_loader(dataset, o), o, times);
      } else {
        run_trainer(*model, make_loader(dataset, o), o, /*defaults=*/c == 3, /*profiled=*/c == 2,
                    root_dir + "/" + names[c] + "_" + std::to_string(r), times);
      }
      const double sum = checksum(*model);
      const auto params = snapshot(*model);
      if (reference.empty()) {
        reference = params;
        reference_checksum = sum;
      }
      const bool equal = same_parameters(reference, params);
      all_equal = all_equal && equal;
      runs[c].push_back(std::move(times));
      std::cout << "repeat " << r << " " << std::left << std::setw(17) << names[c] << " checksum " << sum
                << (equal ? "  (bit-identical)" : "  MISMATCH") << "\n";
    }
  }
  std::filesystem::remove_all(root_dir);

  std::cout << "\n"
            << o.steps << " steps x " << o.repeats << " repeats, steady state = steps " << o.warmup << ".."
            << o.steps - 1 << ", 1 thread, allocator tuning " << (o.tune_allocator ? "on" : "off")
            << (o.log_loss ? ", training_step logs train/loss" : "") << "\n";
  std::vector<std::string> verdicts;
  print_table("wall clock", &Stamp::wall_ms, names, runs, o, verdicts);
  print_table("process CPU time", &Stamp::cpu_ms, names, runs, o, verdicts);
  // The simple profiler's cost: each repeat's profiled run against the bare run of that repeat.
  if (!runs[1].empty() && runs[1].size() == runs[2].size()) {
    for (const auto& [clock_name, clock] :
         {std::pair{"wall clock", &Stamp::wall_ms}, {"process CPU time", &Stamp::cpu_ms}}) {
      std::vector<double> ratios;
      for (size_t r = 0; r < runs[1].size(); ++r) {
        ratios.push_back(summarize(runs[2][r], o.warmup, clock).mean_step /
                         summarize(runs[1][r], o.warmup, clock).mean_step);
      }
      const double ratio = median(ratios);
      verdicts.push_back(std::string("trainer_profiled/trainer_bare step time ratio (") + clock_name + "): " +
                         fixed(ratio, 3) + " median over repeats" + (ratio > 1.02 ? "  ABOVE the 2% target" : ""));
    }
  }
  std::cout << "\n";
  for (const auto& line : verdicts) std::cout << line << "\n";
  std::cout << "final parameter checksum: " << std::setprecision(17) << reference_checksum << "\n";
  if (!all_equal) {
    std::cout << "FAIL: the contenders' final parameters differ\n";
    return 1;
  }
  std::cout << "all runs bit-identical\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "bench_trainer_overhead: " << e.what() << "\n";
    return 1;
  }
}
