#include "volt/environments/restarts.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <vector>

#include "volt/core/error.h"
#include "volt/core/strings.h"

namespace volt {

namespace {

int64_t count_of(const Env& env, const std::string& name) {
  const std::string text = env.get_or(name, "");
  const auto n = parse_int(text);
  VOLT_CHECK(n && *n >= 0, "{}='{}' is not a restart count. HINT: unset it, or set a whole number >= 0.", name, text);
  return *n;
}

constexpr const char* kFaultHint =
    "HINT: VOLT_INJECT_FAULT takes comma-separated key=value pairs, e.g. 'rank=1,step=7,at=snapshot,attempt=0', "
    "several faults separated by ';' (rank required, step too but at rendezvous; at: step, snapshot, validation or "
    "rendezvous; attempt: default 0).";

/// One fault of VOLT_INJECT_FAULT (`text`, the whole variable, for messages) and its attempt.
std::pair<FaultInjection, int64_t> parse_fault(const std::string& text, const std::string& one) {
  std::map<std::string, std::string> fields;
  for (const std::string& part : split(one, ',')) {
    const auto eq = part.find('=');
    VOLT_CHECK(eq != std::string::npos && eq > 0, "VOLT_INJECT_FAULT='{}': '{}' is not key=value. {}", text, part,
               kFaultHint);
    fields[part.substr(0, eq)] = part.substr(eq + 1);
  }
  for (const auto& [key, value] : fields) {
    VOLT_CHECK(key == "rank" || key == "step" || key == "at" || key == "attempt",
               "VOLT_INJECT_FAULT='{}': unknown key '{}'. {}", text, key, kFaultHint);
  }
  const auto number = [&](const std::string& key, std::optional<int64_t> fallback) -> int64_t {
    const auto it = fields.find(key);
    if (it == fields.end()) {
      VOLT_CHECK(fallback.has_value(), "VOLT_INJECT_FAULT='{}' has no {} in '{}'. {}", text, key, one, kFaultHint);
      return *fallback;
    }
    const auto n = parse_int(it->second);
    VOLT_CHECK(n && *n >= 0, "VOLT_INJECT_FAULT='{}': {}='{}' is not a whole number >= 0. {}", text, key, it->second,
               kFaultHint);
    return *n;
  };
  FaultInjection fault;
  const std::string at = fields.count("at") ? fields["at"] : "step";
  if (at == "step") {
    fault.at = FaultPoint::kStep;
  } else if (at == "snapshot") {
    fault.at = FaultPoint::kSnapshot;
  } else if (at == "validation") {
    fault.at = FaultPoint::kValidation;
  } else if (at == "rendezvous") {
    fault.at = FaultPoint::kRendezvous;
  } else {
    throw Error(fmt::format("VOLT_INJECT_FAULT='{}': at='{}' is not step, snapshot, validation or rendezvous. {}", text,
                            at, kFaultHint));
  }
  fault.rank = number("rank", std::nullopt);
  fault.step = number("step", fault.at == FaultPoint::kRendezvous ? std::optional<int64_t>(0) : std::nullopt);
  VOLT_CHECK(fault.at != FaultPoint::kSnapshot || fault.rank == 0,
             "VOLT_INJECT_FAULT='{}': at=snapshot needs rank=0, the process that writes snapshots. {}", text,
             kFaultHint);
  return {fault, number("attempt", 0)};
}

}  // namespace

int64_t restart_attempt(const Env& env) {
  if (env.has("TORCHELASTIC_RESTART_COUNT")) return count_of(env, "TORCHELASTIC_RESTART_COUNT");
  if (env.has("VOLT_RESTART_COUNT")) return count_of(env, "VOLT_RESTART_COUNT");
  return 0;
}

const char* to_string(FaultPoint point) {
  switch (point) {
    case FaultPoint::kStep:
      return "step";
    case FaultPoint::kSnapshot:
      return "snapshot";
    case FaultPoint::kValidation:
      return "validation";
    case FaultPoint::kRendezvous:
      return "rendezvous";
  }
  return "?";
}

std::optional<FaultInjection> read_fault_injection(const Env& env, int64_t attempt) {
  if (!env.has("VOLT_INJECT_FAULT")) return std::nullopt;
  const std::string text = env.get_or("VOLT_INJECT_FAULT", "");
  std::optional<FaultInjection> found;
  std::map<int64_t, int> per_attempt;
  for (const std::string& one : split(text, ';')) {
    const auto [fault, its_attempt] = parse_fault(text, one);
    VOLT_CHECK(++per_attempt[its_attempt] == 1,
               "VOLT_INJECT_FAULT='{}' names attempt {} twice; one fault strikes per attempt. {}", text, its_attempt,
               kFaultHint);
    if (its_attempt == attempt) found = fault;
  }
  return found;
}

void die_of_injected_fault() {
  ::kill(::getpid(), SIGKILL);
  std::abort();  // not reached: SIGKILL cannot be caught
}

}  // namespace volt
