// A recording fake of CallbackServices for callback tests.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <set>

#include "volt/callbacks/callback.h"

namespace volt::testing {

/// A steady clock that moves only when the test moves it, for callbacks that take a Clock.
struct ManualClock {
  std::chrono::steady_clock::time_point now{};
  /// The clock to hand to the callback; it reads `now` whenever called.
  std::function<std::chrono::steady_clock::time_point()> clock() {
    return [this] { return now; };
  }
  /// Moves the clock `seconds` ahead.
  void advance(double seconds) {
    now += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(seconds));
  }
};

/// Records saves, removals and logged metrics instead of touching files.
class RecordingServices : public CallbackServices {
 public:
  void save_checkpoint(const std::string& path) override {
    saved.push_back(path);
    present.insert(path);
  }
  void save_weights_checkpoint(const std::string& path) override {
    weights_only.insert(path);
    save_checkpoint(path);
  }
  bool broadcast_decision(bool decision) override {
    ++broadcasts;
    return rank0_decision ? *rank0_decision : decision;
  }
  void remove_checkpoint(const std::string& path) override {
    removed.push_back(path);
    present.erase(path);
  }
  void log_metrics(const std::map<std::string, double>& metrics) override { logged.push_back(metrics); }

  /// Every save, in order.
  std::vector<std::string> saved;
  /// Every removal, in order.
  std::vector<std::string> removed;
  /// The files that would exist now.
  std::set<std::string> present;
  /// The saves that were weights-only (also listed in `saved`).
  std::set<std::string> weights_only;
  /// How many times broadcast_decision was called (every process must call it alike).
  int broadcasts = 0;
  /// What global rank 0 decided, as another rank would receive it; unset: this is rank 0.
  std::optional<bool> rank0_decision;
  /// Every log_metrics call.
  std::vector<std::map<std::string, double>> logged;
};

}  // namespace volt::testing
