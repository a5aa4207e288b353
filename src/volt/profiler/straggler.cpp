#include "volt/profiler/straggler.h"

#include <fmt/format.h>

#include <algorithm>
#include <sstream>

#include "volt/core/error.h"

namespace volt {
namespace {

/// The median of `values` without the one at `skip`.
double median_of_others(const std::vector<double>& values, size_t skip) {
  std::vector<double> others;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i != skip) others.push_back(values[i]);
  }
  return median(std::move(others));
}

// Below this a phase's excess is noise (a clock read, a cache miss), not a slow phase.
constexpr double kNoiseSeconds = 20e-6;

}  // namespace

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

RankTiming rank_timing(const ProfileStats& window, int64_t rank, const std::string& host) {
  RankTiming t;
  t.rank = rank;
  t.host = host;
  t.steps = window[Action::kTrainStep].count;
  if (t.steps == 0) return t;
  const double n = static_cast<double>(t.steps);
  t.step = window[Action::kTrainStep].total / n;
  t.wait = window[Action::kGradSync].total / n;
  t.data = (window[Action::kDataFetch].total + window[Action::kTransfer].total) / n;
  t.forward = window[Action::kForward].total / n;
  t.backward = window[Action::kBackward].total / n;
  t.optimizer = window[Action::kOptimizerStep].total / n;
  return t;
}

std::string encode_rank_timing(const RankTiming& t) {
  std::ostringstream out;
  out.precision(17);
  // The host goes last: it is the one field that is not a number (and has no spaces).
  out << t.rank << ' ' << t.steps << ' ' << t.step << ' ' << t.wait << ' ' << t.data << ' ' << t.forward << ' '
      << t.backward << ' ' << t.optimizer << ' ' << (t.host.empty() ? "?" : t.host);
  return out.str();
}

RankTiming decode_rank_timing(const std::string& text) {
  RankTiming t;
  std::istringstream in(text);
  in >> t.rank >> t.steps >> t.step >> t.wait >> t.data >> t.forward >> t.backward >> t.optimizer >> t.host;
  VOLT_CHECK(!in.fail(),
             "straggler report: another process sent timings this one cannot read ('{}'). HINT: run the same Volt "
             "build on every process.",
             text.substr(0, 80));
  return t;
}

std::string describe(const Straggler& s) {
  return fmt::format("rank {} on {} is {:.2f}x slower than the others' median ({} {:.2f}x) for {} checks in a row",
                     s.rank, s.host, s.ratio, s.phase, s.phase_ratio, s.windows);
}

StragglerDetector::StragglerDetector(double threshold, int64_t patience) : threshold_(threshold), patience_(patience) {
  VOLT_CHECK(threshold > 0 && patience >= 1,
             "straggler report: threshold={} must be > 0 and patience={} >= 1. HINT: set --straggler-threshold to a "
             "positive share, e.g. the default 0.2 (20% slower than the others' median).",
             threshold, patience);
}

std::vector<Straggler> StragglerDetector::update(const std::vector<RankTiming>& given) {
  std::vector<Straggler> out;
  if (given.size() < 2) return out;
  std::vector<RankTiming> ranks = given;
  std::sort(ranks.begin(), ranks.end(), [](const RankTiming& a, const RankTiming& b) { return a.rank < b.rank; });
  // A process that took no step in this window (a replay at the end of its data) says nothing.
  for (const RankTiming& r : ranks) {
    if (r.steps == 0) return out;
  }
  if (slow_checks_.size() != ranks.size()) slow_checks_.assign(ranks.size(), 0);
  std::vector<double> busy;
  for (const RankTiming& r : ranks) busy.push_back(r.busy());
  const auto column = [&ranks](double RankTiming::*field) {
    std::vector<double> values;
    for (const RankTiming& r : ranks) values.push_back(r.*field);
    return values;
  };
  const std::pair<const char*, double RankTiming::*> phases[] = {{"data", &RankTiming::data},
                                                                 {"forward", &RankTiming::forward},
                                                                 {"backward", &RankTiming::backward},
                                                                 {"optimizer", &RankTiming::optimizer}};
  for (size_t i = 0; i < ranks.size(); ++i) {
    const double others = median_of_others(busy, i);
    const bool slow = others > 0 && busy[i] > others * (1.0 + threshold_) && busy[i] - others > kNoiseSeconds;
    slow_checks_[i] = slow ? slow_checks_[i] + 1 : 0;
    if (slow_checks_[i] < patience_) continue;
    Straggler s;
    s.rank = ranks[i].rank;
    s.host = ranks[i].host;
    s.ratio = busy[i] / others;
    s.windows = slow_checks_[i];
    double worst = -1;
    for (const auto& [name, field] : phases) {
      const std::vector<double> values = column(field);
      const double typical = median_of_others(values, i);
      const double excess = values[i] - typical;
      if (excess > worst) {
        worst = excess;
        s.phase = name;
        s.phase_ratio = typical > 0 ? values[i] / typical : 0.0;
      }
    }
    out.push_back(s);
  }
  return out;
}

}  // namespace volt
