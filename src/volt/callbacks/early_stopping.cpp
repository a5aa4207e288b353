#include "volt/callbacks/early_stopping.h"

#include <cmath>

#include "volt/core/error.h"

namespace volt {

EarlyStopping::EarlyStopping(EarlyStoppingOptions options) : options_(std::move(options)) {
  VOLT_CHECK(!options_.monitor.empty(),
             "EarlyStopping needs a metric to monitor. HINT: pass {{.monitor = \"val/loss\"}}.");
  VOLT_CHECK(options_.patience >= 0,
             "EarlyStopping patience={} must be >= 0. HINT: 3 (the default) stops after 3 checks without improvement; "
             "0 stops at the first one.",
             options_.patience);
  VOLT_CHECK(options_.min_delta >= 0,
             "EarlyStopping min_delta={} must be >= 0 (it is applied in the "
             "direction of `mode`). HINT: use 0.0 (the default) to count any improvement.",
             options_.min_delta);
  best_score_ =
      options_.mode == Mode::kMin ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
}

std::string EarlyStopping::state_key() const {
  return fmt::format("EarlyStopping{{'monitor': '{}', 'mode': '{}'}}", options_.monitor, to_string(options_.mode));
}

void EarlyStopping::setup(const FitInfo& info) {
  check_on_train_epoch_end_ = options_.check_on_train_epoch_end.value_or(!info.has_validation);
}

Decision EarlyStopping::on_train_epoch_end(const CallbackContext& context, CallbackServices&) {
  if (!check_on_train_epoch_end_) return {};
  return evaluate(context);
}

Decision EarlyStopping::on_validation_end(const CallbackContext& context, CallbackServices&) {
  if (check_on_train_epoch_end_ || context.sanity_checking) return {};
  return evaluate(context);
}

Decision EarlyStopping::evaluate(const CallbackContext& context) {
  const double current = internal::monitored_value(context.metrics, options_.monitor, "EarlyStopping");
  const bool min = options_.mode == Mode::kMin;
  const auto better = [min](double a, double b) { return min ? a < b : a > b; };
  const std::string name = options_.monitor;
  // Lightning's stopped_epoch: the epoch it stopped in, 0 while it has not.
  const auto stop = [&](std::string why) {
    stopped_epoch_ = context.epoch;
    return Decision::stop_training(std::move(why));
  };
  if (options_.check_finite && !std::isfinite(current)) {
    return stop(
        fmt::format("Monitored metric {} = {} is not finite. Previous best value "
                    "was {:.3f}. Signaling Trainer to stop.",
                    name, current, best_score_));
  }
  if (options_.stopping_threshold && !better(*options_.stopping_threshold, current)) {
    return stop(fmt::format("Stopping threshold reached: {} = {} {} {}.", name, current,
                            min ? "<=" : ">=", *options_.stopping_threshold));
  }
  if (options_.divergence_threshold && !better(current, *options_.divergence_threshold)) {
    return stop(fmt::format("Divergence threshold reached: {} = {} {} {}.", name, current,
                            min ? ">=" : "<=", *options_.divergence_threshold));
  }
  const double shifted = min ? current + options_.min_delta : current - options_.min_delta;
  if (better(shifted, best_score_)) {
    best_score_ = current;
    wait_count_ = 0;
    return {};
  }
  ++wait_count_;
  if (wait_count_ >= options_.patience) {
    return stop(
        fmt::format("Monitored metric {} did not improve in the last {} records. "
                    "Best score: {:.3f}. Signaling Trainer to stop.",
                    name, wait_count_, best_score_));
  }
  return {};
}

StateDict EarlyStopping::state_dict() const {
  StateDict state = make_state_dict();
  state.insert("wait_count", wait_count_);
  state.insert("stopped_epoch", stopped_epoch_);
  state.insert("best_score", internal::score_tensor(best_score_));
  state.insert("patience", options_.patience);
  return state;
}

void EarlyStopping::load_state_dict(const StateDict& state) {
  if (state.contains("wait_count")) wait_count_ = state.at("wait_count").toInt();
  if (state.contains("stopped_epoch")) stopped_epoch_ = state.at("stopped_epoch").toInt();
  if (state.contains("best_score")) best_score_ = internal::score_value(state.at("best_score"));
}

}  // namespace volt
