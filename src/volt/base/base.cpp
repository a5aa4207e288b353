#include "volt/base/interval.h"
#include "volt/base/monitor_mode.h"
#include "volt/base/reduce.h"
#include "volt/core/strings.h"

namespace volt {

const char* to_string(Reduce reduce) {
  switch (reduce) {
    case Reduce::kMean:
      return "mean";
    case Reduce::kSum:
      return "sum";
    case Reduce::kMax:
      return "max";
    case Reduce::kMin:
      return "min";
  }
  return "?";
}

Reduce parse_reduce(const std::string& text) {
  const Reduce all[] = {Reduce::kMean, Reduce::kSum, Reduce::kMax, Reduce::kMin};
  return parse_enum(text, all, "reduce_fx");
}

const char* to_string(Interval interval) {
  switch (interval) {
    case Interval::kEpoch:
      return "epoch";
    case Interval::kStep:
      return "step";
  }
  return "?";
}

const char* to_string(Mode mode) {
  switch (mode) {
    case Mode::kMin:
      return "min";
    case Mode::kMax:
      return "max";
  }
  return "?";
}

Mode parse_mode(std::string_view text) {
  const Mode all[] = {Mode::kMin, Mode::kMax};
  return parse_enum(text, all, "mode");
}

}  // namespace volt
