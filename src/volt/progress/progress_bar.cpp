#include "volt/progress/progress_bar.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "volt/core/console.h"
#include "volt/core/error.h"

namespace volt {
namespace {

constexpr const char* kClearToEndOfLine = "\x1b[K";
// tqdm's bar glyphs: a space, then eighths of a block from one to eight.
constexpr const char* kBarGlyphs[] = {" ", "▏", "▎", "▍", "▌", "▋", "▊", "▉", "█"};
constexpr int kEighths = 8;

/// tqdm's format_interval: "MM:SS", or "H:MM:SS" from an hour on; seconds are truncated.
std::string format_interval(double seconds) {
  const auto total = static_cast<int64_t>(std::max(0.0, seconds));
  const int64_t hours = total / 3600;
  const int64_t minutes = total % 3600 / 60;
  const int64_t secs = total % 60;
  if (hours > 0) return fmt::format("{}:{:02d}:{:02d}", hours, minutes, secs);
  return fmt::format("{:02d}:{:02d}", minutes, secs);
}

/// Three significant digits or so, without an exponent: "87.3", "5.25", "1234".
std::string format_rate_number(double rate) {
  if (rate >= 100) return fmt::format("{:.0f}", rate);
  if (rate >= 10) return fmt::format("{:.1f}", rate);
  return fmt::format("{:.2f}", rate);
}

/// Steps per second since the start, or nullopt before there is anything to measure.
std::optional<double> rate_of(int64_t done, double elapsed) {
  if (done <= 0 || elapsed <= 0) return std::nullopt;
  return static_cast<double>(done) / elapsed;
}

/// tqdm's rate: "87.3it/s", or "2.50s/it" below one step a second; `space` goes before the unit.
std::string format_rate(std::optional<double> rate, const char* space) {
  if (!rate) return fmt::format("?{}it/s", space);
  if (*rate < 1) return fmt::format("{}{}s/it", format_rate_number(1 / *rate), space);
  return fmt::format("{}{}it/s", format_rate_number(*rate), space);
}

std::string format_eta(int64_t done, int64_t total, std::optional<double> rate) {
  if (!rate) return "?";
  return format_interval(static_cast<double>(std::max<int64_t>(0, total - done)) / *rate);
}

/// Whole percent done, rounded down so that 100% means finished.
int64_t percent(int64_t done, int64_t total) {
  if (total <= 0) return 100;
  return std::clamp<int64_t>(done * 100 / total, 0, 100);
}

/// ", loss=0.4123, val/acc=0.8731" or "" without metrics.
std::string format_metrics(const std::map<std::string, double>& metrics) {
  std::string text;
  for (const auto& [name, value] : metrics) text += fmt::format(", {}={:.4g}", name, value);
  return text;
}

/// The number of terminal columns `text` takes: one per UTF-8 code point.
int display_width(const std::string& text) {
  return static_cast<int>(
      std::count_if(text.begin(), text.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

/// `text` cut after `width` code points.
std::string trim_to_width(const std::string& text, int width) {
  int columns = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const bool starts_code_point = (static_cast<unsigned char>(text[i]) & 0xC0) != 0x80;
    if (starts_code_point && ++columns > width) return text.substr(0, i);
  }
  return text;
}

/// tqdm's bar: whole blocks, one partial block in eighths, then spaces; `width` columns.
std::string render_bar(double fraction, int width) {
  const int64_t eighths = static_cast<int64_t>(std::clamp(fraction, 0.0, 1.0) * width * kEighths);
  const int64_t full = eighths / kEighths;
  std::string bar;
  for (int64_t i = 0; i < full; ++i) bar += kBarGlyphs[kEighths];
  if (full < width) {
    bar += kBarGlyphs[eighths % kEighths];
    bar.append(static_cast<std::size_t>(width - full - 1), ' ');
  }
  return bar;
}

}  // namespace

double ProgressBar::steady_clock_seconds() {
  const auto since_epoch = std::chrono::steady_clock::now().time_since_epoch();
  return std::chrono::duration<double>(since_epoch).count();
}

ProgressBar::ProgressBar(ProgressBarOptions options, std::ostream& out, Clock clock)
    : options_(std::move(options)),
      is_tty_(options_.is_tty.value_or(::isatty(::fileno(stdout)) != 0)),
      interval_(is_tty_ ? options_.refresh_seconds : options_.plain_line_seconds),
      out_(out),
      clock_(std::move(clock)) {
  VOLT_CHECK(std::isfinite(options_.refresh_seconds) && options_.refresh_seconds >= 0,
             "ProgressBarOptions.refresh_seconds is {}; expected a number of seconds >= 0. "
             "HINT: 0.1 redraws ten times a second.",
             options_.refresh_seconds);
  VOLT_CHECK(std::isfinite(options_.plain_line_seconds) && options_.plain_line_seconds >= 0,
             "ProgressBarOptions.plain_line_seconds is {}; expected a number of seconds >= 0. "
             "HINT: 30 writes a log line every half minute.",
             options_.plain_line_seconds);
  VOLT_CHECK(options_.width >= 10,
             "ProgressBarOptions.width is {}; expected at least 10 columns. HINT: 100 fits most "
             "terminals.",
             options_.width);
  VOLT_INTERNAL_ASSERT(static_cast<bool>(clock_), "ProgressBar needs a clock");
}

void ProgressBar::start(const std::string& stage, int epoch, int64_t total) {
  if (!options_.enabled) return;
  if (line_open_) out_ << '\n';
  line_open_ = false;
  stage_ = stage;
  epoch_ = epoch;
  total_ = total;
  done_ = 0;
  printed_done_ = -1;
  printed_postfix_.clear();
  active_ = true;
  start_time_ = clock_();
  next_draw_ = start_time_ + interval_;
  // A terminal shows the empty bar at once, as tqdm does; a log file waits for progress.
  if (is_tty_) show(start_time_, {});
}

void ProgressBar::update(int64_t done, const std::map<std::string, double>& metrics) {
  if (!options_.enabled) return;
  VOLT_INTERNAL_ASSERT(active_, "ProgressBar::update called outside start()/finish()");
  done_ = done;
  const double now = clock_();
  if (now < next_draw_) return;
  // A log line per step at most, and the stage's last step is finish()'s line: a tick at the
  // last batch (or the forced update at an epoch's end) would print that step twice.
  if (!is_tty_ && (done_ == printed_done_ || (total_ >= 0 && done_ >= total_))) return;
  next_draw_ = now + interval_;
  show(now, metrics);
}

void ProgressBar::finish(const std::map<std::string, double>& metrics) {
  if (!options_.enabled) return;
  VOLT_INTERNAL_ASSERT(active_, "ProgressBar::finish called without start()");
  // An epoch cut short ends where a tick may have just printed the same step and values.
  const bool said_already = !is_tty_ && done_ == printed_done_ && postfix(metrics) == printed_postfix_;
  if (!said_already) show(clock_(), metrics);
  if (is_tty_) out_ << '\n' << std::flush;
  line_open_ = false;
  active_ = false;
}

void ProgressBar::print(const std::string& line) {
  if (!line_open_) {
    out_ << line << '\n' << std::flush;
    return;
  }
  out_ << '\r' << kClearToEndOfLine << line << '\n' << '\r' << last_line_ << kClearToEndOfLine << std::flush;
}

void ProgressBar::draw(const std::string& line) {
  if (!is_tty_) {
    out_ << line << '\n' << std::flush;
    return;
  }
  // Clearing after the text, not before, keeps the line from flickering.
  out_ << '\r' << line << kClearToEndOfLine << std::flush;
  last_line_ = line;
  line_open_ = true;
}

std::string ProgressBar::postfix(const std::map<std::string, double>& metrics) const {
  std::string text = format_metrics(metrics);
  if (!note_.empty()) text += ", " + note_;
  return text;
}

std::string ProgressBar::render(double now, const std::map<std::string, double>& metrics) const {
  const double elapsed = now - start_time_;
  return is_tty_ ? render_tty(elapsed, postfix(metrics)) : render_plain(elapsed, postfix(metrics));
}

void ProgressBar::show(double now, const std::map<std::string, double>& metrics) {
  draw(render(now, metrics));
  if (is_tty_) return;
  printed_done_ = done_;
  printed_postfix_ = postfix(metrics);
}

std::string ProgressBar::render_tty(double elapsed, const std::string& postfix) const {
  const std::string prefix = stage_.empty() ? "" : stage_ + ": ";
  const std::optional<double> rate = rate_of(done_, elapsed);
  if (total_ < 0) {
    return trim_to_width(
        fmt::format("{}{}it [{}, {}{}]", prefix, done_, format_interval(elapsed), format_rate(rate, ""), postfix),
        options_.width);
  }
  const std::string left = fmt::format("{}{:3d}%|", prefix, percent(done_, total_));
  const std::string right = fmt::format("| {}/{} [{}<{}, {}{}]", done_, total_, format_interval(elapsed),
                                        format_eta(done_, total_, rate), format_rate(rate, ""), postfix);
  const int bar_width = std::max(1, options_.width - display_width(left) - display_width(right));
  const double fraction = total_ > 0 ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
  return trim_to_width(left + render_bar(fraction, bar_width) + right, options_.width);
}

std::string ProgressBar::render_plain(double elapsed, const std::string& postfix) const {
  const std::string prefix = stage_.empty() ? "" : stage_ + ": ";
  const std::optional<double> rate = rate_of(done_, elapsed);
  if (total_ < 0) {
    return fmt::format("{}{} {}, elapsed {}{}", prefix, done_, format_rate(rate, " "), format_interval(elapsed),
                       postfix);
  }
  return fmt::format("{}{}/{} ({}%) {}, elapsed {}, ETA {}{}", prefix, done_, total_, percent(done_, total_),
                     format_rate(rate, " "), format_interval(elapsed), format_eta(done_, total_, rate), postfix);
}

std::unique_ptr<ProgressBar> make_progress_bar(bool enabled, Console& console) {
  if (!enabled) return nullptr;
  ProgressBarOptions options;
  options.is_tty = console.is_tty();
  return std::make_unique<ProgressBar>(options, console.stream());
}

}  // namespace volt
