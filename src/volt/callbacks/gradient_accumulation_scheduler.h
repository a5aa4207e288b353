// Lightning's GradientAccumulationScheduler: how many batches to accumulate, by epoch.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "volt/callbacks/callback.h"

namespace volt {

/// Changes accumulate_grad_batches by epoch, as Lightning's GradientAccumulationScheduler does:
/// `{{0, 8}, {4, 4}, {8, 1}}` accumulates 8 batches in epochs 0-3, 4 in epochs 4-7 and 1 from
/// epoch 8 on; epochs before the first key accumulate 1. The factor is a pure function of the
/// epoch, so a resumed run accumulates exactly as an uninterrupted one. The Trainer's own
/// accumulate_grad_batches must stay 1, and manual optimization is refused (both as in Lightning).
class GradientAccumulationScheduler : public Callback {
 public:
  /// Throws volt::Error for an empty schedule, a negative epoch or a factor below 1.
  explicit GradientAccumulationScheduler(std::map<int64_t, int64_t> scheduling);

  std::string state_key() const override { return "GradientAccumulationScheduler"; }
  std::optional<int64_t> accumulate_grad_batches(int64_t epoch) const override;

  /// The schedule, {first epoch: batches to accumulate}.
  const std::map<int64_t, int64_t>& scheduling() const { return scheduling_; }

 private:
  std::map<int64_t, int64_t> scheduling_;
};

}  // namespace volt
