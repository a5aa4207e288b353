// A tqdm-style progress bar the trainer drives, cheap enough to update every step.
//
// Torch-free. On a terminal it redraws one line in place; elsewhere (a SLURM log file) it writes
// a plain line at most every `plain_line_seconds`, so logs stay small, and never two lines for the
// same step: a stage's last step is written once, by finish().
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>

namespace volt {

class Console;

/// How a ProgressBar draws.
///
/// Example: `ProgressBarOptions options; options.is_tty = false; options.plain_line_seconds = 60;`
/// writes one line a minute whatever stdout is.
struct ProgressBarOptions {
  /// False draws no bar at all; print() still writes its lines.
  bool enabled = true;
  /// Whether the output is a terminal that can redraw a line; unset: isatty(fileno(stdout)).
  std::optional<bool> is_tty;
  /// On a terminal, the bar is redrawn at most this often (seconds, >= 0).
  double refresh_seconds = 0.1;
  /// Not on a terminal, a plain progress line is written at most this often (seconds, >= 0).
  double plain_line_seconds = 30;
  /// The terminal line's width in columns; longer lines are cut, as tqdm does (>= 10).
  int width = 100;
};

/// Renders training progress as Lightning's (tqdm's) bar, or as plain log lines.
///
/// Terminal: `Epoch 1:  45%|████▌     | 450/1000 [00:05<00:06, 87.3it/s, loss=0.412]`.
/// Plain:    `Epoch 1: 450/1000 (45%) 87.3 it/s, elapsed 00:05, ETA 00:06, loss=0.412`.
/// The rate is the average since start(); metrics show 4 significant digits.
class ProgressBar {
 public:
  /// Seconds on a monotonic clock; tests pass a fake one.
  using Clock = std::function<double()>;

  /// std::chrono::steady_clock in seconds, the default clock.
  static double steady_clock_seconds();

  /// A bar writing to `out`, which must outlive it. Throws volt::Error for invalid options.
  ProgressBar(ProgressBarOptions options, std::ostream& out, Clock clock = steady_clock_seconds);

  /// Begins a stage, e.g. ("Epoch 3", 3, 1000) or ("Validation", 3, 50); `stage` is the
  /// label shown, `epoch` is recorded for epoch(), `total` is -1 when unknown. A terminal line
  /// left open by a stage that was not finished is kept and a new one begun.
  void start(const std::string& stage, int epoch, int64_t total);
  /// Records that `done` steps are complete; draws only when the refresh interval has passed,
  /// so a throttled call costs a clock read and a compare. A plain line is written only for a
  /// step without one yet, and not for the stage's last step (finish() writes that).
  void update(int64_t done, const std::map<std::string, double>& metrics);
  /// Draws the stage's final line, whatever the throttle says (unless a plain line just said the
  /// same step and values); on a terminal it ends the line.
  void finish(const std::map<std::string, double>& metrics);
  /// Writes a message line; on a terminal the bar is cleared first and redrawn after it.
  void print(const std::string& line);
  /// Text shown after the metrics on every line from now on ("slow: rank 3 (data)"); "" for none.
  void set_note(std::string note) { note_ = std::move(note); }

  /// Whether the bar redraws in place (the resolved ProgressBarOptions::is_tty).
  bool is_tty() const { return is_tty_; }
  /// The epoch given to the last start().
  int epoch() const { return epoch_; }

 private:
  /// The text after the counts: ", loss=0.4123" and the note.
  std::string postfix(const std::map<std::string, double>& metrics) const;
  std::string render(double now, const std::map<std::string, double>& metrics) const;
  /// Draws the line for `now` and, in plain mode, remembers what it said.
  void show(double now, const std::map<std::string, double>& metrics);
  std::string render_tty(double elapsed, const std::string& postfix) const;
  std::string render_plain(double elapsed, const std::string& postfix) const;
  void draw(const std::string& line);

  ProgressBarOptions options_;
  bool is_tty_;
  double interval_;
  std::ostream& out_;
  Clock clock_;

  std::string stage_;
  int epoch_ = -1;
  int64_t total_ = -1;
  int64_t done_ = 0;
  double start_time_ = 0;
  double next_draw_ = 0;
  bool active_ = false;
  /// A terminal line is on screen without its newline yet.
  bool line_open_ = false;
  std::string last_line_;
  std::string note_;
  // Plain mode: the step and the values of the last line written in this stage, so that no step
  // is written twice (a tick and the stage's end at the same step).
  int64_t printed_done_ = -1;
  std::string printed_postfix_;
};

/// The bar a Trainer stage draws to `console` (a terminal's redraws or a log's lines, as the
/// console says), or nullptr when `enabled` is false (disabled, or not global rank 0).
std::unique_ptr<ProgressBar> make_progress_bar(bool enabled, Console& console);

}  // namespace volt
