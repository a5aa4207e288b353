// The simple profiler's tables and the text the processes exchange (torch-free).
#include <fmt/format.h>

#include <algorithm>
#include <sstream>

#include "volt/core/error.h"
#include "volt/profiler/profiler.h"
#include "volt/profiler/straggler.h"

namespace volt {
namespace {

constexpr size_t kSideBySideRanks = 8;  // past this, min / median / max columns

std::string ms(double seconds) { return fmt::format("{:.3f}", seconds * 1e3); }

}  // namespace

StepBreakdown step_breakdown(const ProfileStats& stats) {
  StepBreakdown out;
  const ActionStats& step = stats[Action::kTrainStep];
  if (step.count == 0) return out;
  const double steps = static_cast<double>(step.count);
  out.step = step.mean();
  double sum = 0;
  for (const Action part : kStepParts) {
    if (stats[part].count == 0) continue;  // e.g. no gradient synchronization on one process
    const double per_step = stats[part].total / steps;
    out.parts.emplace_back(part, per_step);
    sum += per_step;
  }
  out.other = out.step - sum;
  return out;
}

std::string format_profile(const ProfileStats& stats, const std::string& stage, double stage_seconds) {
  std::ostringstream out;
  out << fmt::format("Profiler report: {} ({:.3f} s)\n", stage, stage_seconds);
  out << fmt::format("{:<20} {:>12} {:>10} {:>12} {:>8}\n", "Action", "Mean (ms)", "Count", "Total (s)", "Share");
  for (size_t i = 0; i < kActionCount; ++i) {
    const ActionStats& a = stats.actions[i];
    if (a.count == 0) continue;
    const double share = stage_seconds > 0 ? 100.0 * a.total / stage_seconds : 0.0;
    out << fmt::format("{:<20} {:>12} {:>10} {:>12.3f} {:>7.1f}%\n", to_string(static_cast<Action>(i)), ms(a.mean()),
                       a.count, a.total, share);
  }
  const StepBreakdown breakdown = step_breakdown(stats);
  if (breakdown.step > 0) {
    out << fmt::format("\nTraining step breakdown (mean {} ms over {} steps)\n", ms(breakdown.step),
                       stats[Action::kTrainStep].count);
    for (const auto& [part, seconds] : breakdown.parts) {
      out << fmt::format("  {:<20} {:>10} ms {:>6.1f}%\n", to_string(part), ms(seconds),
                         100.0 * seconds / breakdown.step);
    }
    out << fmt::format("  {:<20} {:>10} ms {:>6.1f}%\n", "other", ms(breakdown.other),
                       100.0 * breakdown.other / breakdown.step);
  }
  return out.str();
}

std::string format_profile_across_ranks(const std::vector<ProfileStats>& ranks, const std::vector<std::string>& hosts) {
  VOLT_INTERNAL_ASSERT(ranks.size() == hosts.size(), "{} ranks, {} hosts", ranks.size(), hosts.size());
  std::ostringstream out;
  out << "Mean time per action (ms) on every process\n";
  const bool side_by_side = ranks.size() <= kSideBySideRanks;
  out << fmt::format("{:<20}", "Action");
  if (side_by_side) {
    for (size_t r = 0; r < ranks.size(); ++r) out << fmt::format(" {:>12}", fmt::format("rank {}", r));
    out << "\n" << fmt::format("{:<20}", "");
    for (const std::string& host : hosts) out << fmt::format(" {:>12}", host.substr(0, 12));
  } else {
    out << fmt::format(" {:>10} {:>10} {:>10}  {}", "min", "median", "max", "slowest");
  }
  out << "\n";
  for (size_t i = 0; i < kActionCount; ++i) {
    std::vector<double> means;
    bool ran = false;
    for (const ProfileStats& stats : ranks) {
      means.push_back(stats.actions[i].mean());
      ran = ran || stats.actions[i].count > 0;
    }
    if (!ran) continue;
    out << fmt::format("{:<20}", to_string(static_cast<Action>(i)));
    if (side_by_side) {
      for (const double mean : means) out << fmt::format(" {:>12}", ms(mean));
    } else {
      const auto slowest = static_cast<size_t>(std::max_element(means.begin(), means.end()) - means.begin());
      out << fmt::format(" {:>10} {:>10} {:>10}  rank {} on {}", ms(*std::min_element(means.begin(), means.end())),
                         ms(median(means)), ms(means[slowest]), slowest, hosts[slowest]);
    }
    out << "\n";
  }
  return out.str();
}

std::string encode_profile_stats(const ProfileStats& stats) {
  std::ostringstream out;
  out.precision(17);
  for (const ActionStats& a : stats.actions) out << a.count << ' ' << a.total << ' ' << a.min << ' ' << a.max << ' ';
  return out.str();
}

ProfileStats decode_profile_stats(const std::string& text) {
  ProfileStats stats;
  std::istringstream in(text);
  for (ActionStats& a : stats.actions) {
    in >> a.count >> a.total >> a.min >> a.max;
    VOLT_CHECK(!in.fail(),
               "profiler: another process sent statistics this one cannot read ('{}'). HINT: run the "
               "same Volt build on every process.",
               text.substr(0, 80));
  }
  return stats;
}

}  // namespace volt
