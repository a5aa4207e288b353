// The straggler report: under ddp every process waits for the slowest in each gradient
// all-reduce, so one slow process (a throttled GPU, a busy host, slow storage) slows the whole
// job without failing. Every N steps the processes exchange their step times and waits; a
// process persistently slower than the others is named, with its host and its slow phase.
// Pure and torch-free: the exchange is the caller's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "volt/profiler/profiler.h"

namespace volt {

/// The median of `values` (the mean of the middle two for an even count; 0 for none): what the
/// straggler report compares each process with, and the ranks table's middle column.
double median(std::vector<double> values);

/// One process's training steps over a window, in seconds per step.
struct RankTiming {
  int64_t rank = 0;      ///< global rank
  std::string host;      ///< its host
  int64_t steps = 0;     ///< training steps in the window
  double step = 0;       ///< the whole step
  double wait = 0;       ///< waiting for the gradient all-reduce (for the others)
  double data = 0;       ///< fetching and moving the batch
  double forward = 0;    ///< training_step
  double backward = 0;   ///< the backward pass, less the wait
  double optimizer = 0;  ///< the optimizer step
  /// The step less its wait: the time this process itself needs, which the others wait for.
  double busy() const { return step - wait; }
};
/// The window's mean per step of each phase of `window` (Profiler::take_window's).
RankTiming rank_timing(const ProfileStats& window, int64_t rank, const std::string& host);
/// `timing` as one line of text that decode_rank_timing reads back.
std::string encode_rank_timing(const RankTiming& timing);
/// What encode_rank_timing wrote; throws volt::Error on anything else.
RankTiming decode_rank_timing(const std::string& text);

/// A process named as a straggler.
struct Straggler {
  int64_t rank = 0;        ///< its global rank
  std::string host;        ///< its host
  double ratio = 0;        ///< its busy time over the median of the others'
  std::string phase;       ///< its phase furthest above the others' median: data, forward, backward, optimizer
  double phase_ratio = 0;  ///< that phase over the others' median of it
  int64_t windows = 0;     ///< checks in a row it has been slow
};
/// "rank 1 on node7 is 1.85x slower than the others' median (forward 2.40x) for 3 checks".
std::string describe(const Straggler& straggler);

/// Names the processes whose busy time exceeds the median of the others' by more than
/// `threshold` (0.2: 20%) in `patience` checks in a row. Leave-one-out medians, so that with two
/// processes the slow one is compared with the other, not with their mean.
class StragglerDetector {
 public:
  /// Throws volt::Error unless threshold > 0 and patience >= 1.
  StragglerDetector(double threshold, int64_t patience);
  /// One check: every process's timing (any order; at least one step each, or the check is
  /// skipped). Returns the stragglers now: slow in `patience` checks in a row.
  std::vector<Straggler> update(const std::vector<RankTiming>& ranks);

 private:
  double threshold_;
  int64_t patience_;
  std::vector<int64_t> slow_checks_;  // per rank: checks in a row it was slow
};

}  // namespace volt
