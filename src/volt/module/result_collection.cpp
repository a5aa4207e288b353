#include "volt/module/result_collection.h"

#include <algorithm>

#include "volt/core/error.h"

namespace volt {

ResultCollection::ResultCollection(bool training, SyncFn sync) : training_(training), sync_(std::move(sync)) {}

void ResultCollection::log(const std::string& name, const torch::Tensor& value, const LogOptions& options) {
  VOLT_CHECK(value.defined() && value.numel() == 1,
             "log('{}') got a tensor of shape {}; expected a single value. HINT: reduce it first, "
             "e.g. with .mean().",
             name, value.defined() ? c10::str(value.sizes()) : std::string("(undefined)"));
  auto [it, inserted] = entries_.try_emplace(suffix_.empty() ? name : name + suffix_);
  Entry& entry = it->second;
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
  if (options.sync_dist && sync_ && *entry.options.on_step) v = sync_(v, options.reduce_fx);
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

void ResultCollection::sync_epoch(const std::function<void(torch::Tensor&, Reduce)>& reduce) {
  std::vector<Entry*> sums;  // means and sums: aggregate and weight add up across processes
  std::vector<Entry*> maxima;
  std::vector<Entry*> minima;
  for (auto& [name, entry] : entries_) {
    if (!entry.options.sync_dist || !*entry.options.on_epoch) continue;
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
    reduce(packed, Reduce::kSum);
    for (size_t i = 0; i < sums.size(); ++i) {
      sums[i]->aggregate = data[2 * i];
      sums[i]->weight = data[2 * i + 1];
    }
  }
  for (auto [group, op] : {std::make_pair(&maxima, Reduce::kMax), std::make_pair(&minima, Reduce::kMin)}) {
    if (group->empty()) continue;
    torch::Tensor packed = torch::empty({static_cast<int64_t>(group->size())}, torch::kDouble);
    for (size_t i = 0; i < group->size(); ++i) packed.data_ptr<double>()[i] = (*group)[i]->aggregate;
    reduce(packed, op);
    for (size_t i = 0; i < group->size(); ++i) (*group)[i]->aggregate = packed.data_ptr<double>()[i];
  }
}

void ResultCollection::reset() { entries_.clear(); }

}  // namespace volt
