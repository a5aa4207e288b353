#include "volt/core/env.h"

#include "volt/core/error.h"
#include "volt/core/strings.h"

extern char** environ;

namespace volt {

Env Env::from_process() {
  std::map<std::string, std::string> vars;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string entry(*e);
    const auto eq = entry.find('=');
    if (eq == std::string::npos) continue;
    vars.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return Env(std::move(vars));
}

std::optional<std::string> Env::get(const std::string& name) const {
  const auto it = vars_.find(name);
  if (it == vars_.end()) return std::nullopt;
  return it->second;
}

std::string Env::get_or(const std::string& name, const std::string& fallback) const {
  return get(name).value_or(fallback);
}

std::optional<long long> Env::get_int(const std::string& name) const {
  const auto value = get(name);
  if (!value) return std::nullopt;
  const auto parsed = parse_int(*value);
  VOLT_CHECK(parsed.has_value(),
             "environment variable {}='{}' is not an integer. HINT: unset it or set it to a whole "
             "number.",
             name, *value);
  return parsed;
}

Env Env::with(const std::string& name, const std::string& value) const {
  auto vars = vars_;
  vars[name] = value;
  return Env(std::move(vars));
}

}  // namespace volt
