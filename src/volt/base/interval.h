// When a learning-rate scheduler steps: the vocabulary that a module's scheduler configs and the
// callbacks that watch learning rates (LearningRateMonitor) share, so that volt::callbacks' small
// interface needs no LibTorch module header.
#pragma once

namespace volt {

/// When a learning-rate scheduler steps: after every epoch or after every optimizer step.
enum class Interval { kEpoch, kStep };
/// "epoch" or "step".
const char* to_string(Interval interval);

}  // namespace volt
