#include "volt/module/result_collection.h"

#include <algorithm>

#include "volt/base/collectives.h"
#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/metrics/metric.h"

namespace volt {

ResultCollection::ResultCollection(bool training, Collectives* step_sync)
    : training_(training), step_sync_(step_sync) {}

void ResultCollection::log(const std::string& name, const torch::Tensor& value, const LogOptions& options) {
  VOLT_CHECK(value.defined() && value.numel() == 1,
             "log('{}') got a tensor of shape {}; expected a single value. HINT: reduce it first, "
             "e.g. with .mean().",
             name, value.defined() ? c10::str(value.sizes()) : std::string("(undefined)"));
  auto [it, inserted] = entries_.try_emplace(suffix_.empty() ? name : name + suffix_);
  Entry& entry = it->second;
  VOLT_CHECK(entry.metric == nullptr,
             "log('{}') got a value, but a Metric was logged under that name in this epoch. HINT: log each name "
             "either as a Metric or as values.",
             name);
  if (inserted) {
    entry.options = options;
    entry.options.on_step = options.on_step.value_or(training_);
    entry.options.on_epoch = options.on_epoch.value_or(!training_);
  } else {
    VOLT_CHECK(entry.options.reduce_fx == options.reduce_fx,
               "log('{}') was called with reduce_fx={} after reduce_fx={} in the same epoch. HINT: log "
               "each name with one reduce_fx.",
               name, to_string(options.reduce_fx), to_string(entry.options.reduce_fx));
  }
  // A CPU scalar is read directly; .item() on a device tensor synchronizes, which is the price
  // of exact per-epoch means on any device.
  double v = value.item<double>();
  // The step value shown for on_step is synchronized per call; epoch aggregates are synchronized
  // once per epoch by sync_epoch, which is exact for weighted means.
  if (options.sync_dist && step_sync_ != nullptr && *entry.options.on_step)
    v = step_sync_->all_reduce(v, options.reduce_fx);
  const double weight = static_cast<double>(options.batch_size.value_or(batch_size_));
  entry.last = v;
  switch (entry.options.reduce_fx) {
    case Reduce::kMean:
      entry.aggregate += v * weight;
      entry.weight += weight;
      break;
    case Reduce::kSum:
      entry.aggregate += v;
      break;
    case Reduce::kMax:
      entry.aggregate = entry.count == 0 ? v : std::max(entry.aggregate, v);
      break;
    case Reduce::kMin:
      entry.aggregate = entry.count == 0 ? v : std::min(entry.aggregate, v);
      break;
  }
  ++entry.count;
}

void ResultCollection::log_metric(const std::string& name, Metric& metric, const LogOptions& options) {
  VOLT_CHECK(!options.on_step.value_or(false),
             "log('{}', metric) with on_step=true: a Metric has a value only over the epoch (Volt computes it once, "
             "at the epoch's end). HINT: drop on_step, and log a per-batch value as a tensor under another name.",
             name);
  VOLT_CHECK(options.on_epoch.value_or(true),
             "log('{}', metric) with on_epoch=false: a Metric is logged at the end of the epoch or not at all. "
             "HINT: drop on_epoch=false.",
             name);
  const std::string key = suffix_.empty() ? name : name + suffix_;
  auto [it, inserted] = entries_.try_emplace(key);
  Entry& entry = it->second;
  if (inserted) {
    entry.options = options;
    entry.options.on_step = false;
    entry.options.on_epoch = true;
    entry.metric = &metric;
    return;
  }
  VOLT_CHECK(entry.metric != nullptr,
             "log('{}', metric): values were logged under that name in this epoch. HINT: log each name either as "
             "a Metric or as values.",
             name);
  VOLT_CHECK(entry.metric == &metric,
             "log('{}', metric) got another Metric than the one logged under that name earlier in this epoch. "
             "HINT: log each metric under a name of its own.",
             name);
}

void ResultCollection::keep_metrics_from(const ResultCollection& other) {
  for (const auto& [name, entry] : other.entries_) {
    if (entry.metric != nullptr) entries_.try_emplace(name, entry);
  }
}

bool ResultCollection::wanted(const Entry& entry, MetricTarget target) {
  switch (target) {
    case MetricTarget::kLogger:
      return entry.options.logger;
    case MetricTarget::kProgBar:
      return entry.options.prog_bar;
    case MetricTarget::kCallback:
      return true;
  }
  return false;
}

std::map<std::string, double> ResultCollection::step_metrics(MetricTarget target) const {
  std::map<std::string, double> out;
  for (const auto& [name, entry] : entries_) {
    if (!*entry.options.on_step || !wanted(entry, target)) continue;
    const bool both = *entry.options.on_epoch;
    out[both && target != MetricTarget::kCallback ? name + "_step" : name] = entry.last;
    if (both && target == MetricTarget::kCallback) out[name + "_step"] = entry.last;
  }
  return out;
}

std::map<std::string, double> ResultCollection::epoch_metrics(MetricTarget target) const {
  std::map<std::string, double> out;
  for (const auto& [name, entry] : entries_) {
    if (!*entry.options.on_epoch || entry.count == 0 || !wanted(entry, target)) continue;
    double value = entry.aggregate;
    if (entry.options.reduce_fx == Reduce::kMean) value = entry.weight > 0 ? entry.aggregate / entry.weight : 0.0;
    const bool both = *entry.options.on_step;
    out[both && target != MetricTarget::kCallback ? name + "_epoch" : name] = value;
    if (both && target == MetricTarget::kCallback) out[name + "_epoch"] = value;
  }
  return out;
}

void ResultCollection::sync_epoch(Collectives& collectives) {
  compute_metrics(collectives);
  std::vector<Entry*> sums;  // means and sums: aggregate and weight add up across processes
  std::vector<Entry*> maxima;
  std::vector<Entry*> minima;
  for (auto& [name, entry] : entries_) {
    if (!entry.options.sync_dist || !*entry.options.on_epoch || entry.metric != nullptr) continue;
    switch (entry.options.reduce_fx) {
      case Reduce::kMean:
      case Reduce::kSum:
        sums.push_back(&entry);
        break;
      case Reduce::kMax:
        maxima.push_back(&entry);
        break;
      case Reduce::kMin:
        minima.push_back(&entry);
        break;
    }
  }
  if (!sums.empty()) {
    torch::Tensor packed = torch::empty({static_cast<int64_t>(sums.size()) * 2}, torch::kDouble);
    auto* data = packed.data_ptr<double>();
    for (size_t i = 0; i < sums.size(); ++i) {
      data[2 * i] = sums[i]->aggregate;
      data[2 * i + 1] = sums[i]->weight;
    }
    collectives.all_reduce(packed, Reduce::kSum);
    for (size_t i = 0; i < sums.size(); ++i) {
      sums[i]->aggregate = data[2 * i];
      sums[i]->weight = data[2 * i + 1];
    }
  }
  for (auto [group, op] : {std::make_pair(&maxima, Reduce::kMax), std::make_pair(&minima, Reduce::kMin)}) {
    if (group->empty()) continue;
    torch::Tensor packed = torch::empty({static_cast<int64_t>(group->size())}, torch::kDouble);
    for (size_t i = 0; i < group->size(); ++i) packed.data_ptr<double>()[i] = (*group)[i]->aggregate;
    collectives.all_reduce(packed, op);
    for (size_t i = 0; i < group->size(); ++i) (*group)[i]->aggregate = packed.data_ptr<double>()[i];
  }
}

namespace {
// FNV-1a over the names, folded to 62 bits so that kLimit - hash never overflows.
constexpr int64_t kHashLimit = (int64_t{1} << 62) - 1;
int64_t names_hash(const std::vector<std::string>& names) {
  uint64_t h = 1469598103934665603ULL;
  for (const std::string& name : names) {
    for (const char c : name + '\0') {
      h ^= static_cast<unsigned char>(c);
      h *= 1099511628211ULL;
    }
  }
  return static_cast<int64_t>(h & static_cast<uint64_t>(kHashLimit));
}
}  // namespace

void ResultCollection::compute_metrics(Collectives& group) {
  std::vector<std::string> names;  // the map's order: the same on every process
  for (const auto& [name, entry] : entries_) {
    if (entry.metric != nullptr) names.push_back(name);
  }
  if (group.world_size() > 1) {
    // max(h) and max(limit - h) = limit - min(h): the same on every process, equal iff all agree.
    const int64_t h = names_hash(names);
    torch::Tensor both = torch::tensor({h, kHashLimit - h}, torch::kLong);
    group.all_reduce(both, Reduce::kMax);
    const auto* agreed = both.data_ptr<int64_t>();
    VOLT_CHECK(agreed[0] == kHashLimit - agreed[1],
               "The processes logged different Metrics in this epoch (this one, rank {}: [{}]); each computes them "
               "together with the others at the epoch's end, so every process must log the same names. HINT: "
               "call log(name, metric) unconditionally in the step, on every process.",
               group.rank(), join(names, ", "));
  }
  for (auto& [name, entry] : entries_) {
    if (entry.metric == nullptr) continue;
    const torch::Tensor value = entry.metric->compute(group);
    VOLT_CHECK(value.numel() == 1,
               "log('{}', metric): {}.compute() gave a tensor of shape {}; a logged metric must be a single value. "
               "HINT: log a single-valued metric (e.g. average='macro'), or compute() this one yourself in an "
               "epoch-end hook and log its elements.",
               name, entry.metric->name(), c10::str(value.sizes()));
    // One value of weight 1, so that epoch_metrics' weighted mean (the default reduce_fx) is it.
    entry.aggregate = value.to(torch::kCPU).item<double>();
    entry.weight = 1.0;
    entry.count = 1;
    entry.metric->reset();
  }
}

void ResultCollection::reset() { entries_.clear(); }

}  // namespace volt
