// A recording fake of CallbackServices for callback tests.
#pragma once

#include <set>

#include "volt/callbacks/callback.h"

namespace volt::testing {

/// Records saves, removals and logged metrics instead of touching files.
class RecordingServices : public CallbackServices {
 public:
  void save_checkpoint(const std::string& path) override {
    saved.push_back(path);
    present.insert(path);
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
  /// Every log_metrics call.
  std::vector<std::map<std::string, double>> logged;
};

}  // namespace volt::testing
