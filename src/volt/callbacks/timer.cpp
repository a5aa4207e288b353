#include "volt/callbacks/timer.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>

#include "volt/core/error.h"
#include "volt/module/lightning_module.h"

namespace volt {

const char* to_string(TimerInterval interval) { return interval == TimerInterval::kStep ? "step" : "epoch"; }

namespace {
// "H:MM:SS" as Python prints a timedelta under a day, which Lightning's message shows.
std::string hms(double seconds) {
  const auto whole = static_cast<int64_t>(seconds);
  return fmt::format("{}:{:02}:{:02}", whole / 3600, whole / 60 % 60, whole % 60);
}
}  // namespace

Timer::Timer(TimerOptions options, Clock clock) : options_(std::move(options)), clock_(std::move(clock)) {
  if (!clock_) clock_ = [] { return std::chrono::steady_clock::now(); };
  VOLT_CHECK(!options_.duration || (std::isfinite(options_.duration->count()) && options_.duration->count() > 0),
             "Timer(duration={} s): the duration must be a positive number of seconds. HINT: pass e.g. "
             "std::chrono::hours(12), or leave it unset to only measure the time.",
             options_.duration ? options_.duration->count() : 0.0);
  VOLT_CHECK(options_.filename.size() > 5 && options_.filename.rfind(".ckpt") == options_.filename.size() - 5,
             "Timer(filename='{}'): a checkpoint's file name must end in .ckpt. HINT: e.g. \"last.ckpt\".",
             options_.filename);
}

void Timer::setup(const FitInfo& info) {
  if (!options_.dirpath.empty()) {
    dirpath_ = options_.dirpath;
  } else {
    dirpath_ = (std::filesystem::path(info.log_dir.empty() ? info.root_dir : info.log_dir) / "checkpoints").string();
  }
  // Each fit counts from its own train start; a resume adds what its checkpoint recorded.
  offset_ = 0.0;
  start_.reset();
  end_.reset();
  time_up_ = false;
  checkpoint_path_.clear();
}

Decision Timer::on_train_start(const CallbackContext&, CallbackServices&) {
  start_ = clock_();
  return {};
}

Decision Timer::on_train_batch_end(const CallbackContext& context, CallbackServices& services) {
  if (options_.interval != TimerInterval::kStep) return {};
  return check(context, services);
}

Decision Timer::on_train_epoch_end(const CallbackContext& context, CallbackServices& services) {
  if (options_.interval != TimerInterval::kEpoch) return {};
  return check(context, services);
}

Decision Timer::check(const CallbackContext& context, CallbackServices& services) {
  if (!options_.duration || context.sanity_checking) return {};
  // Rank 0's clock decides for every process, so that all of them stop at the same step (a
  // collective at every check, as in Lightning).
  const bool up = services.broadcast_decision(time_elapsed() >= options_.duration->count());
  if (!up) return {};
  const std::string why =
      fmt::format("Time limit reached. Elapsed time is {}. Signaling Trainer to stop.", hms(time_elapsed()));
  if (!time_up_ && options_.verbose && context.module != nullptr) context.module->print(why);
  time_up_ = true;
  return Decision::stop_training(why);
}

Decision Timer::on_train_end(const CallbackContext&, CallbackServices& services) {
  end_ = clock_();
  // At the train end every process is here at the same step, whatever ended the epoch early.
  if (time_up_ && options_.save_checkpoint) {
    checkpoint_path_ = (std::filesystem::path(dirpath_) / options_.filename).string();
    services.save_checkpoint(checkpoint_path_);
  }
  return {};
}

double Timer::time_elapsed() const {
  if (!start_) return offset_;
  const auto until = end_ ? *end_ : clock_();
  return offset_ + std::chrono::duration<double>(until - *start_).count();
}

std::optional<double> Timer::time_remaining() const {
  if (!options_.duration) return std::nullopt;
  return options_.duration->count() - time_elapsed();
}

StateDict Timer::state_dict() const {
  StateDict elapsed = make_state_dict();
  elapsed.insert("train", time_elapsed());
  StateDict state = make_state_dict();
  state.insert("time_elapsed", elapsed);
  return state;
}

void Timer::load_state_dict(const StateDict& state) {
  if (!state.contains("time_elapsed")) return;
  const StateDict elapsed = state.at("time_elapsed").toGenericDict();
  if (elapsed.contains("train")) offset_ = elapsed.at("train").toDouble();
}

}  // namespace volt
