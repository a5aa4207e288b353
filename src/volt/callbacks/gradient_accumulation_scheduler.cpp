#include "volt/callbacks/gradient_accumulation_scheduler.h"

#include "volt/core/error.h"

namespace volt {

GradientAccumulationScheduler::GradientAccumulationScheduler(std::map<int64_t, int64_t> scheduling)
    : scheduling_(std::move(scheduling)) {
  VOLT_CHECK(!scheduling_.empty(),
             "GradientAccumulationScheduler got an empty schedule. HINT: map first epochs to batch counts, e.g. "
             "{{{{0, 8}}, {{4, 4}}}}.");
  for (const auto& [epoch, factor] : scheduling_) {
    VOLT_CHECK(epoch >= 0,
               "GradientAccumulationScheduler: epoch {} is negative; the schedule's keys are 0-based epochs. HINT: "
               "start the schedule at epoch 0.",
               epoch);
    VOLT_CHECK(factor >= 1,
               "GradientAccumulationScheduler: epoch {} accumulates {} batches; a factor must be >= 1. HINT: 1 "
               "steps the optimizer after every batch.",
               epoch, factor);
  }
}

std::optional<int64_t> GradientAccumulationScheduler::accumulate_grad_batches(int64_t epoch) const {
  // The last key at or before `epoch`; none: the epochs before the schedule accumulate 1.
  auto it = scheduling_.upper_bound(epoch);
  if (it == scheduling_.begin()) return 1;
  return std::prev(it)->second;
}

}  // namespace volt
