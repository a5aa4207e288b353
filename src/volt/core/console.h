// Where the library's words for the person running the program go: one sink per run.
//
// Notes, warnings and reports used to go straight to std::cout/std::cerr from many places, so
// N processes printed N copies and tests could not read them. Every library message now goes
// through a Console, and only global rank 0 gets one that writes (the others get a silent one).
#pragma once

#include <iosfwd>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

namespace volt {

/// The library's console: information, warnings, and the stream progress bars and tables use.
///
/// info() and warn() may be called from several threads at once (MLFlowLogger reports from its
/// sender thread while training goes on); each line comes out whole. stream() is the training
/// thread's alone.
class Console {
 public:
  virtual ~Console() = default;
  /// A line of information, e.g. "Restored training state from ...". No trailing newline.
  virtual void info(const std::string& line) = 0;
  /// A line about something the user may want to fix; written as "warning: <line>".
  virtual void warn(const std::string& line) = 0;
  /// The stream progress bars and the model summary draw on.
  virtual std::ostream& stream() = 0;
  /// True when stream() is a terminal, so a progress bar may redraw one line in place.
  virtual bool is_tty() const = 0;
};

/// The process's stdout (information, bars) and stderr (warnings).
std::shared_ptr<Console> make_stdio_console();
/// A console that drops everything (every rank but global rank 0).
std::shared_ptr<Console> make_silent_console();
/// `console` on global rank 0, a silent one elsewhere: one copy of every line per run.
std::shared_ptr<Console> only_on_global_zero(std::shared_ptr<Console> console, bool is_global_zero);

/// Keeps what was written, for tests. Read the vectors once the threads that write are done.
class RecordingConsole : public Console {
 public:
  void info(const std::string& line) override {
    const std::lock_guard<std::mutex> lock(mutex_);
    infos.push_back(line);
  }
  void warn(const std::string& line) override {
    const std::lock_guard<std::mutex> lock(mutex_);
    warnings.push_back(line);
  }
  std::ostream& stream() override { return out; }
  bool is_tty() const override { return false; }

  /// The info lines, in order.
  std::vector<std::string> infos;
  /// The warning lines (without "warning: "), in order.
  std::vector<std::string> warnings;
  /// What progress bars and tables wrote.
  std::ostringstream out;

 private:
  std::mutex mutex_;
};

}  // namespace volt
