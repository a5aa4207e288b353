#include "volt/loops/stop_controller.h"

#include <utility>

namespace volt {

const char* to_string(StopCode code) {
  switch (code) {
    case StopCode::kNone:
      return "none";
    case StopCode::kCallback:
      return "callback";
    case StopCode::kInterrupt:
      return "interrupt";
    case StopCode::kTerminate:
      return "terminate";
    case StopCode::kRequeue:
      return "requeue";
  }
  return "?";
}

void StopController::propose_callback_stop(int64_t epoch, int64_t global_step, std::string why) {
  // min_epochs and min_steps win over callbacks, as in Lightning; limits and signals always stop.
  if (epoch + 1 < min_epochs_ || global_step < min_steps_) return;
  if (proposed_ != StopCode::kNone) return;
  proposed_ = StopCode::kCallback;
  proposed_why_ = std::move(why);
}

void StopController::propose_interrupt(StopCode code, std::string why) {
  if (proposed_ >= code) return;
  proposed_ = code;
  proposed_why_ = std::move(why);
}

void StopController::stop_at_limit(StopReason limit) {
  if (should_stop()) return;
  limit_ = true;
  reason_ = limit;
  message_.clear();
}

void StopController::settle_pending() {
  if (!pending_) return;
  const double agreed = pending_->wait();
  pending_.reset();
  decide(static_cast<StopCode>(static_cast<int>(agreed)));
}

void StopController::agree(Collectives& collectives) {
  settle_pending();
  decide(static_cast<StopCode>(static_cast<int>(collectives.all_reduce(static_cast<double>(proposed_), Reduce::kMax))));
}

void StopController::agree_async(Collectives& collectives) {
  settle_pending();
  pending_ = collectives.all_reduce_async(static_cast<double>(proposed_), Reduce::kMax);
}

void StopController::decide(StopCode agreed) {
  // Decisions only get stronger: a requeue agreed later replaces a callback stop agreed earlier
  // in the same step, never the other way round.
  if (finished_ || agreed <= decided_) return;
  if (decided_ == StopCode::kNone && limit_ && agreed == StopCode::kCallback) return;
  decided_ = agreed;
  const bool mine = agreed == proposed_;
  switch (agreed) {
    case StopCode::kNone:
      return;
    case StopCode::kCallback:
      reason_ = StopReason::kCallback;
      message_ = mine ? proposed_why_ : "a callback on another process stopped training";
      return;
    case StopCode::kInterrupt:
      reason_ = StopReason::kInterrupted;
      message_ = mine ? proposed_why_ : "another process was interrupted";
      return;
    case StopCode::kTerminate:
      reason_ = StopReason::kInterrupted;
      message_ = mine ? proposed_why_ : "another process received SIGTERM";
      return;
    case StopCode::kRequeue:
      reason_ = StopReason::kRequeued;
      message_ = mine ? proposed_why_ : "another process received SLURM's requeue signal";
      return;
  }
}

void StopController::finish_at(StopReason limit) {
  // Final: the proposal that led here must not be decided again by a later agreement (the
  // end-of-fit callbacks still dispatch).
  finished_ = true;
  decided_ = StopCode::kNone;
  limit_ = true;
  reason_ = limit;
  message_.clear();
}

}  // namespace volt
