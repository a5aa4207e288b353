// Hyperparameter sweeps: parameters expand into trials, each a list of command-line flags, and a
// manifest maps a job array's task index to its trial (after test_tube's HyperOptArgumentParser).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace volt::slurm {

/// The most trials one sweep may produce; a bigger grid is almost always a mistake.
inline constexpr int64_t kMaxTrials = 100000;

/// How a sweep picks its trials: every combination (grid) or independent random draws.
enum class SearchKind { kGrid, kRandom };
/// "grid" or "random".
const char* to_string(SearchKind kind);
/// Parses "grid" or "random"; throws volt::Error listing the accepted names.
SearchKind parse_search_kind(std::string_view text);

/// What values a sweep parameter takes.
enum class ParameterKind {
  kChoice,      ///< one of a list of values
  kIntRange,    ///< low, low + step, ... up to high (integers)
  kFloatRange,  ///< low, low + step, ... up to high (floats)
  kUniform,     ///< any float in [low, high], equally likely (random search only)
  kLogUniform,  ///< any float in [low, high], log equally likely (random search only)
};
/// "choice", "int_range", "float_range", "uniform" or "log_uniform".
const char* to_string(ParameterKind kind);
/// Parses a ParameterKind by its to_string name; throws volt::Error listing the accepted names.
ParameterKind parse_parameter_kind(std::string_view text);

/// One swept command-line flag and the values it takes.
///
/// Built with the factories, e.g.
///   std::vector<SweepParameter> sweep{SweepParameter::log_uniform("lr", 1e-4, 1e-1),
///                                     SweepParameter::choice("batch_size", {32, 64}),
///                                     SweepParameter::choice("optimizer", {"adam", "sgd"})};
struct SweepParameter {
  /// The flag without dashes: "lr" becomes `--lr`. Letters, digits, '_' and '-'.
  std::string name;
  /// Which of the fields below define the values.
  ParameterKind kind = ParameterKind::kChoice;
  /// The values of a kChoice parameter, as they are passed on the command line.
  std::vector<std::string> values;
  /// The lower bound of a range (inclusive).
  double low = 0;
  /// The upper bound of a range (inclusive for stepped ranges when a step lands on it).
  double high = 0;
  /// The distance between values of kIntRange and kFloatRange.
  double step = 0;

  /// A parameter taking one of `values`, e.g. choice("optimizer", {"adam", "sgd"}).
  static SweepParameter choice(std::string name, std::vector<std::string> values);
  /// A parameter taking one of numeric `values`, e.g. choice("lr", {0.1, 0.01}), each written
  /// as the shortest text that reads back as the same double ("0.001", "64"). An initializer
  /// list, because a vector<double> overload makes {"adam", "sgd"} ambiguous.
  static SweepParameter choice(std::string name, std::initializer_list<double> values);
  /// Integers low, low + step, ... <= high, e.g. int_range("layers", 2, 8, 2) gives 2, 4, 6, 8.
  static SweepParameter int_range(std::string name, int64_t low, int64_t high, int64_t step = 1);
  /// Floats low + i * step <= high, rounded to 15 significant digits so that 0.1 steps give
  /// "0.3" rather than "0.30000000000000004".
  static SweepParameter float_range(std::string name, double low, double high, double step);
  /// Any float in [low, high], drawn uniformly (random search only).
  static SweepParameter uniform(std::string name, double low, double high);
  /// Any float in [low, high] with a uniformly drawn logarithm, for learning rates and weight
  /// decays spanning decades (random search only).
  static SweepParameter log_uniform(std::string name, double low, double high);
};

/// One point of a sweep: its index (the job array's task id) and a value per parameter.
struct Trial {
  /// 0-based position in the sweep; SLURM_ARRAY_TASK_ID of the array task that runs it.
  int64_t index = 0;
  /// (name, value) per parameter, in the order the parameters were given.
  std::vector<std::pair<std::string, std::string>> values;

  /// The trial as command-line arguments: {"--lr", "0.001", "--batch_size", "64"}.
  std::vector<std::string> flags() const;
  /// `root` joined with "trial_<index>", the index zero-padded to 3 digits: "runs/trial_003".
  std::string output_dir(const std::string& root) const;
};

/// Every problem with a sweep, each naming the parameter, what was given, what is expected and
/// a `HINT:`: no parameters, duplicate or malformed names, empty choices, bad ranges (low >=
/// high, step <= 0, non-finite or non-integer bounds, a non-positive log-uniform bound),
/// continuous parameters in a grid, nb_trials <= 0 for a random search, more than kMaxTrials.
std::vector<std::string> validate_sweep(const std::vector<SweepParameter>& parameters, SearchKind kind,
                                        int64_t nb_trials);

/// The trials of a sweep; throws volt::Error listing every problem validate_sweep finds.
///
/// Grid: the cartesian product in odometer order (the last parameter changes fastest, like
/// nested loops over the parameters as given); `nb_trials > 0` keeps only the first nb_trials,
/// `nb_trials <= 0` keeps all. `seed` is unused.
///
/// Random: nb_trials independent trials from std::mt19937_64(seed), which the C++ standard
/// specifies exactly, so a seed gives the same trials everywhere. Each trial draws one 64-bit
/// number `r` per parameter, in order: a discrete parameter (choice or stepped range) with n
/// values takes value number `r % n`; a continuous one uses u = (r >> 11) * 2^-53 in [0, 1):
/// uniform gives low + u * (high - low), log_uniform gives exp(log(low) + u * (log(high) -
/// log(low))), both clamped to [low, high]. Drawn floats are written round-trip ("{}").
std::vector<Trial> expand_sweep(const std::vector<SweepParameter>& parameters, SearchKind kind, int64_t nb_trials,
                                uint64_t seed);

/// A JSON manifest of `trials`, one trial per line, for a job array to find its trial in:
///   {"format": "volt-sweep-manifest", "version": 1, "trials": [
///     {"index":0,"values":{"lr":"0.001","batch_size":"32"}}, ...]}
std::string render_manifest(const std::vector<Trial>& trials);

/// The trials of a manifest render_manifest wrote, in its order; throws volt::Error when it is
/// not one.
std::vector<Trial> parse_manifest(const std::string& manifest);

/// The trial with `index` (SLURM_ARRAY_TASK_ID) in a manifest; throws volt::Error naming the
/// indices it has when there is none.
Trial trial_from_manifest(const std::string& manifest, int64_t index);

/// The flags of the trial with `index` in a manifest: trial_from_manifest(...).flags().
std::vector<std::string> trial_flags_from_manifest(const std::string& manifest, int64_t index);

}  // namespace volt::slurm
