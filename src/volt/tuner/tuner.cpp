#include "volt/tuner/tuner.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <malloc.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "volt/callbacks/callback.h"
#include "volt/callbacks/monitors.h"
#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/data/data_loader.h"
#include "volt/data/dataset.h"
#include "volt/module/lightning_module.h"
#include "volt/trainer/trainer.h"

// Set by CMake for a LibTorch built with CUDA: the caching allocator's peak for max_memory_mb.
#ifdef VOLT_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace volt {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

/// The module's parameters and buffers, copied, and the global generator's state: what a search
/// fit changes and the tuner puts back.
class ModuleSnapshot {
 public:
  explicit ModuleSnapshot(LightningModule& module)
      : module_(module), rng_(at::detail::getDefaultCPUGenerator().get_state()) {
    torch::NoGradGuard no_grad;
    for (const auto& item : module.named_parameters(/*recurse=*/true)) {
      values_.emplace_back(item.key(), item.value().detach().clone());
    }
    for (const auto& item : module.named_buffers(/*recurse=*/true)) {
      values_.emplace_back(item.key(), item.value().detach().clone());
    }
  }
  /// Copies the values back into the module's tensors (on whatever device the fit left them).
  void restore() {
    torch::NoGradGuard no_grad;
    auto params = module_.named_parameters(/*recurse=*/true);
    auto buffers = module_.named_buffers(/*recurse=*/true);
    for (const auto& [name, value] : values_) {
      torch::Tensor* target = params.find(name);
      if (target == nullptr) target = buffers.find(name);
      VOLT_CHECK(target != nullptr,
                 "tuner: the module lost its tensor '{}' during the search, so it cannot be restored. HINT: build "
                 "every layer in the constructor or configure_model, the same way on every fit.",
                 name);
      target->copy_(value);
    }
    auto generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(rng_);
  }

 private:
  LightningModule& module_;
  torch::Tensor rng_;
  std::vector<std::pair<std::string, torch::Tensor>> values_;
};

/// The learning-rate finder's callback: sets each step's rate on every param group before the
/// step and records the smoothed loss after it (Lightning's _LRCallback).
class LrFinderCallback : public Callback {
 public:
  explicit LrFinderCallback(const LrFindOptions& options) : options_(options) {}
  std::string state_key() const override { return "LRFinder"; }

  Decision on_train_batch_start(const CallbackContext& context, CallbackServices&) override {
    const double lr = lr_at(options_, step_);
    if (context.optimizers != nullptr) {
      for (const auto& optimizer : *context.optimizers) {
        for (auto& group : optimizer->param_groups()) group.options().set_lr(lr);
      }
    }
    pending_lr_ = lr;
    return {};
  }

  Decision on_train_batch_end(const CallbackContext& context, CallbackServices&) override {
    VOLT_CHECK(context.outputs != nullptr && context.outputs->defined() && context.outputs->numel() == 1,
               "lr_find needs training_step's loss, but training_step returned {}. HINT: return the loss from "
               "training_step (under manual optimization too).",
               context.outputs == nullptr || !context.outputs->defined() ? std::string("nothing")
                                                                         : c10::str(context.outputs->sizes()));
    const double loss = context.outputs->detach().to(torch::kDouble).item<double>();
    // An exponential average with its start-up bias removed, as Lightning smooths it.
    average_ = kBeta * average_ + (1.0 - kBeta) * loss;
    const double smoothed = average_ / (1.0 - std::pow(kBeta, static_cast<double>(step_ + 1)));
    result.lr.push_back(pending_lr_);
    result.loss.push_back(smoothed);
    const bool diverged = options_.early_stop_threshold && step_ > 1 && std::isfinite(best_) &&
                          (!std::isfinite(smoothed) || smoothed > *options_.early_stop_threshold * best_);
    if (step_ <= 1 || smoothed < best_) best_ = smoothed;
    ++step_;
    if (diverged) return Decision::stop_training("lr_find: the loss diverged");
    return {};
  }

  LrFindResult result;

 private:
  static constexpr double kBeta = 0.98;
  LrFindOptions options_;
  int64_t step_ = 0;
  double pending_lr_ = 0;
  double average_ = 0;
  double best_ = std::numeric_limits<double>::infinity();
};

/// Whether `message` is LibTorch's (or the system's) word for running out of memory.
bool is_out_of_memory(const std::string& message) {
  const std::string lower = to_lower(message);
  return lower.find("out of memory") != std::string::npos || lower.find("can't allocate memory") != std::string::npos ||
         lower.find("cannot allocate memory") != std::string::npos || lower.find("bad_alloc") != std::string::npos;
}

/// The memory a trial needs at its peak over what the process held when it began: on a GPU the
/// caching allocator's peak; on the CPU the peak resident set. On the CPU the heap first gives
/// back what earlier trials freed (malloc_trim: with tune_allocator glibc keeps it), or a trial
/// would reuse it unseen, and the peak is reset through /proc/self/clear_refs.
class PeakMemory {
 public:
  explicit PeakMemory(c10::Device device) : device_(device) {}
  /// Starts a trial: its baseline and the peak from here on.
  void start_trial() {
#ifdef VOLT_TORCH_CUDA
    if (device_.is_cuda()) {
      c10::cuda::CUDACachingAllocator::resetPeakStats(device_.index());
      baseline_ = static_cast<int64_t>(
          c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index()).allocated_bytes[0].current);
      return;
    }
#endif
    ::malloc_trim(0);
    // "5" resets the peak resident set (Linux >= 4.0); where that fails the peak is the process's.
    std::ofstream("/proc/self/clear_refs") << "5";
    baseline_ = read_process_stats().rss_bytes;
  }
  /// MiB over the baseline at the peak since start_trial().
  double added_mb() const {
#ifdef VOLT_TORCH_CUDA
    if (device_.is_cuda()) {
      const auto peak = static_cast<int64_t>(
          c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index()).allocated_bytes[0].peak);
      return static_cast<double>(peak - baseline_) / kMiB;
    }
#endif
    return static_cast<double>(read_process_stats().peak_rss_bytes - baseline_) / kMiB;
  }

 private:
  c10::Device device_;
  int64_t baseline_ = 0;
};

}  // namespace

const char* to_string(LrFindMode mode) { return mode == LrFindMode::kLinear ? "linear" : "exponential"; }

LrFindMode parse_lr_find_mode(const std::string& text) {
  const std::string t = to_lower(trim(text));
  if (t == "exponential") return LrFindMode::kExponential;
  if (t == "linear") return LrFindMode::kLinear;
  throw Error(
      fmt::format("lr_find mode='{}' is not supported; supported: 'exponential', 'linear'. HINT: "
                  "'exponential' spreads the steps evenly over the orders of magnitude.",
                  text));
}

const char* to_string(BatchSizeMode mode) { return mode == BatchSizeMode::kBinsearch ? "binsearch" : "power"; }

BatchSizeMode parse_batch_size_mode(const std::string& text) {
  const std::string t = to_lower(trim(text));
  if (t == "power") return BatchSizeMode::kPower;
  if (t == "binsearch") return BatchSizeMode::kBinsearch;
  throw Error(
      fmt::format("scale_batch_size mode='{}' is not supported; supported: 'power', 'binsearch'. HINT: "
                  "'binsearch' also tries the sizes between the last power of two that fit and the first "
                  "that did not.",
                  text));
}

std::optional<double> LrFindResult::suggestion() const {
  if (!suggestion_index || *suggestion_index >= lr.size()) return std::nullopt;
  return lr[*suggestion_index];
}

std::string LrFindResult::to_csv() const {
  std::ostringstream out;
  out.precision(10);
  out << "step,lr,loss,suggested\n";
  for (size_t i = 0; i < lr.size(); ++i) {
    out << i << ',' << lr[i] << ',' << loss[i] << ',' << (suggestion_index == i ? 1 : 0) << '\n';
  }
  return out.str();
}

double lr_at(const LrFindOptions& o, int64_t step) {
  const double r = static_cast<double>(step) / static_cast<double>(o.num_training);
  return o.mode == LrFindMode::kLinear ? o.min_lr + (o.max_lr - o.min_lr) * r
                                       : o.min_lr * std::pow(o.max_lr / o.min_lr, r);
}

std::optional<size_t> steepest_descent(const std::vector<double>& loss, int64_t skip_begin, int64_t skip_end) {
  const auto n = static_cast<int64_t>(loss.size());
  std::vector<size_t> kept;  // indices of the finite losses inside the window
  for (int64_t i = std::max<int64_t>(skip_begin, 0); i < n - std::max<int64_t>(skip_end, 0); ++i) {
    if (std::isfinite(loss[static_cast<size_t>(i)])) kept.push_back(static_cast<size_t>(i));
  }
  if (kept.size() < 2) return std::nullopt;
  // numpy.gradient over the kept values: one-sided at the ends, central inside.
  const size_t m = kept.size();
  const auto value = [&](size_t k) { return loss[kept[k]]; };
  size_t best = 0;
  double steepest = std::numeric_limits<double>::infinity();
  for (size_t k = 0; k < m; ++k) {
    const double g = k == 0       ? value(1) - value(0)
                     : k == m - 1 ? value(m - 1) - value(m - 2)
                                  : 0.5 * (value(k + 1) - value(k - 1));
    if (g < steepest) {
      steepest = g;
      best = k;
    }
  }
  return kept[best];
}

int64_t search_batch_size(const BatchSizeOptions& o, const std::function<TrialOutcome(int64_t)>& trial) {
  VOLT_CHECK(o.init_val >= 1 && o.max_trials >= 1 && o.steps_per_trial >= 1,
             "scale_batch_size got init_val={}, max_trials={}, steps_per_trial={}; each must be >= 1. HINT: "
             "Lightning's defaults are 2, 25 and 3.",
             o.init_val, o.max_trials, o.steps_per_trial);
  int64_t size = o.init_val;
  std::optional<int64_t> fits;     // the largest size that trained
  std::optional<int64_t> too_big;  // the smallest size that did not
  for (int64_t trials = 0; trials < o.max_trials; ++trials) {
    const TrialOutcome outcome = trial(size);
    if (outcome == TrialOutcome::kTooLarge) {
      too_big = size;
      if (!fits) {
        throw Error(
            fmt::format("scale_batch_size: even the first size tried, {}, ran out of memory (or over "
                        "max_memory_mb). HINT: start lower (init_val=1), or raise max_memory_mb.",
                        size));
      }
      if (o.mode == BatchSizeMode::kPower) break;
    } else {
      fits = size;
      if (outcome == TrialOutcome::kDataTooSmall) break;  // one batch holds all the data already
    }
    if (too_big) {
      if (*too_big - *fits <= 1) break;
      size = *fits + (*too_big - *fits) / 2;  // bisect between what fit and what did not
    } else {
      size *= 2;
    }
  }
  return *fits;
}

Tuner::Tuner(TrainerOptions options) : Tuner(std::move(options), Env::from_process(), MachineInfo::current()) {}

Tuner::Tuner(TrainerOptions options, Env env, MachineInfo machine)
    : options_(std::move(options)), env_(std::move(env)), machine_(std::move(machine)) {}

TrainerOptions Tuner::search_options(int64_t max_steps) const {
  TrainerOptions o = options_;
  o.max_steps = max_steps;
  o.max_epochs.reset();
  o.max_time.reset();
  o.limit_val_batches = 0;  // no batches (an integer count)
  o.num_sanity_val_steps = 0;
  o.enable_checkpointing = false;
  o.logger = false;
  o.loggers.clear();
  o.callbacks.clear();
  o.enable_progress_bar = false;
  o.enable_model_summary = false;
  o.ckpt_path.clear();
  o.profiler.reset();
  o.auto_requeue = false;
  o.checkpoint_on_sigterm = false;
  o.fast_dev_run = 0;
  return o;
}

void Tuner::check_single_process(const char* what) const {
  const RunPlan plan = resolve_run_plan(options_, env_, machine_);
  VOLT_CHECK(plan.topology.world_size == 1,
             "{} runs in one process, but these options run {} (strategy '{}'). HINT: tune with --devices 1 "
             "--num-nodes 1, then pass what it found (the learning rate, the batch size) to the distributed run, "
             "as Lightning's Tuner requires too.",
             what, plan.topology.world_size, to_string(plan.strategy));
}

LrFindResult Tuner::lr_find(LightningModule& module, const LrFindOptions& o) {
  VOLT_CHECK(o.min_lr > 0 && o.max_lr > o.min_lr && std::isfinite(o.max_lr) && o.num_training >= 2,
             "lr_find got min_lr={}, max_lr={}, num_training={}; expected 0 < min_lr < max_lr and num_training >= "
             "2. HINT: Lightning's defaults are 1e-8, 1 and 100.",
             o.min_lr, o.max_lr, o.num_training);
  VOLT_CHECK(!o.early_stop_threshold || *o.early_stop_threshold > 1.0,
             "lr_find early_stop_threshold={} must be > 1 (the loss's growth over its best that counts as "
             "diverged). HINT: 4.0, or unset to run every step.",
             o.early_stop_threshold.value_or(0.0));
  check_single_process("lr_find");
  auto finder = std::make_shared<LrFinderCallback>(o);
  TrainerOptions search = search_options(o.num_training);
  search.callbacks = {finder};
  ModuleSnapshot snapshot(module);
  try {
    Trainer trainer(search, env_, machine_);
    trainer.fit(module);
  } catch (...) {
    snapshot.restore();
    throw;
  }
  snapshot.restore();
  LrFindResult result = std::move(finder->result);
  result.suggestion_index = steepest_descent(result.loss, o.skip_begin, o.skip_end);
  return result;
}

int64_t Tuner::scale_batch_size(LightningModule& module, const BatchSizeOptions& o) {
  check_single_process("scale_batch_size");
  const auto set_size = [&](int64_t size) {
    if (o.set_batch_size) {
      o.set_batch_size(size);
      return;
    }
    nlohmann::json hparams = module.hparams();
    VOLT_CHECK(hparams.is_object() && hparams.contains(o.batch_arg_name),
               "scale_batch_size sets the hyperparameter '{}', but {} has none (its hparams: {}). HINT: "
               "save_hyperparameters({{\"{}\": ...}}) and read it in train_dataloader(), or pass "
               "BatchSizeOptions::set_batch_size.",
               o.batch_arg_name, module.name(), hparams.dump(), o.batch_arg_name);
    hparams[o.batch_arg_name] = size;
    module.save_hyperparameters(std::move(hparams));
  };
  // One snapshot for the whole search: every trial starts from the module as it was given.
  ModuleSnapshot snapshot(module);
  PeakMemory memory(resolve_run_plan(options_, env_, machine_).root_device());
  const auto trial = [&](int64_t size) {
    set_size(size);
    // A batch as large as the data set holds all of it: larger sizes train the same batch.
    TrialOutcome outcome = TrialOutcome::kFits;
    const DataLoader loader = module.train_dataloader();
    if (loader.defined() && !loader.streaming() && loader.dataset() && size >= loader.dataset()->size()) {
      outcome = TrialOutcome::kDataTooSmall;
    }
    try {
      Trainer trainer(search_options(o.steps_per_trial), env_, machine_);
      memory.start_trial();
      trainer.fit(module);
      if (o.max_memory_mb && memory.added_mb() > *o.max_memory_mb) outcome = TrialOutcome::kTooLarge;
    } catch (const std::exception& e) {
      snapshot.restore();
      if (!is_out_of_memory(e.what())) throw;
      return TrialOutcome::kTooLarge;
    }
    snapshot.restore();
    return outcome;
  };
  // The first fit of a process also sets LibTorch up (the BLAS library's buffers, thread pools):
  // tens of MiB that no batch size needs. A warm-up trial takes them, unmeasured.
  if (o.max_memory_mb) (void)trial(o.init_val);
  const int64_t found = search_batch_size(o, trial);
  set_size(found);
  return found;
}

}  // namespace volt
