#include "volt/plan/process_setup.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <malloc.h>
#include <signal.h>
#include <torch/csrc/autograd/anomaly_mode.h>
#include <torch/torch.h>

namespace volt::internal {

namespace {
std::atomic<int> g_stop_signal{0};
std::atomic<bool> g_requeue_signal{false};

void on_stop_signal(int signal) {
  g_stop_signal.store(signal);
  // A second Ctrl-C must still kill a process stuck somewhere that never polls the flag.
  ::signal(signal, SIG_DFL);
}
void on_requeue_signal(int) { g_requeue_signal.store(true); }

}  // namespace

void tune_allocator() {
  static const bool done = [] {
    // 1 GiB: large tensors stay on the heap and are reused; without this glibc's dynamic
    // threshold keeps mmapping and unmapping step buffers (~400k page faults per MLP epoch).
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    return true;
  }();
  (void)done;
}

ProcessSettingsScope::ProcessSettingsScope(const RunPlan& plan, bool seed)
    : threads_(torch::get_num_threads()),
      deterministic_(at::globalContext().deterministicAlgorithms()),
      deterministic_warn_only_(at::globalContext().deterministicAlgorithmsWarnOnly()) {
  if (plan.tune_allocator) tune_allocator();
  torch::set_num_threads(static_cast<int>(plan.num_threads));
  if (seed && plan.seed) torch::manual_seed(*plan.seed);
  at::globalContext().setDeterministicAlgorithms(plan.deterministic != DeterministicMode::kOff,
                                                 /*warn_only=*/plan.deterministic == DeterministicMode::kWarn);
  // NCCL, the caching allocator and new CUDA tensors use the current device: make it this
  // process's root device. Through the device-generic guard API, so CPU builds compile it too.
  const c10::Device root = plan.root_device();
  if (root.is_cuda()) c10::impl::getDeviceGuardImpl(root.type())->setDevice(root);
}

ProcessSettingsScope::~ProcessSettingsScope() {
  torch::set_num_threads(threads_);
  at::globalContext().setDeterministicAlgorithms(deterministic_, deterministic_warn_only_);
}

AnomalyModeScope::AnomalyModeScope(bool enable)
    : enabled_(torch::autograd::AnomalyMode::is_enabled()),
      check_nan_(torch::autograd::AnomalyMode::should_check_nan()) {
  // AnomalyMode itself rather than DetectAnomalyGuard: the guard turns the mode off when the last
  // guard ends, also for a program that had switched it on itself.
  if (enable) torch::autograd::AnomalyMode::set_enabled(true, /*check_nan=*/true);
}

AnomalyModeScope::~AnomalyModeScope() { torch::autograd::AnomalyMode::set_enabled(enabled_, check_nan_); }

StopSignalGuard::StopSignalGuard() {
  g_stop_signal.store(0);
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // blocking reads (data, Gloo sockets) go on; the flag is polled
  sigaction(SIGINT, &action, &previous_int_);
  sigaction(SIGTERM, &action, &previous_term_);
}

StopSignalGuard::~StopSignalGuard() {
  sigaction(SIGINT, &previous_int_, nullptr);
  if (ignore_sigterm_after_) {
    ::signal(SIGTERM, SIG_IGN);
  } else {
    sigaction(SIGTERM, &previous_term_, nullptr);
  }
}

int StopSignalGuard::received() { return g_stop_signal.load(); }

RequeueSignalGuard::RequeueSignalGuard(int signal) : signal_(signal) {
  struct sigaction action {};
  action.sa_handler = on_requeue_signal;
  sigemptyset(&action.sa_mask);
  // SA_RESTART: a signal landing in a blocking read (data loading, a Gloo socket) must not turn
  // into an EINTR error; the flag is acted on at the next step boundary.
  action.sa_flags = SA_RESTART;
  sigaction(signal_, &action, &previous_);
}

RequeueSignalGuard::~RequeueSignalGuard() { sigaction(signal_, &previous_, nullptr); }

bool RequeueSignalGuard::received() { return g_requeue_signal.load(); }

void RequeueSignalGuard::clear() { g_requeue_signal.store(false); }

}  // namespace volt::internal
