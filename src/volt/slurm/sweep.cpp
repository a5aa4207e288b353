#include "volt/slurm/sweep.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "volt/core/error.h"
#include "volt/core/problems.h"
#include "volt/core/strings.h"

namespace volt::slurm {

namespace {

constexpr const char* kManifestFormat = "volt-sweep-manifest";
constexpr int64_t kManifestVersion = 1;
/// Integers above 2^53 are not all doubles, so a range holds at most this many values.
constexpr double kMaxRangeValues = 9007199254740992.0;

bool is_discrete(ParameterKind kind) {
  switch (kind) {
    case ParameterKind::kChoice:
    case ParameterKind::kIntRange:
    case ParameterKind::kFloatRange:
      return true;
    case ParameterKind::kUniform:
    case ParameterKind::kLogUniform:
      return false;
  }
  VOLT_INTERNAL_ASSERT(false, "unknown ParameterKind {}", static_cast<int>(kind));
}

/// The number of values of a discrete parameter, as a double so that huge ranges do not overflow.
double value_count(const SweepParameter& p) {
  switch (p.kind) {
    case ParameterKind::kChoice:
      return static_cast<double>(p.values.size());
    // The epsilon keeps a step that lands on `high` up to rounding (0.1 * 3 vs 0.3) inside.
    case ParameterKind::kIntRange:
    case ParameterKind::kFloatRange:
      return std::floor((p.high - p.low) / p.step + 1e-9) + 1;
    case ParameterKind::kUniform:
    case ParameterKind::kLogUniform:
      return 0;
  }
  VOLT_INTERNAL_ASSERT(false, "unknown ParameterKind {}", static_cast<int>(p.kind));
}

/// Value number `i` of a discrete parameter.
std::string discrete_value(const SweepParameter& p, int64_t i) {
  switch (p.kind) {
    case ParameterKind::kChoice:
      return p.values[static_cast<std::size_t>(i)];
    case ParameterKind::kIntRange:
      return fmt::format("{}", static_cast<int64_t>(p.low) + i * static_cast<int64_t>(p.step));
    case ParameterKind::kFloatRange: {
      // low + i * step, not a running sum, so errors do not accumulate; 15 digits drop the rest.
      const double value = std::stod(fmt::format("{:.15g}", p.low + static_cast<double>(i) * p.step));
      return fmt::format("{}", value);
    }
    case ParameterKind::kUniform:
    case ParameterKind::kLogUniform:
      break;
  }
  VOLT_INTERNAL_ASSERT(false, "parameter '{}' is not discrete", p.name);
}

/// A continuous parameter's value for a uniform `u` in [0, 1).
std::string continuous_value(const SweepParameter& p, double u) {
  double value = 0;
  if (p.kind == ParameterKind::kLogUniform) {
    value = std::exp(std::log(p.low) + u * (std::log(p.high) - std::log(p.low)));
  } else {
    value = p.low + u * (p.high - p.low);
  }
  return fmt::format("{}", std::clamp(value, p.low, p.high));
}

bool is_valid_name(const std::string& name) {
  if (name.empty() || name[0] == '-') return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '-'; });
}

void check_range(std::vector<std::string>& problems, const SweepParameter& p) {
  const std::string kind = to_string(p.kind);
  if (!std::isfinite(p.low) || !std::isfinite(p.high) || p.low >= p.high) {
    problems.push_back(fmt::format(
        "parameter '{}' ({}) has low={} and high={}; expected finite bounds with low < high. HINT: swap them, or "
        "use choice for a single value.",
        p.name, kind, p.low, p.high));
    return;
  }
  if (p.kind == ParameterKind::kLogUniform && p.low <= 0) {
    problems.push_back(
        fmt::format("parameter '{}' (log_uniform) has low={}; expected bounds above 0, since it draws their logarithm. "
                    "HINT: use a small positive low such as 1e-6, or uniform.",
                    p.name, p.low));
  }
  if (p.kind != ParameterKind::kIntRange && p.kind != ParameterKind::kFloatRange) return;
  if (!std::isfinite(p.step) || p.step <= 0) {
    problems.push_back(
        fmt::format("parameter '{}' ({}) has step={}; expected a step above 0. HINT: for 1, 2, 4, 8 use choice.",
                    p.name, kind, p.step));
    return;
  }
  if (p.kind == ParameterKind::kIntRange &&
      (p.low != std::trunc(p.low) || p.high != std::trunc(p.high) || p.step != std::trunc(p.step))) {
    problems.push_back(
        fmt::format("parameter '{}' (int_range) has low={}, high={} and step={}; expected whole numbers. HINT: use "
                    "float_range for fractional values.",
                    p.name, p.low, p.high, p.step));
  }
  if (value_count(p) > kMaxRangeValues) {
    problems.push_back(fmt::format(
        "parameter '{}' ({}) has step={} for [{}, {}], more than 2^53 values; expected fewer. HINT: use a larger "
        "step, or uniform for a random search.",
        p.name, kind, p.step, p.low, p.high));
  }
}

void check_parameter(std::vector<std::string>& problems, const SweepParameter& p, SearchKind search) {
  if (!is_valid_name(p.name)) {
    problems.push_back(fmt::format(
        "parameter name '{}' is not a flag name; expected letters, digits, '_' and '-', not starting with '-'. "
        "HINT: write 'lr' for --lr.",
        p.name));
  }
  if (p.kind == ParameterKind::kChoice) {
    if (p.values.empty()) {
      problems.push_back(fmt::format(
          "parameter '{}' (choice) has no values; expected at least one. HINT: list its values, or remove it.",
          p.name));
    }
  } else {
    check_range(problems, p);
  }
  if (search == SearchKind::kGrid && !is_discrete(p.kind)) {
    problems.push_back(
        fmt::format("parameter '{}' is {}, a continuous range a grid cannot enumerate; expected choice, int_range or "
                    "float_range in a grid search. HINT: use float_range with a step, or a random search.",
                    p.name, to_string(p.kind)));
  }
}

/// The size of the full grid, saturated just above kMaxTrials.
double grid_size(const std::vector<SweepParameter>& parameters) {
  double size = 1;
  for (const auto& p : parameters) size = std::min(size * value_count(p), static_cast<double>(kMaxTrials) + 1);
  return size;
}

Trial grid_trial(const std::vector<SweepParameter>& parameters, int64_t index) {
  Trial trial{index, {}};
  trial.values.resize(parameters.size());
  int64_t rest = index;
  // Odometer order: peel digits off the last parameter first.
  for (std::size_t i = parameters.size(); i-- > 0;) {
    const auto count = static_cast<int64_t>(value_count(parameters[i]));
    trial.values[i] = {parameters[i].name, discrete_value(parameters[i], rest % count)};
    rest /= count;
  }
  return trial;
}

Trial random_trial(const std::vector<SweepParameter>& parameters, int64_t index, std::mt19937_64& rng) {
  Trial trial{index, {}};
  for (const auto& p : parameters) {
    const uint64_t r = rng();
    if (is_discrete(p.kind)) {
      const auto count = static_cast<uint64_t>(value_count(p));
      trial.values.emplace_back(p.name, discrete_value(p, static_cast<int64_t>(r % count)));
    } else {
      trial.values.emplace_back(p.name, continuous_value(p, static_cast<double>(r >> 11) * 0x1.0p-53));
    }
  }
  return trial;
}

[[noreturn]] void bad_manifest(const std::string& what) {
  throw Error(fmt::format("not a sweep manifest: {}. HINT: pass the file render_manifest wrote for this sweep.", what));
}

}  // namespace

const char* to_string(SearchKind kind) {
  switch (kind) {
    case SearchKind::kGrid:
      return "grid";
    case SearchKind::kRandom:
      return "random";
  }
  VOLT_INTERNAL_ASSERT(false, "unknown SearchKind {}", static_cast<int>(kind));
}

SearchKind parse_search_kind(std::string_view text) {
  static constexpr SearchKind kValues[] = {SearchKind::kGrid, SearchKind::kRandom};
  return parse_enum(text, kValues, "search kind");
}

const char* to_string(ParameterKind kind) {
  switch (kind) {
    case ParameterKind::kChoice:
      return "choice";
    case ParameterKind::kIntRange:
      return "int_range";
    case ParameterKind::kFloatRange:
      return "float_range";
    case ParameterKind::kUniform:
      return "uniform";
    case ParameterKind::kLogUniform:
      return "log_uniform";
  }
  VOLT_INTERNAL_ASSERT(false, "unknown ParameterKind {}", static_cast<int>(kind));
}

ParameterKind parse_parameter_kind(std::string_view text) {
  static constexpr ParameterKind kValues[] = {ParameterKind::kChoice, ParameterKind::kIntRange,
                                              ParameterKind::kFloatRange, ParameterKind::kUniform,
                                              ParameterKind::kLogUniform};
  return parse_enum(text, kValues, "sweep parameter kind");
}

SweepParameter SweepParameter::choice(std::string name, std::vector<std::string> values) {
  SweepParameter p;
  p.name = std::move(name);
  p.kind = ParameterKind::kChoice;
  p.values = std::move(values);
  return p;
}

SweepParameter SweepParameter::choice(std::string name, std::initializer_list<double> values) {
  std::vector<std::string> texts;
  for (double v : values) texts.push_back(fmt::format("{}", v));
  return choice(std::move(name), std::move(texts));
}

SweepParameter SweepParameter::int_range(std::string name, int64_t low, int64_t high, int64_t step) {
  SweepParameter p;
  p.name = std::move(name);
  p.kind = ParameterKind::kIntRange;
  p.low = static_cast<double>(low);
  p.high = static_cast<double>(high);
  p.step = static_cast<double>(step);
  return p;
}

SweepParameter SweepParameter::float_range(std::string name, double low, double high, double step) {
  SweepParameter p;
  p.name = std::move(name);
  p.kind = ParameterKind::kFloatRange;
  p.low = low;
  p.high = high;
  p.step = step;
  return p;
}

SweepParameter SweepParameter::uniform(std::string name, double low, double high) {
  SweepParameter p;
  p.name = std::move(name);
  p.kind = ParameterKind::kUniform;
  p.low = low;
  p.high = high;
  return p;
}

SweepParameter SweepParameter::log_uniform(std::string name, double low, double high) {
  SweepParameter p = uniform(std::move(name), low, high);
  p.kind = ParameterKind::kLogUniform;
  return p;
}

std::vector<std::string> Trial::flags() const {
  std::vector<std::string> out;
  for (const auto& [name, value] : values) {
    out.push_back("--" + name);
    out.push_back(value);
  }
  return out;
}

std::string Trial::output_dir(const std::string& root) const {
  std::string leaf = fmt::format("trial_{:03d}", index);
  if (root.empty()) return leaf;
  return root.back() == '/' ? root + leaf : root + "/" + leaf;
}

std::vector<std::string> validate_sweep(const std::vector<SweepParameter>& parameters, SearchKind kind,
                                        int64_t nb_trials) {
  std::vector<std::string> problems;
  if (parameters.empty()) {
    problems.push_back(
        "the sweep has no parameters; expected at least one. HINT: add one, e.g. "
        "SweepParameter::choice(\"lr\", {0.1, 0.01}).");
    return problems;
  }
  std::set<std::string> seen;
  for (const auto& p : parameters) {
    if (!seen.insert(p.name).second) {
      problems.push_back(fmt::format(
          "parameter '{}' is given twice; expected each flag once. HINT: merge its values into one parameter.",
          p.name));
    }
    check_parameter(problems, p, kind);
  }
  if (!problems.empty()) return problems;  // the sizes below need valid parameters

  constexpr auto kMax = static_cast<double>(kMaxTrials);
  if (kind == SearchKind::kRandom && nb_trials <= 0) {
    problems.push_back(fmt::format(
        "a random search needs nb_trials above 0, not {}. HINT: set nb_trials to how many trials to draw, e.g. 20.",
        nb_trials));
  }
  if (kind == SearchKind::kRandom && nb_trials > kMaxTrials) {
    problems.push_back(fmt::format(
        "a random search of nb_trials={} is more than {} trials; expected at most {}. HINT: lower nb_trials.",
        nb_trials, kMaxTrials, kMaxTrials));
  }
  const bool capped = nb_trials > 0 && nb_trials <= kMaxTrials;
  if (kind == SearchKind::kGrid && !capped && grid_size(parameters) > kMax) {
    problems.push_back(fmt::format(
        "the grid search has more than {} trials (the product of its parameters' value counts); expected at most "
        "{}. HINT: use fewer values, cap it with nb_trials, or a random search.",
        kMaxTrials, kMaxTrials));
  }
  return problems;
}

std::vector<Trial> expand_sweep(const std::vector<SweepParameter>& parameters, SearchKind kind, int64_t nb_trials,
                                uint64_t seed) {
  throw_if_problems("the sweep", validate_sweep(parameters, kind, nb_trials));
  std::vector<Trial> trials;
  if (kind == SearchKind::kGrid) {
    const auto size = static_cast<int64_t>(grid_size(parameters));
    const int64_t count = nb_trials > 0 ? std::min(size, nb_trials) : size;
    for (int64_t i = 0; i < count; ++i) trials.push_back(grid_trial(parameters, i));
    return trials;
  }
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < nb_trials; ++i) trials.push_back(random_trial(parameters, i, rng));
  return trials;
}

std::string render_manifest(const std::vector<Trial>& trials) {
  std::string out =
      fmt::format("{{\"format\": \"{}\", \"version\": {}, \"trials\": [", kManifestFormat, kManifestVersion);
  for (std::size_t i = 0; i < trials.size(); ++i) {
    nlohmann::ordered_json values = nlohmann::ordered_json::object();
    for (const auto& [name, value] : trials[i].values) values[name] = value;
    const nlohmann::ordered_json trial{{"index", trials[i].index}, {"values", values}};
    out += (i == 0 ? "\n  " : ",\n  ") + trial.dump();
  }
  return out + "\n]}\n";
}

std::vector<Trial> parse_manifest(const std::string& manifest) {
  nlohmann::ordered_json json;
  try {
    json = nlohmann::ordered_json::parse(manifest);
  } catch (const nlohmann::json::exception& e) {
    bad_manifest(fmt::format("invalid JSON ({})", e.what()));
  }
  if (!json.is_object() || json.value("format", "") != kManifestFormat) {
    bad_manifest(fmt::format("expected a JSON object with \"format\": \"{}\"", kManifestFormat));
  }
  if (json.value("version", int64_t{0}) != kManifestVersion) {
    bad_manifest(
        fmt::format("version {} is not {}", json.value("version", nlohmann::ordered_json()).dump(), kManifestVersion));
  }
  if (!json.contains("trials") || !json["trials"].is_array()) bad_manifest("expected a \"trials\" array");
  std::vector<Trial> trials;
  for (const auto& entry : json["trials"]) {
    if (!entry.is_object() || !entry.contains("index") || !entry["index"].is_number_integer() ||
        !entry.contains("values") || !entry["values"].is_object()) {
      bad_manifest(fmt::format("trial {} lacks an integer \"index\" and a \"values\" object", entry.dump()));
    }
    Trial trial{entry["index"].get<int64_t>(), {}};
    for (const auto& [name, value] : entry["values"].items()) {
      if (!value.is_string()) bad_manifest(fmt::format("value {} of '{}' is not a string", value.dump(), name));
      trial.values.emplace_back(name, value.get<std::string>());
    }
    trials.push_back(std::move(trial));
  }
  return trials;
}

Trial trial_from_manifest(const std::string& manifest, int64_t index) {
  std::vector<Trial> trials = parse_manifest(manifest);
  const auto found = std::find_if(trials.begin(), trials.end(), [&](const Trial& t) { return t.index == index; });
  if (found != trials.end()) return std::move(*found);
  throw Error(fmt::format(
      "the sweep manifest has no trial {}; it has {} trials{}. HINT: the job array's --array range must match the "
      "sweep (SLURM_ARRAY_TASK_ID picks the trial).",
      index, trials.size(),
      trials.empty() ? "" : fmt::format(", indices {} to {}", trials.front().index, trials.back().index)));
}

std::vector<std::string> trial_flags_from_manifest(const std::string& manifest, int64_t index) {
  return trial_from_manifest(manifest, index).flags();
}

}  // namespace volt::slurm
