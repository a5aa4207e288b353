#include "volt/core/console.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>

namespace volt {

namespace {

class StdioConsole : public Console {
 public:
  // Flushed per line: under SLURM stdout is a file, and a job killed at its wall time must
  // still show what it last said. Each line is one write, so a line from another thread (a
  // logger's sender) cannot land inside it.
  void info(const std::string& line) override { std::cout << (line + "\n") << std::flush; }
  void warn(const std::string& line) override { std::cerr << ("warning: " + line + "\n") << std::flush; }
  std::ostream& stream() override { return std::cout; }
  bool is_tty() const override { return isatty(fileno(stdout)) != 0; }
};

class SilentConsole : public Console {
 public:
  void info(const std::string&) override {}
  void warn(const std::string&) override {}
  std::ostream& stream() override { return null_; }
  bool is_tty() const override { return false; }

 private:
  // A stream without a buffer: every write fails silently and costs nothing.
  std::ostream null_{nullptr};
};

}  // namespace

std::shared_ptr<Console> make_stdio_console() { return std::make_shared<StdioConsole>(); }

std::shared_ptr<Console> make_silent_console() { return std::make_shared<SilentConsole>(); }

std::shared_ptr<Console> only_on_global_zero(std::shared_ptr<Console> console, bool is_global_zero) {
  return is_global_zero ? std::move(console) : make_silent_console();
}

}  // namespace volt
