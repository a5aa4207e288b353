#include "volt/options/trainer_options.h"

#include <cmath>

#include "volt/core/error.h"
#include "volt/core/strings.h"

namespace volt {

BatchLimit BatchLimit::parse(const std::string& text, const std::string& what) {
  const std::string t = trim(text);
  const bool looks_fractional = t.find_first_of(".eE") != std::string::npos;
  if (!looks_fractional) {
    if (const auto count = parse_int(t); count && *count >= 0) return BatchLimit(static_cast<long long>(*count));
  } else if (const auto fraction = parse_double(t); fraction && *fraction >= 0.0 && *fraction <= 1.0) {
    return BatchLimit(*fraction);
  }
  throw Error(
      fmt::format("{}='{}' is out of range; expected a batch count (an integer >= 0, e.g. 10) or a "
                  "fraction of the epoch in [0.0, 1.0] (e.g. 0.25). HINT: write 1.0 for all batches.",
                  what, text));
}

std::chrono::duration<double> parse_duration(const std::string& text, const std::string& what) {
  const std::string t = trim(text);
  const std::vector<std::string> parts = split(t, ':');
  std::optional<double> seconds;
  if (parts.size() == 1) {
    seconds = parse_double(t);
  } else if (parts.size() == 4) {
    double total = 0;
    bool whole = true;
    const double unit[] = {86400.0, 3600.0, 60.0, 1.0};
    for (size_t i = 0; i < 4 && whole; ++i) {
      const auto value = parse_int(trim(parts[i]));
      whole = value && *value >= 0;
      if (whole) total += static_cast<double>(*value) * unit[i];
    }
    if (whole) seconds = total;
  }
  if (seconds && std::isfinite(*seconds) && *seconds > 0) return std::chrono::duration<double>(*seconds);
  throw Error(
      fmt::format("{}='{}' is not a duration; expected \"DD:HH:MM:SS\" (days, hours, minutes and seconds, "
                  "e.g. \"00:12:00:00\" for 12 hours) or a positive number of seconds (e.g. 3600). HINT: "
                  "leave it unset for no time limit.",
                  what, text));
}

std::string format_duration(std::chrono::duration<double> duration) {
  const double seconds = duration.count();
  if (seconds != std::floor(seconds) || seconds < 0) return fmt::format("{}", seconds);
  const auto s = static_cast<int64_t>(seconds);
  return fmt::format("{:02}:{:02}:{:02}:{:02}", s / 86400, s / 3600 % 24, s / 60 % 60, s % 60);
}

int64_t BatchLimit::resolve(int64_t available) const {
  if (!is_fraction_) return std::min(count_, available);
  const auto n = static_cast<int64_t>(std::floor(static_cast<double>(available) * fraction_));
  return (n == 0 && fraction_ > 0.0 && available > 0) ? 1 : n;
}

std::optional<int64_t> BatchLimit::resolve_unknown(const std::string& what) const {
  if (!is_fraction_) return count_;
  VOLT_CHECK(fraction_ == 1.0,
             "{}={} is a fraction of an epoch, but the data is a stream (an IterableDataset) whose length is "
             "unknown. HINT: give a number of batches instead, e.g. {}=100.",
             what, to_string(), what);
  return std::nullopt;
}

std::string BatchLimit::to_string() const {
  if (!is_fraction_) return std::to_string(count_);
  // "1.0", not "1": a fraction must not read like a count of one batch. (Not fmt's "{:#}", whose
  // output for 1.0 changed from "1.0" to "1." in fmt 10, which upstream LibTorch ships.)
  std::string text = fmt::format("{}", fraction_);
  if (text.find_first_of(".en") == std::string::npos) text += ".0";
  return text;
}

DeviceRequest::DeviceRequest(const std::string& text) : is_auto_(false) {
  const std::string t = to_lower(trim(text));
  if (t == "auto") {
    is_auto_ = true;
    return;
  }
  if (const auto count = parse_int(t)) {
    VOLT_CHECK(*count >= -1,
               "devices={} is invalid; expected a count >= 1, -1 for all, \"auto\", or a list "
               "like \"0,1\". HINT: -1 takes every device; write a count, \"auto\" or indices.",
               text);
    count_ = static_cast<int>(*count);
    return;
  }
  std::string inner = t;
  if (!inner.empty() && inner.front() == '[' && inner.back() == ']') inner = inner.substr(1, inner.size() - 2);
  for (const std::string& item : split(inner, ',')) {
    const auto index = parse_int(item);
    VOLT_CHECK(index && *index >= 0,
               "devices='{}' is invalid; expected a count (2), -1 for all, \"auto\", or device indices like "
               "\"0,1\". HINT: separate indices with commas.",
               text);
    indices_.push_back(static_cast<int>(*index));
  }
}

DeviceRequest::DeviceRequest(int count) : count_(count), is_auto_(false) {
  VOLT_CHECK(count >= -1,
             "devices={} is invalid; expected a count >= 1, -1 for all, \"auto\", or a list like "
             "\"0,1\". HINT: -1 takes every device; write a count, \"auto\" or indices.",
             count);
}

DeviceRequest::DeviceRequest(std::initializer_list<int> indices) : is_auto_(false), indices_(indices) {}

std::string DeviceRequest::to_string() const {
  if (is_auto_) return "auto";
  if (indices_.empty()) return std::to_string(count_);
  std::vector<std::string> parts;
  for (int i : indices_) parts.push_back(std::to_string(i));
  return "[" + join(parts, ", ") + "]";
}

}  // namespace volt
