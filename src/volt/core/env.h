// An injected view of environment variables.
//
// Everything Volt derives from the environment (ranks, SLURM ids, thread counts) is a pure
// function of an Env, so SLURM, torchrun and local runs are unit-testable without a cluster.
// Only the CLI and Trainer entry points call Env::from_process().
#pragma once

#include <map>
#include <optional>
#include <string>

namespace volt {

/// An immutable map of environment variables with typed, validated getters.
class Env {
 public:
  /// The variables, by name.
  using Vars = std::map<std::string, std::string>;

  Env() = default;
  /// Wraps an explicit map (tests, or a child process's environment being built).
  explicit Env(Vars vars) : vars_(std::move(vars)) {}

  /// A snapshot of this process's environment (`environ`).
  static Env from_process();

  /// The value of `name`, or nullopt when unset.
  std::optional<std::string> get(const std::string& name) const;
  /// The value of `name`, or `fallback` when unset.
  std::string get_or(const std::string& name, const std::string& fallback) const;
  /// True when `name` is set (even to an empty string).
  bool has(const std::string& name) const { return vars_.count(name) != 0; }
  /// `name` parsed as a base-10 integer; throws volt::Error naming the variable when malformed.
  std::optional<long long> get_int(const std::string& name) const;

  /// A copy with `name` set to `value`.
  Env with(const std::string& name, const std::string& value) const;
  /// All variables, sorted by name.
  const std::map<std::string, std::string>& vars() const { return vars_; }

 private:
  std::map<std::string, std::string> vars_;
};

}  // namespace volt
