#include "param_spec.h"

#include <fmt/format.h>

#include "volt/core/error.h"
#include "volt/core/strings.h"

namespace volt::tool {
namespace {

constexpr const char* kExamples =
    "lr=choice:0.1,0.01, layers=int_range:2:8:2, dropout=float_range:0:0.5:0.1, momentum=uniform:0.8:0.99 or "
    "lr=log_uniform:1e-4:1e-1";

double number(std::string_view spec, const std::string& what, const std::string& text) {
  const auto value = parse_double(text);
  VOLT_CHECK(value.has_value(),
             "--param '{}' has {}='{}', which is not a number; expected e.g. {}. HINT: write plain "
             "numbers such as 0.5 or 1e-4.",
             spec, what, text, kExamples);
  return *value;
}

int64_t whole(std::string_view spec, const std::string& what, const std::string& text) {
  const auto value = parse_int(text);
  VOLT_CHECK(value.has_value(),
             "--param '{}' has {}='{}', which is not a whole number; expected e.g. "
             "layers=int_range:2:8:2. HINT: use float_range for fractional values.",
             spec, what, text);
  return *value;
}

void expect_args(std::string_view spec, const std::string& kind, const std::vector<std::string>& args, std::size_t min,
                 std::size_t max, const char* form) {
  VOLT_CHECK(args.size() >= min && args.size() <= max,
             "--param '{}' gives {} value(s) after '{}:'; expected {}. "
             "HINT: write e.g. {}.",
             spec, args.size(), kind, form, kExamples);
}

}  // namespace

slurm::SweepParameter parse_param_spec(std::string_view spec) {
  const auto eq = spec.find('=');
  VOLT_CHECK(eq != std::string_view::npos && eq > 0,
             "--param '{}' has no NAME=; expected NAME=KIND:ARGS, e.g. {}. "
             "HINT: name the program's flag without dashes, then '='.",
             spec, kExamples);
  const std::string name(trim(spec.substr(0, eq)));
  const std::string rest(spec.substr(eq + 1));
  const auto colon = rest.find(':');
  VOLT_CHECK(colon != std::string::npos,
             "--param '{}' has no KIND: after '{}='; expected one of choice, int_range, "
             "float_range, uniform, log_uniform, e.g. {}. HINT: write {}=choice:{} for a list of values.",
             spec, name, kExamples, name, rest);
  const std::string kind_name = trim(rest.substr(0, colon));
  const std::string body = rest.substr(colon + 1);
  slurm::ParameterKind kind;
  try {
    kind = slurm::parse_parameter_kind(kind_name);
  } catch (const Error& e) {
    throw Error(fmt::format("--param '{}': {}. HINT: write e.g. {}.", spec, e.what(), kExamples));
  }
  const std::vector<std::string> args = split(body, ':');
  switch (kind) {
    case slurm::ParameterKind::kChoice: {
      std::vector<std::string> values;
      for (const auto& value : split(body, ',')) {
        VOLT_CHECK(!trim(value).empty(),
                   "--param '{}' has an empty choice; expected comma-separated values, e.g. "
                   "{}=choice:0.1,0.01. HINT: remove the extra comma.",
                   spec, name);
        values.push_back(trim(value));
      }
      return slurm::SweepParameter::choice(name, values);
    }
    case slurm::ParameterKind::kIntRange:
      expect_args(spec, kind_name, args, 2, 3, "LOW:HIGH or LOW:HIGH:STEP");
      return slurm::SweepParameter::int_range(name, whole(spec, "low", args[0]), whole(spec, "high", args[1]),
                                              args.size() == 3 ? whole(spec, "step", args[2]) : 1);
    case slurm::ParameterKind::kFloatRange:
      expect_args(spec, kind_name, args, 3, 3, "LOW:HIGH:STEP");
      return slurm::SweepParameter::float_range(name, number(spec, "low", args[0]), number(spec, "high", args[1]),
                                                number(spec, "step", args[2]));
    case slurm::ParameterKind::kUniform:
      expect_args(spec, kind_name, args, 2, 2, "LOW:HIGH");
      return slurm::SweepParameter::uniform(name, number(spec, "low", args[0]), number(spec, "high", args[1]));
    case slurm::ParameterKind::kLogUniform:
      expect_args(spec, kind_name, args, 2, 2, "LOW:HIGH");
      return slurm::SweepParameter::log_uniform(name, number(spec, "low", args[0]), number(spec, "high", args[1]));
  }
  VOLT_INTERNAL_ASSERT(false, "unhandled parameter kind");
}

std::vector<std::string> param_specs_from_text(const std::string& text) {
  std::vector<std::string> specs;
  for (const auto& line : split(text, '\n')) {
    const std::string spec = trim(line);
    if (spec.empty() || spec[0] == '#') continue;
    specs.push_back(spec);
  }
  return specs;
}

}  // namespace volt::tool
