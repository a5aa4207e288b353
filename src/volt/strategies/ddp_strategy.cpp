#include "volt/strategies/ddp_strategy.h"

#include <signal.h>
#include <torch/csrc/autograd/engine.h>

#include <thread>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/distributed/subprocess_launcher.h"
#include "volt/module/lightning_module.h"

namespace volt {

DdpStrategy::DdpStrategy(Topology topology, DdpOptions options, Env env)
    : topology_(std::move(topology)), options_(std::move(options)), env_(std::move(env)) {}

DdpStrategy::~DdpStrategy() = default;

void DdpStrategy::setup_environment(LightningModule& module) {
  if (group_) return;
  if (options_.launch_local_processes && !launcher_) {
    launcher_ = std::make_unique<SubprocessLauncher>(topology_, own_command_line(), env_);
  }
  ProcessGroupOptions pg_options = options_.process_group;
  if (launcher_) {
    // A launched local rank that died ends the wait first; then whatever the caller checks.
    SubprocessLauncher* launcher = launcher_.get();
    pg_options.abort_check = [launcher, outer = options_.process_group.abort_check]() {
      if (auto failure = launcher->failure()) return failure;
      return outer ? outer() : std::nullopt;
    };
  }
  group_ = module.init_ddp_connection(topology_, pg_options);
  if (!group_) group_ = std::make_shared<ProcessGroup>(topology_, pg_options);
}

ProcessGroup& DdpStrategy::process_group() {
  VOLT_INTERNAL_ASSERT(group_ != nullptr, "process_group() before setup_environment()");
  return *group_;
}

void DdpStrategy::setup_module(LightningModule& module) {
  broadcast_module(module);
  arm_synchronizer(module);
}

void DdpStrategy::broadcast_module(LightningModule& module) {
  ProcessGroup& group = process_group();
  std::vector<torch::Tensor> state;
  int64_t numel = 0;
  for (const auto& item : module.named_parameters(true)) {
    state.push_back(item.value());
    numel += item.value().numel();
  }
  buffers_.clear();
  for (const auto& item : module.named_buffers(true)) {
    state.push_back(item.value());
    buffers_.push_back(item.value());
  }
  // Every rank must hold the same model: compare counts before the broadcast would misalign.
  torch::Tensor shape = torch::tensor({static_cast<double>(state.size()), static_cast<double>(numel)}, torch::kDouble);
  torch::Tensor low = shape.clone();
  group.all_reduce(shape, Reduce::kMax);
  group.all_reduce(low, Reduce::kMin);
  VOLT_CHECK(
      torch::equal(shape, low),
      "rank {} holds a model with {} tensors and {} values, but other ranks differ (max {} tensors / {} values). "
      "HINT: every process must build the same module; check code that depends on the rank.",
      topology_.global_rank, state.size(), numel, shape[0].item<double>(), shape[1].item<double>());
  {
    torch::NoGradGuard no_grad;
    group.broadcast(state, 0);
  }
}

void DdpStrategy::arm_synchronizer(LightningModule& module) {
  std::vector<torch::Tensor> parameters;
  std::vector<std::string> names;
  for (const auto& item : module.named_parameters(true)) {
    if (!item.value().requires_grad()) continue;
    parameters.push_back(item.value());
    names.push_back(item.key());
  }
  ProcessGroup& group = process_group();
  synchronizer_.reset();  // the old Reducer's autograd hooks go before the new one's are set
  synchronizer_ = module.configure_ddp(group, options_.gradient_sync);
  if (!synchronizer_) {
    synchronizer_ = std::make_shared<ReducerSynchronizer>(parameters, names, group.backend(), options_.gradient_sync);
  }
  synchronized_ = std::move(names);
}

void DdpStrategy::sync_trainable_parameters(LightningModule& module) {
  if (agreed_trainable_parameters(module) == synchronized_) return;
  arm_synchronizer(module);
}

std::vector<std::string> DdpStrategy::agreed_trainable_parameters(LightningModule& module) {
  std::vector<std::string> trainable;
  int64_t numel = 0;
  for (const auto& item : module.named_parameters(true)) {
    if (!item.value().requires_grad()) continue;
    trainable.push_back(item.key());
    numel += item.value().numel();
  }
  // Every epoch, changed or not: a process that unfroze alone would otherwise wait in a
  // collective the others never join. Two numbers per epoch cost nothing next to its steps.
  torch::Tensor shape =
      torch::tensor({static_cast<double>(trainable.size()), static_cast<double>(numel)}, torch::kDouble);
  torch::Tensor low = shape.clone();
  process_group().all_reduce(shape, Reduce::kMax);
  process_group().all_reduce(low, Reduce::kMin);
  VOLT_CHECK(torch::equal(shape, low),
             "rank {} trains {} parameter tensors ({} values) this epoch, but other ranks train a different set (max "
             "{} tensors / {} values). HINT: freeze and unfreeze layers on every process at the same epoch, e.g. in "
             "on_train_epoch_start by the epoch number alone.",
             topology_.global_rank, trainable.size(), numel, shape[0].item<double>(), shape[1].item<double>());
  return trainable;
}

void DdpStrategy::before_forward(LightningModule&) {
  if (buffers_.empty()) return;
  torch::NoGradGuard no_grad;
  process_group().broadcast(buffers_, 0);
}

void DdpStrategy::before_backward(const torch::Tensor& loss, bool synchronize) {
  if (!synchronize) return;
  start_sync_clock(loss);
  synchronizer_->prepare_for_backward(loss);
}

void DdpStrategy::after_backward(bool synchronize) {
  if (synchronize) stop_sync_clock();
}

void DdpStrategy::start_sync_clock(const torch::Tensor& loss) {
  sync_wait_ = 0;
  compute_done_ = std::make_shared<std::optional<std::chrono::steady_clock::time_point>>();
  if (!loss.requires_grad() || loss.is_leaf()) return;
  // The hook runs as backward starts, on the engine's thread, where callbacks may be queued.
  loss.register_hook([done = compute_done_](const torch::Tensor&) {
    torch::autograd::Engine::get_default_engine().queue_callback([done] { *done = std::chrono::steady_clock::now(); });
  });
}

void DdpStrategy::stop_sync_clock() {
  if (compute_done_ && compute_done_->has_value()) {
    sync_wait_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - **compute_done_).count();
  }
  compute_done_.reset();
}

std::string DdpStrategy::on_failure(const std::string& message) {
  // Errors of the process group name the rank already ("rank 1 on node2 could not reach ...").
  const std::string prefix = fmt::format("rank {} on {}", topology_.global_rank, topology_.host);
  std::string mine = message.rfind(prefix, 0) == 0 ? message : fmt::format("{}: {}", prefix, message);
  // A local rank that died (SIGKILL) cannot report itself: give the launcher's monitor a moment
  // to see its exit status, which is the real first failure.
  std::optional<std::string> launcher_failure;
  if (launcher_) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (!(launcher_failure = launcher_->failure()) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  std::optional<std::string> reported;
  if (group_) {
    reported = group_->reported_failure();
    if (!reported && !launcher_failure) {
      const std::string named = name_missing_ranks(mine);
      // The wait gave a rank that failed on its own (and so never checked in) time to say so:
      // its error is the first one, not this one's.
      reported = group_->reported_failure();
      if (!reported) {
        mine = named;
        group_->report_failure(mine);
      }
    }
  }
  if (launcher_) launcher_->terminate_all(std::chrono::seconds(3));
  if (launcher_failure && !reported) {
    return fmt::format("rank {} on {}: stopping all processes because {}", topology_.global_rank, topology_.host,
                       *launcher_failure);
  }
  if (!reported || *reported == mine) return mine;
  // The first failing rank printed its own error; repeating it here would bury it.
  const std::string who = reported->substr(0, reported->find(':'));
  return fmt::format("rank {} on {}: stopped because {} failed first (its error is printed by that process)",
                     topology_.global_rank, topology_.host, who);
}

std::string DdpStrategy::name_missing_ranks(const std::string& message) {
  // Gloo says only that its peer went quiet or away; a rank that hangs (or died under another
  // launcher) reports nothing itself. Every rank that failed in the collective checks in here:
  // the ones that never do are the culprits.
  const std::string lower = to_lower(message);
  const bool communication =
      lower.find("timeout") != std::string::npos || lower.find("timed out") != std::string::npos ||
      lower.find("connection closed") != std::string::npos || lower.find("connection reset") != std::string::npos;
  if (!communication || topology_.world_size < 2) return message;
  const std::optional<std::vector<int64_t>> absent =
      group_->absent_ranks("collective-failure", std::chrono::seconds(3));
  if (!absent || absent->empty()) return message;
  std::vector<std::string> names;
  for (const int64_t r : *absent) names.push_back(std::to_string(r));
  return fmt::format(
      "{} (rank {} never reached the failed collective: it hangs, is stuck outside the collective or "
      "is gone. HINT: look at that rank's output, or attach a debugger (gdb -p) to see where it "
      "stands.)",
      message, join(names, ", rank "));
}

void DdpStrategy::teardown() {
  if (launcher_) {
    const bool ok = launcher_->wait(std::chrono::seconds(60));
    if (!ok) {
      const auto failure = launcher_->failure();
      launcher_->signal_all(SIGTERM);
      throw Error(fmt::format("rank 0 finished, but {}. HINT: see that process's error above.",
                              failure.value_or("local processes did not exit within 60 s")));
    }
  }
}

}  // namespace volt
