#include "volt/profiler/profiler.h"

#include <ATen/record_function.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <ostream>

#include "volt/core/error.h"

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/autograd/profiler_kineto.h>
#endif

namespace volt {

const char* to_string(Action action) {
  switch (action) {
    case Action::kTrainStep:
      return "train_step";
    case Action::kDataFetch:
      return "data_fetch";
    case Action::kTransfer:
      return "batch_transfer";
    case Action::kForward:
      return "forward";
    case Action::kBackward:
      return "backward";
    case Action::kGradSync:
      return "gradient_sync_wait";
    case Action::kOptimizerStep:
      return "optimizer_step";
    case Action::kHooks:
      return "hooks";
    case Action::kLogging:
      return "logging";
    case Action::kValidation:
      return "validation";
    case Action::kEvalDataFetch:
      return "eval_data_fetch";
    case Action::kEvalStep:
      return "eval_step";
    case Action::kCheckpointSave:
      return "checkpoint_save";
    case Action::kCount:
      break;
  }
  return "?";
}

void ActionStats::add(double seconds) {
  min = count == 0 ? seconds : std::min(min, seconds);
  max = std::max(max, seconds);
  total += seconds;
  ++count;
}

/// LibTorch's profiler between start() and stop(): Kineto where LibTorch 2.x has it (CPU and,
/// on a CUDA build with a GPU, the kernels), the autograd ("legacy") profiler otherwise, which
/// Debian's LibTorch 1.13 (built without Kineto) has.
class TraceRecorder {
 public:
  TraceRecorder() = default;
  ~TraceRecorder() {
    try {
      stop("");
    } catch (...) {  // a destructor must not throw; a trace lost on unwinding is no loss
    }
  }
  TraceRecorder(const TraceRecorder&) = delete;
  TraceRecorder& operator=(const TraceRecorder&) = delete;

  /// Starts recording this thread's operators and Volt's ranges.
  void start() {
#if TORCH_VERSION_MAJOR >= 2
    try {
      namespace impl = torch::profiler::impl;
      const impl::ProfilerConfig config(impl::ProfilerState::KINETO, /*report_input_shapes=*/false,
                                        /*profile_memory=*/false);
      std::set<impl::ActivityType> activities = {impl::ActivityType::CPU};
      // The GPU's kernels and copies too, on a CUDA build that sees a device.
      if (torch::cuda::is_available()) activities.insert(impl::ActivityType::CUDA);
      torch::autograd::profiler::prepareProfiler(config, activities);
      torch::autograd::profiler::enableProfiler(config, activities);
      kineto_ = true;
      return;
    } catch (const c10::Error&) {
      // A LibTorch built without Kineto: the autograd profiler below still traces the CPU.
    }
#endif
    legacy_ = std::make_unique<std::ostringstream>();
    record_ = std::make_unique<torch::autograd::profiler::RecordProfile>(*legacy_);
  }

  /// Stops recording; writes the Chrome trace to `path` (atomically) unless it is empty.
  void stop(const std::string& path) {
#if TORCH_VERSION_MAJOR >= 2
    if (kineto_) {
      kineto_ = false;
      const std::unique_ptr<torch::autograd::profiler::ProfilerResult> result =
          torch::autograd::profiler::disableProfiler();
      if (!path.empty() && result) {
        const std::string tmp = path + ".tmp";
        result->save(tmp);
        std::filesystem::rename(tmp, path);
      }
      return;
    }
#endif
    if (!record_) return;
    record_.reset();  // writes the events to legacy_
    const std::string text = legacy_->str();
    legacy_.reset();
    if (path.empty()) return;
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << text;
      out.close();
      VOLT_CHECK(out.good(), "profiler: could not write the trace {}. HINT: check that the folder is writable.", tmp);
    }
    std::filesystem::rename(tmp, path);
  }

 private:
  bool kineto_ = false;
  std::unique_ptr<std::ostringstream> legacy_;
  std::unique_ptr<torch::autograd::profiler::RecordProfile> record_;
};

/// A named range in LibTorch's trace (RECORD_USER_SCOPE's RecordFunction).
struct TraceRange {
  explicit TraceRange(Action action) : function(at::RecordScope::USER_SCOPE) {
    if (function.isActive()) function.before(fmt::format("volt/{}", to_string(action)));
  }
  at::RecordFunction function;
};

Profiler::Profiler(std::optional<ProfilerKind> kind, int64_t wait, int64_t warmup, int64_t active)
    : kind_(kind), wait_(wait), warmup_(warmup), active_(active) {
  VOLT_CHECK(wait >= 0 && warmup >= 0 && active >= 1,
             "profiler schedule wait={}, warmup={}, active={}: expected wait >= 0, warmup >= 0, active >= 1. HINT: set "
             "--profiler-wait, --profiler-warmup and --profiler-active (the defaults are 1, 1 and 3).",
             wait, warmup, active);
}

Profiler::~Profiler() = default;

Profiler::Scope::Scope(Profiler& profiler, Action action) : profiler_(profiler), action_(action), start_(Clock::now()) {
  if (profiler.tracing_) range_ = std::make_unique<TraceRange>(action);
}

Profiler::Scope::~Scope() {
  range_.reset();
  profiler_.record(action_, elapsed() - excluded_);
}

double Profiler::Scope::elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

void Profiler::record(Action action, double seconds) {
  stage_[action].add(seconds);
  window_[action].add(seconds);
}

void Profiler::start_stage(const std::string& stage, const std::string& trace_path) {
  if (trace_) {
    trace_->stop("");
    trace_.reset();
    tracing_ = false;
  }
  stage_ = ProfileStats{};
  window_ = ProfileStats{};
  stage_name_ = stage;
  stage_start_ = Clock::now();
  trace_path_ = trace_path;
  trace_written_.clear();
  steps_ = 0;
  if (kind_ == ProfilerKind::kPytorch && !trace_path.empty()) {
    const std::filesystem::path folder = std::filesystem::path(trace_path).parent_path();
    if (!folder.empty()) std::filesystem::create_directories(folder);
  }
  if (kind_ == ProfilerKind::kPytorch && wait_ == 0) {
    trace_ = std::make_unique<TraceRecorder>();
    trace_->start();
    tracing_ = true;
  }
}

void Profiler::step_done() {
  ++steps_;
  if (kind_ != ProfilerKind::kPytorch) return;
  // torch.profiler.schedule: `wait` steps untraced, `warmup` traced and thrown away (the first
  // traced steps carry the profiler's own start-up), `active` traced and kept.
  if (steps_ == wait_ && !trace_) {
    trace_ = std::make_unique<TraceRecorder>();
    trace_->start();
    tracing_ = true;
  }
  if (warmup_ > 0 && steps_ == wait_ + warmup_ && trace_) {
    trace_->stop("");
    trace_->start();
  }
  if (steps_ == wait_ + warmup_ + active_ && trace_) {
    trace_->stop(trace_path_);
    trace_written_ = trace_path_;
    trace_.reset();
    tracing_ = false;
  }
}

double Profiler::end_stage() {
  if (trace_) {
    // A stage shorter than the schedule keeps what it traced, warm-up included: something to
    // look at beats nothing.
    if (!trace_path_.empty()) {
      trace_->stop(trace_path_);
      trace_written_ = trace_path_;
    }
    trace_.reset();
    tracing_ = false;
  }
  return std::chrono::duration<double>(Clock::now() - stage_start_).count();
}

ProfileStats Profiler::take_window() {
  ProfileStats window = window_;
  window_ = ProfileStats{};
  return window;
}

}  // namespace volt
