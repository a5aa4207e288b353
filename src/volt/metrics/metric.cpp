#include "volt/metrics/metric.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <atomic>
#include <exception>
#include <utility>

#include "volt/core/error.h"
#include "volt/core/strings.h"

namespace volt {
namespace {

constexpr const char* kMetricKey = "metric";
constexpr const char* kUpdateCountKey = "update_count";
constexpr const char* kStatesKey = "states";
constexpr const char* kWorldSizeKey = "world_size";
constexpr const char* kRanksKey = "ranks";

Reduce collective_reduce(StateReduce reduce) {
  switch (reduce) {
    case StateReduce::kSum:
      return Reduce::kSum;
    case StateReduce::kMean:
      return Reduce::kMean;
    case StateReduce::kMax:
      return Reduce::kMax;
    case StateReduce::kMin:
      return Reduce::kMin;
    case StateReduce::kCat:
      break;
  }
  VOLT_INTERNAL_ASSERT(false, "a kCat state is gathered, not reduced");
}

std::string shape_of(const torch::Tensor& t) {
  std::vector<std::string> sizes;
  for (const int64_t size : t.sizes()) sizes.push_back(std::to_string(size));
  return fmt::format("[{}] {}", join(sizes, ", "), c10::toString(t.scalar_type()));
}

/// Whether `t` fits a state declared with `default_value`: same dtype, same shape (for kCat: the
/// same dimensions after the first).
bool fits(const torch::Tensor& t, const torch::Tensor& default_value, StateReduce reduce) {
  if (t.scalar_type() != default_value.scalar_type() || t.dim() != default_value.dim()) return false;
  if (reduce != StateReduce::kCat) return t.sizes() == default_value.sizes();
  return t.sizes().slice(1) == default_value.sizes().slice(1);
}

}  // namespace

const char* to_string(StateReduce reduce) {
  switch (reduce) {
    case StateReduce::kSum:
      return "sum";
    case StateReduce::kMean:
      return "mean";
    case StateReduce::kMax:
      return "max";
    case StateReduce::kMin:
      return "min";
    case StateReduce::kCat:
      return "cat";
  }
  return "?";
}

StateReduce parse_state_reduce(std::string_view text) {
  const StateReduce all[] = {StateReduce::kSum, StateReduce::kMean, StateReduce::kMax, StateReduce::kMin,
                             StateReduce::kCat};
  return parse_enum(text, all, "state reduction");
}

Metric::Metric(std::string name) : name_(std::move(name)) {}

namespace {
// How many DiscardMetricUpdates scopes live (see metric.h).
std::atomic<int> g_discarding{0};
}  // namespace

namespace internal {
DiscardMetricUpdates::DiscardMetricUpdates() { g_discarding.fetch_add(1); }
DiscardMetricUpdates::~DiscardMetricUpdates() { g_discarding.fetch_sub(1); }
}  // namespace internal

void Metric::update(const torch::Tensor& preds, const torch::Tensor& target) {
  if (g_discarding.load() > 0) return;
  // No autograd history in the states: they outlive the step whose graph made the inputs.
  torch::NoGradGuard no_grad;
  const std::lock_guard<std::mutex> lock(update_mutex_);
  update_state(preds.detach(), target.detach());
  ++update_count_;
}

torch::Tensor Metric::compute(Collectives& collectives) {
  torch::NoGradGuard no_grad;
  return compute_from(synced(collectives));
}

void Metric::reset() {
  for (State& s : states_) {
    s.value = s.default_value.clone();
    s.rows.clear();
  }
  update_count_ = 0;
}

void Metric::add_state(const std::string& name, const torch::Tensor& default_value, StateReduce reduce) {
  VOLT_INTERNAL_ASSERT(default_value.defined(), "state '{}' of {} needs a default value", name, name_);
  for (const State& s : states_) VOLT_INTERNAL_ASSERT(s.name != name, "{} declares state '{}' twice", name_, name);
  VOLT_INTERNAL_ASSERT(reduce != StateReduce::kMean || default_value.is_floating_point(),
                       "kMean state '{}' of {} must be floating point (the mean divides)", name, name_);
  VOLT_INTERNAL_ASSERT(reduce != StateReduce::kCat || (default_value.dim() >= 1 && default_value.size(0) == 0),
                       "kCat state '{}' of {} needs an empty default (0 rows) that gives the row shape, got {}", name,
                       name_, shape_of(default_value));
  State s{name, reduce, default_value.detach().clone(), default_value.detach().clone(), {}};
  states_.push_back(std::move(s));
}

Metric::State& Metric::find(const std::string& name) {
  for (State& s : states_) {
    if (s.name == name) return s;
  }
  VOLT_INTERNAL_ASSERT(false, "{} has no state '{}'", name_, name);
}

torch::Tensor& Metric::state(const std::string& name) {
  State& s = find(name);
  VOLT_INTERNAL_ASSERT(s.reduce != StateReduce::kCat, "{}'s state '{}' is a cat state: append() to it", name_, name);
  return s.value;
}

void Metric::append(const std::string& name, const torch::Tensor& rows) {
  State& s = find(name);
  VOLT_INTERNAL_ASSERT(s.reduce == StateReduce::kCat, "{}'s state '{}' is a {} state: change it through state()", name_,
                       name, to_string(s.reduce));
  const torch::Tensor converted = rows.detach().to(s.default_value.device(), s.default_value.scalar_type());
  VOLT_INTERNAL_ASSERT(fits(converted, s.default_value, StateReduce::kCat),
                       "{} appends rows {} to state '{}' declared as {}", name_, shape_of(rows), name,
                       shape_of(s.default_value));
  if (converted.size(0) > 0) s.rows.push_back(converted.clone());
}

torch::Tensor Metric::concatenated(const State& state) {
  if (state.rows.empty()) return state.default_value;
  if (state.rows.size() == 1) return state.rows.front();
  return torch::cat(state.rows);
}

Metric::States Metric::synced(Collectives& collectives) const {
  States out;
  const bool alone = collectives.world_size() == 1;
  const auto sync_failed = [&](const std::string& what, const std::exception& e) {
    return Error(fmt::format(
        "rank {} of {}: {}.compute() could not sync {}: {}. HINT: compute() is a collective: every process "
        "must call it for the same metrics in the same order, also a process that saw no data; a process that "
        "exited or skipped it fails the others after the process group's timeout.",
        collectives.rank(), collectives.world_size(), name_, what, e.what()));
  };

  // The reduced states in groups of one reduction and dtype, one collective per group, in the
  // order of their first state: the same order on every process.
  struct Group {
    StateReduce reduce;
    c10::ScalarType dtype;
    std::vector<const State*> members;
  };
  std::vector<Group> groups;
  for (const State& s : states_) {
    if (s.reduce == StateReduce::kCat) continue;
    Group* group = nullptr;
    for (Group& g : groups) {
      if (g.reduce == s.reduce && g.dtype == s.value.scalar_type()) group = &g;
    }
    if (group == nullptr) group = &groups.emplace_back(Group{s.reduce, s.value.scalar_type(), {}});
    group->members.push_back(&s);
  }
  for (const Group& g : groups) {
    std::vector<torch::Tensor> flat;
    std::vector<std::string> names;
    for (const State* s : g.members) {
      flat.push_back(s->value.reshape({-1}));
      names.push_back("'" + s->name + "'");
    }
    torch::Tensor values = torch::cat(flat);  // a copy: the local states stay as they are
    if (!alone) {
      try {
        collectives.all_reduce(values, collective_reduce(g.reduce));
      } catch (const std::exception& e) {
        throw sync_failed(fmt::format("its {} states {} (all_reduce)", to_string(g.reduce), join(names, ", ")), e);
      }
    }
    int64_t offset = 0;
    for (const State* s : g.members) {
      out[s->name] = values.narrow(0, offset, s->value.numel()).view(s->value.sizes());
      offset += s->value.numel();
    }
  }
  for (const State& s : states_) {
    if (s.reduce != StateReduce::kCat) continue;
    if (alone) {
      out[s.name] = concatenated(s);
      continue;
    }
    try {
      out[s.name] = torch::cat(collectives.all_gather(concatenated(s)));
    } catch (const std::exception& e) {
      throw sync_failed(fmt::format("its cat state '{}' (all_gather)", s.name), e);
    }
  }
  return out;
}

StateDict Metric::state_dict() const {
  StateDict states = make_state_dict();
  for (const State& s : states_) {
    states.insert(s.name, (s.reduce == StateReduce::kCat ? concatenated(s) : s.value).cpu().clone());
  }
  StateDict out = make_state_dict();
  out.insert(kMetricKey, name_);
  out.insert(kUpdateCountKey, update_count_);
  out.insert(kStatesKey, states);
  return out;
}

void Metric::load_state_dict(const StateDict& state) { load_local(state, "the checkpoint"); }

void Metric::load_local(const StateDict& state, const std::string& where) {
  const auto missing = [&](const char* key) {
    return CheckpointError(
        fmt::format("{} has no '{}' for {}; found keys: {}. HINT: load what state_dict() of the same metric saved.",
                    where, key, name_, [&] {
                      std::vector<std::string> keys;
                      for (const auto& entry : state) keys.push_back(entry.key().toStringRef());
                      return join(keys, ", ");
                    }()));
  };
  if (state.contains(kMetricKey) && state.at(kMetricKey).toStringRef() != name_) {
    throw CheckpointError(
        fmt::format("{} holds the states of a {}, not of a {}. HINT: load each metric's own "
                    "state_dict().",
                    where, state.at(kMetricKey).toStringRef(), name_));
  }
  if (!state.contains(kStatesKey)) throw missing(kStatesKey);
  if (!state.contains(kUpdateCountKey)) throw missing(kUpdateCountKey);
  // A generic dict: one read back from a file has Any-typed keys.
  const StateDict saved = state.at(kStatesKey).toGenericDict();
  std::vector<torch::Tensor> loaded;
  for (const State& s : states_) {
    if (!saved.contains(s.name)) {
      throw CheckpointError(
          fmt::format("{} has no state '{}' of {}. HINT: the metric's options (e.g. "
                      "num_classes) must be those it was saved with.",
                      where, s.name, name_));
    }
    const torch::Tensor t = saved.at(s.name).toTensor();
    if (!fits(t, s.default_value, s.reduce)) {
      throw CheckpointError(fmt::format(
          "{} holds {}'s state '{}' as {}, but this {} expects {}{}. HINT: the metric's options (e.g. num_classes) "
          "must be those it was saved with.",
          where, name_, s.name, shape_of(t), name_, shape_of(s.default_value),
          s.reduce == StateReduce::kCat ? " (any number of rows)" : ""));
    }
    loaded.push_back(t);
  }
  for (size_t i = 0; i < states_.size(); ++i) {
    State& s = states_[i];
    const torch::Tensor t = loaded[i].to(s.default_value.device()).clone();
    s.rows.clear();
    if (s.reduce == StateReduce::kCat) {
      if (t.size(0) > 0) s.rows.push_back(t);
    } else {
      s.value = t;
    }
  }
  update_count_ = state.at(kUpdateCountKey).toInt();
}

StateDict Metric::gathered_state_dict(Collectives& collectives) const {
  const int64_t world = collectives.world_size();
  const std::vector<torch::Tensor> counts = collectives.all_gather(torch::tensor({update_count_}, torch::kLong));
  std::vector<StateDict> ranks;
  for (int64_t r = 0; r < world; ++r) {
    StateDict one = make_state_dict();
    one.insert(kMetricKey, name_);
    one.insert(kUpdateCountKey, counts[static_cast<size_t>(r)].cpu().item<int64_t>());
    one.insert(kStatesKey, make_state_dict());
    ranks.push_back(one);
  }
  for (const State& s : states_) {
    const torch::Tensor local = s.reduce == StateReduce::kCat ? concatenated(s) : s.value;
    const std::vector<torch::Tensor> each = collectives.all_gather(local);
    for (int64_t r = 0; r < world; ++r) {
      ranks[static_cast<size_t>(r)]
          .at(kStatesKey)
          .toGenericDict()
          .insert(s.name, each[static_cast<size_t>(r)].cpu().clone());
    }
  }
  c10::impl::GenericList list(c10::AnyType::get());
  for (const StateDict& one : ranks) list.push_back(one);
  StateDict out = make_state_dict();
  out.insert(kMetricKey, name_);
  out.insert(kWorldSizeKey, world);
  out.insert(kRanksKey, list);
  return out;
}

void Metric::load_gathered_state_dict(const StateDict& state, const Collectives& collectives) {
  const std::string where = "the gathered metric state";
  for (const char* key : {kWorldSizeKey, kRanksKey}) {
    if (!state.contains(key)) {
      throw CheckpointError(
          fmt::format("{} of {} has no '{}'. HINT: load what gathered_state_dict() saved (a "
                      "single process's state_dict() loads with load_state_dict()).",
                      where, name_, key));
    }
  }
  const int64_t saved_world = state.at(kWorldSizeKey).toInt();
  const c10::List<c10::IValue> ranks = state.at(kRanksKey).toList();
  if (static_cast<int64_t>(ranks.size()) != saved_world) {
    throw CheckpointError(fmt::format("{} of {} says world_size {} but holds {} ranks' states.", where, name_,
                                      saved_world, ranks.size()));
  }
  if (saved_world == collectives.world_size()) {
    load_local(ranks.get(static_cast<size_t>(collectives.rank())).toGenericDict(),
               fmt::format("rank {}'s part of {}", collectives.rank(), where));
    return;
  }
  for (const State& s : states_) {
    if (s.reduce != StateReduce::kMean) continue;
    throw CheckpointError(fmt::format(
        "{} was saved by {} processes and is loaded by {}, but its state '{}' is a mean of the processes' values, "
        "which cannot be redistributed over another number of processes. HINT: resume on {} processes, or reset() "
        "the metric after loading to start it over.",
        name_, saved_world, collectives.world_size(), s.name, saved_world));
  }
  // Every process checks every saved rank (so all of them fail alike), then rank 0 takes the fold.
  Metric::States folded;
  int64_t count = 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    load_local(ranks.get(r).toGenericDict(), fmt::format("rank {}'s part of {}", r, where));
    count += update_count_;
    for (const State& s : states_) {
      const torch::Tensor mine = s.reduce == StateReduce::kCat ? concatenated(s) : s.value;
      auto it = folded.find(s.name);
      if (it == folded.end()) {
        folded[s.name] = mine;
        continue;
      }
      switch (s.reduce) {
        case StateReduce::kSum:
          it->second = it->second + mine;
          break;
        case StateReduce::kMax:
          it->second = torch::maximum(it->second, mine);
          break;
        case StateReduce::kMin:
          it->second = torch::minimum(it->second, mine);
          break;
        case StateReduce::kCat:
          it->second = torch::cat({it->second, mine});
          break;
        case StateReduce::kMean:
          VOLT_INTERNAL_ASSERT(false, "kMean states were refused above");
      }
    }
  }
  reset();
  if (collectives.rank() != 0) return;
  for (State& s : states_) {
    const torch::Tensor& value = folded.at(s.name);
    if (s.reduce != StateReduce::kCat) {
      s.value = value;
    } else if (value.size(0) > 0) {
      s.rows.push_back(value);
    }
  }
  update_count_ = count;
}

}  // namespace volt
