#include "volt/optim/lr_scheduler.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "volt/base/state_dict.h"
#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/optim/field_reader.h"

namespace volt {
namespace {

using internal::FieldReader;
/// The scheduler state as its public API types it (string keys).
using TypedDict = c10::Dict<std::string, c10::IValue>;

constexpr double kPi = 3.14159265358979323846;

constexpr const char* kOptionsHint =
    "HINT: the optimizer's options must implement get_lr() and set_lr() (LibTorch's SGD, Adam, "
    "AdamW, RMSprop, Adagrad and LBFGS do); override them in your OptimizerOptions subclass.";

c10::List<double> to_list(const std::vector<double>& values) { return c10::List<double>(values); }

/// Reads a list of one number per param group.
/// `key`'s list of one value per param group. Groups added after the scheduler was made
/// (BaseFinetuning's) may have none yet: fewer values than groups are accepted, not more.
std::optional<std::vector<double>> per_group(FieldReader& reader, const char* key, size_t groups) {
  auto values = reader.numbers(key);
  if (values && (values->empty() || values->size() > groups)) {
    reader.problem(fmt::format("{} has {} value(s); the optimizer has {} param group(s)", reader.name(key),
                               values->size(), groups));
    return std::nullopt;
  }
  return values;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// LRScheduler

LRScheduler::LRScheduler(torch::optim::Optimizer& optimizer) : optimizer_(&optimizer) {
  base_lrs_ = current_lrs();
  last_lr_ = base_lrs_;
}

LRScheduler::~LRScheduler() = default;

void LRScheduler::step(std::optional<double> metric) {
  if (needs_metric()) {
    VOLT_CHECK(metric.has_value(),
               "{}.step() was called without a metric; it reduces the lr when a monitored "
               "metric stops improving, so it needs one on every step.\nHINT: set the "
               "scheduler's `monitor` to a metric you log (e.g. \"val_loss\"), or call "
               "step(value) yourself.",
               name());
    observe(*metric);
  }
  advance();
}

void LRScheduler::initial_step() { advance(); }

void LRScheduler::advance() {
  ++last_epoch_;
  ++step_count_;
  std::vector<double> lrs = compute_lrs();
  VOLT_INTERNAL_ASSERT(!lrs.empty() && lrs.size() <= group_count(), "{} computed {} lrs for {} groups", name(),
                       lrs.size(), group_count());
  if (lrs.size() < group_count()) {
    // Groups added since construction: their lr now times this step's factor for the first group.
    const std::vector<double> now = current_lrs();
    const double factor = !last_lr_.empty() && last_lr_[0] != 0.0 ? lrs[0] / last_lr_[0] : 1.0;
    for (size_t g = lrs.size(); g < now.size(); ++g) lrs.push_back(now[g] * factor);
  }
  set_lrs(lrs);
  last_lr_ = lrs;
}

std::vector<double> LRScheduler::get_last_lr() const { return last_lr_; }

int64_t LRScheduler::last_epoch() const { return last_epoch_; }

const std::vector<double>& LRScheduler::base_lrs() const { return base_lrs_; }

size_t LRScheduler::group_count() const { return optimizer_->param_groups().size(); }

std::vector<double> LRScheduler::current_lrs() const {
  std::vector<double> lrs;
  try {
    for (const auto& group : optimizer_->param_groups()) lrs.push_back(group.options().get_lr());
  } catch (const c10::Error& e) {
    throw Error(fmt::format("cannot read the optimizer's lr: {}\n{}", e.what_without_backtrace(), kOptionsHint));
  }
  return lrs;
}

void LRScheduler::set_lrs(const std::vector<double>& lrs) {
  try {
    for (size_t i = 0; i < lrs.size(); ++i) {
      optimizer_->param_groups()[i].options().set_lr(lrs[i]);
    }
  } catch (const c10::Error& e) {
    throw Error(fmt::format("cannot set the optimizer's lr: {}\n{}", e.what_without_backtrace(), kOptionsHint));
  }
}

TypedDict LRScheduler::state_dict() const {
  // c10::Dict<std::string, IValue> has no default constructor (its value type must be given).
  TypedDict state = c10::impl::toTypedDict<std::string, c10::IValue>(make_state_dict());
  state.insert(kSchedulerKindKey, name());
  state.insert("last_epoch", last_epoch_);
  state.insert("_step_count", step_count_);
  state.insert("base_lrs", to_list(base_lrs_));
  state.insert("_last_lr", to_list(last_lr_));
  save_fields(state);
  return state;
}

void LRScheduler::load_state_dict(const TypedDict& state) {
  // Fields are assigned as they are read; on a problem, the state from before is put back.
  const TypedDict before = state_dict();
  try {
    load_or_throw(state);
  } catch (...) {
    load_or_throw(before);
    throw;
  }
}

void LRScheduler::load_or_throw(const TypedDict& state) {
  Problems problems;
  FieldReader reader(c10::impl::toGenericDict(state), "scheduler state", problems);
  if (reader.has(kSchedulerKindKey)) {
    const auto kind = reader.string(kSchedulerKindKey);
    if (kind && *kind != name()) {
      reader.problem(fmt::format("the checkpoint holds the state of a {}; this scheduler is a {}", *kind, name()));
    }
  }
  if (problems.empty()) {
    if (const auto v = reader.integer("last_epoch")) last_epoch_ = *v;
    if (const auto v = reader.integer("_step_count")) step_count_ = *v;
    if (auto v = per_group(reader, "base_lrs", group_count())) base_lrs_ = std::move(*v);
    if (auto v = per_group(reader, "_last_lr", group_count())) last_lr_ = std::move(*v);
    load_fields(reader);
  }
  if (problems.empty()) return;
  throw CheckpointError(
      fmt::format("{}\nHINT: create the same scheduler over the same optimizer as the run that wrote the "
                  "checkpoint, or resume without the scheduler state.",
                  describe_problems(fmt::format("the {} state", name()), problems)));
}

// ---------------------------------------------------------------------------------------------
// StepLR

StepLR::StepLR(torch::optim::Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  VOLT_CHECK(step_size > 0,
             "StepLR's step_size is {}; expected > 0. HINT: it is the number of "
             "periods between two decays.",
             step_size);
  VOLT_CHECK(gamma > 0, "StepLR's gamma is {}; expected > 0. HINT: 0.1 divides the lr by 10.", gamma);
  initial_step();
}

std::vector<double> StepLR::compute_lrs() {
  const double factor = std::pow(gamma_, static_cast<double>(last_epoch() / step_size_));
  std::vector<double> lrs;
  for (const double base : base_lrs()) lrs.push_back(base * factor);
  return lrs;
}

void StepLR::save_fields(TypedDict& state) const {
  state.insert("step_size", step_size_);
  state.insert("gamma", gamma_);
}

void StepLR::load_fields(FieldReader& reader) {
  if (const auto v = reader.integer("step_size")) step_size_ = *v;
  if (const auto v = reader.number("gamma")) gamma_ = *v;
  if (step_size_ <= 0) reader.problem(fmt::format("step_size is {}; expected > 0", step_size_));
}

// ---------------------------------------------------------------------------------------------
// MultiStepLR

MultiStepLR::MultiStepLR(torch::optim::Optimizer& optimizer, std::vector<int64_t> milestones, double gamma)
    : LRScheduler(optimizer), milestones_(std::move(milestones)), gamma_(gamma) {
  std::sort(milestones_.begin(), milestones_.end());
  VOLT_CHECK(milestones_.empty() || milestones_.front() >= 0,
             "MultiStepLR's milestones include {}; expected epochs >= 0. HINT: milestones are the periods at which the "
             "lr is multiplied by gamma, e.g. {{30, 80}}.",
             milestones_.front());
  VOLT_CHECK(gamma > 0, "MultiStepLR's gamma is {}; expected > 0. HINT: 0.1 divides the lr by 10.", gamma);
  initial_step();
}

std::vector<double> MultiStepLR::compute_lrs() {
  // PyTorch's bisect_right: the number of milestones reached so far.
  const auto passed = std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch()) - milestones_.begin();
  const double factor = std::pow(gamma_, static_cast<double>(passed));
  std::vector<double> lrs;
  for (const double base : base_lrs()) lrs.push_back(base * factor);
  return lrs;
}

void MultiStepLR::save_fields(TypedDict& state) const {
  state.insert("milestones", c10::List<int64_t>(milestones_));
  state.insert("gamma", gamma_);
}

void MultiStepLR::load_fields(FieldReader& reader) {
  if (const auto v = reader.number("gamma")) gamma_ = *v;
  const auto value = reader.value("milestones");
  if (!value) return;
  // PyTorch keeps milestones as a Counter: {milestone: how often it was given}.
  if (value->isGenericDict()) {
    std::vector<int64_t> milestones;
    for (const auto& item : value->toGenericDict()) {
      if (!item.key().isInt() || !item.value().isInt()) {
        reader.problem(fmt::format("{} must map ints to ints", reader.name("milestones")));
        return;
      }
      milestones.insert(milestones.end(), item.value().toInt(), item.key().toInt());
    }
    std::sort(milestones.begin(), milestones.end());
    milestones_ = std::move(milestones);
    return;
  }
  if (auto v = reader.integers("milestones")) {
    std::sort(v->begin(), v->end());
    milestones_ = std::move(*v);
  }
}

// ---------------------------------------------------------------------------------------------
// ExponentialLR

ExponentialLR::ExponentialLR(torch::optim::Optimizer& optimizer, double gamma) : LRScheduler(optimizer), gamma_(gamma) {
  VOLT_CHECK(gamma > 0,
             "ExponentialLR's gamma is {}; expected > 0. HINT: 0.95 lowers the lr by "
             "5% per period.",
             gamma);
  initial_step();
}

std::vector<double> ExponentialLR::compute_lrs() {
  const double factor = std::pow(gamma_, static_cast<double>(last_epoch()));
  std::vector<double> lrs;
  for (const double base : base_lrs()) lrs.push_back(base * factor);
  return lrs;
}

void ExponentialLR::save_fields(TypedDict& state) const { state.insert("gamma", gamma_); }

void ExponentialLR::load_fields(FieldReader& reader) {
  if (const auto v = reader.number("gamma")) gamma_ = *v;
}

// ---------------------------------------------------------------------------------------------
// CosineAnnealingLR

CosineAnnealingLR::CosineAnnealingLR(torch::optim::Optimizer& optimizer, int64_t t_max, double eta_min)
    : LRScheduler(optimizer), t_max_(t_max), eta_min_(eta_min) {
  VOLT_CHECK(t_max > 0,
             "CosineAnnealingLR's T_max is {}; expected > 0. HINT: it is the number "
             "of periods from the base lr down to eta_min, e.g. max_epochs.",
             t_max);
  VOLT_CHECK(
      eta_min >= 0,
      "CosineAnnealingLR's eta_min is {}; expected >= 0. HINT: it is the lowest lr of the schedule; the default is 0.",
      eta_min);
  initial_step();
}

std::vector<double> CosineAnnealingLR::compute_lrs() {
  const double cosine = (1 + std::cos(kPi * static_cast<double>(last_epoch()) / static_cast<double>(t_max_))) / 2;
  std::vector<double> lrs;
  for (const double base : base_lrs()) lrs.push_back(eta_min_ + (base - eta_min_) * cosine);
  return lrs;
}

void CosineAnnealingLR::save_fields(TypedDict& state) const {
  state.insert("T_max", t_max_);
  state.insert("eta_min", eta_min_);
}

void CosineAnnealingLR::load_fields(FieldReader& reader) {
  if (const auto v = reader.integer("T_max")) t_max_ = *v;
  if (const auto v = reader.number("eta_min")) eta_min_ = *v;
  if (t_max_ <= 0) reader.problem(fmt::format("T_max is {}; expected > 0", t_max_));
}

// ---------------------------------------------------------------------------------------------
// LinearWarmupCosineLR

LinearWarmupCosineLR::LinearWarmupCosineLR(torch::optim::Optimizer& optimizer, int64_t warmup_steps,
                                           int64_t total_steps, double eta_min, double warmup_start_factor)
    : LRScheduler(optimizer),
      warmup_steps_(warmup_steps),
      total_steps_(total_steps),
      eta_min_(eta_min),
      warmup_start_factor_(warmup_start_factor) {
  VOLT_CHECK(warmup_steps >= 0 && total_steps > warmup_steps,
             "LinearWarmupCosineLR was given warmup_steps={} and total_steps={}; expected 0 <= warmup_steps < "
             "total_steps. HINT: total_steps is the run's optimizer steps, e.g. the module's "
             "estimated_stepping_batches() in configure_optimizers.",
             warmup_steps, total_steps);
  VOLT_CHECK(eta_min >= 0,
             "LinearWarmupCosineLR's eta_min is {}; expected >= 0. HINT: it is the final lr of the schedule; the "
             "default is 0.",
             eta_min);
  VOLT_CHECK(warmup_start_factor >= 0 && warmup_start_factor <= 1,
             "LinearWarmupCosineLR's warmup_start_factor is {}; expected a share of the base lr in [0, 1]. HINT: it is "
             "the first warmup period's lr over the base lr; the default 0 starts from lr 0.",
             warmup_start_factor);
  initial_step();
}

std::vector<double> LinearWarmupCosineLR::compute_lrs() {
  const auto e = static_cast<double>(last_epoch());
  std::vector<double> lrs;
  if (last_epoch() < warmup_steps_) {
    const double factor = warmup_start_factor_ + (1 - warmup_start_factor_) * e / static_cast<double>(warmup_steps_);
    for (const double base : base_lrs()) lrs.push_back(base * factor);
    return lrs;
  }
  const double progress =
      std::min(1.0, (e - static_cast<double>(warmup_steps_)) / static_cast<double>(total_steps_ - warmup_steps_));
  const double cosine = (1 + std::cos(kPi * progress)) / 2;
  for (const double base : base_lrs()) lrs.push_back(eta_min_ + (base - eta_min_) * cosine);
  return lrs;
}

void LinearWarmupCosineLR::save_fields(TypedDict& state) const {
  state.insert("warmup_steps", warmup_steps_);
  state.insert("total_steps", total_steps_);
  state.insert("eta_min", eta_min_);
  state.insert("warmup_start_factor", warmup_start_factor_);
}

void LinearWarmupCosineLR::load_fields(FieldReader& reader) {
  if (const auto v = reader.integer("warmup_steps")) warmup_steps_ = *v;
  if (const auto v = reader.integer("total_steps")) total_steps_ = *v;
  if (const auto v = reader.number("eta_min")) eta_min_ = *v;
  if (const auto v = reader.number("warmup_start_factor")) warmup_start_factor_ = *v;
  if (warmup_steps_ < 0 || total_steps_ <= warmup_steps_) {
    reader.problem(fmt::format("warmup_steps {} and total_steps {}; expected 0 <= warmup_steps < total_steps",
                               warmup_steps_, total_steps_));
  }
}

// ---------------------------------------------------------------------------------------------
// LambdaLR

LambdaLR::LambdaLR(torch::optim::Optimizer& optimizer, std::function<double(int64_t epoch)> lr_lambda)
    : LRScheduler(optimizer), lr_lambda_(std::move(lr_lambda)) {
  VOLT_CHECK(static_cast<bool>(lr_lambda_),
             "LambdaLR was given an empty function. HINT: pass a function from the epoch to the "
             "lr factor, e.g. [](int64_t e) {{ return std::pow(0.95, e); }}.");
  initial_step();
}

std::vector<double> LambdaLR::compute_lrs() {
  const double factor = lr_lambda_(last_epoch());
  std::vector<double> lrs;
  for (const double base : base_lrs()) lrs.push_back(base * factor);
  return lrs;
}

void LambdaLR::save_fields(TypedDict& state) const {
  // Functions cannot be saved; PyTorch writes None for each group's plain function too.
  c10::impl::GenericList lambdas(c10::AnyType::get());
  for (size_t i = 0; i < group_count(); ++i) lambdas.push_back(c10::IValue());
  state.insert("lr_lambdas", std::move(lambdas));
}

// ---------------------------------------------------------------------------------------------
// ReduceLROnPlateau

const char* to_string(ThresholdMode mode) {
  switch (mode) {
    case ThresholdMode::kRel:
      return "rel";
    case ThresholdMode::kAbs:
      return "abs";
  }
  VOLT_INTERNAL_ASSERT(false, "unknown ThresholdMode {}", static_cast<int>(mode));
}

ThresholdMode parse_threshold_mode(std::string_view text) {
  static constexpr ThresholdMode kValues[] = {ThresholdMode::kRel, ThresholdMode::kAbs};
  return parse_enum(text, kValues, "threshold mode");
}

namespace {

/// The value a metric starts out "best" at: any first metric improves on it.
double mode_worse(Mode mode) {
  switch (mode) {
    case Mode::kMin:
      return std::numeric_limits<double>::infinity();
    case Mode::kMax:
      return -std::numeric_limits<double>::infinity();
  }
  VOLT_INTERNAL_ASSERT(false, "unknown Mode {}", static_cast<int>(mode));
}

}  // namespace

ReduceLROnPlateau::ReduceLROnPlateau(torch::optim::Optimizer& optimizer, const ReduceLROnPlateauOptions& options)
    : LRScheduler(optimizer),
      options_(options),
      min_lrs_(group_count(), options.min_lr),
      best_(mode_worse(options.mode)) {
  VOLT_CHECK(options.factor > 0 && options.factor < 1,
             "ReduceLROnPlateau's factor is {}; expected a value in (0, 1). HINT: the lr is "
             "multiplied by it, e.g. 0.1 or 0.5.",
             options.factor);
  VOLT_CHECK(options.patience >= 0,
             "ReduceLROnPlateau's patience is {}; expected >= 0. HINT: it is how many periods without improvement to "
             "wait before reducing the lr; the default is 10.",
             options.patience);
  VOLT_CHECK(options.threshold >= 0,
             "ReduceLROnPlateau's threshold is {}; expected >= 0. HINT: it is the least change that counts as an "
             "improvement; the default is 1e-4.",
             options.threshold);
  VOLT_CHECK(options.cooldown >= 0,
             "ReduceLROnPlateau's cooldown is {}; expected >= 0. HINT: it is how many periods to wait after a "
             "reduction; the default is 0.",
             options.cooldown);
  VOLT_CHECK(options.min_lr >= 0,
             "ReduceLROnPlateau's min_lr is {}; expected >= 0. HINT: it is the floor no lr is reduced below; the "
             "default is 0.",
             options.min_lr);
  VOLT_CHECK(options.eps >= 0,
             "ReduceLROnPlateau's eps is {}; expected >= 0. HINT: reductions smaller than eps are skipped; the default "
             "is 1e-8.",
             options.eps);
  initial_step();
}

bool ReduceLROnPlateau::is_better(double metric) const {
  const double threshold = options_.threshold;
  switch (options_.mode) {
    case Mode::kMin:
      switch (options_.threshold_mode) {
        case ThresholdMode::kRel:
          return metric < best_ * (1 - threshold);
        case ThresholdMode::kAbs:
          return metric < best_ - threshold;
      }
      break;
    case Mode::kMax:
      switch (options_.threshold_mode) {
        case ThresholdMode::kRel:
          return metric > best_ * (threshold + 1);
        case ThresholdMode::kAbs:
          return metric > best_ + threshold;
      }
      break;
  }
  VOLT_INTERNAL_ASSERT(false, "unknown plateau mode");
}

void ReduceLROnPlateau::observe(double metric) {
  // PyTorch's ReduceLROnPlateau.step, in the same order.
  if (is_better(metric)) {
    best_ = metric;
    num_bad_epochs_ = 0;
  } else {
    ++num_bad_epochs_;
  }
  if (cooldown_counter_ > 0) {
    --cooldown_counter_;
    num_bad_epochs_ = 0;  // bad periods during a cooldown do not count
  }
  if (num_bad_epochs_ > options_.patience) {
    reduce_ = true;
    cooldown_counter_ = options_.cooldown;
    num_bad_epochs_ = 0;
  }
}

std::vector<double> ReduceLROnPlateau::compute_lrs() {
  std::vector<double> lrs = current_lrs();
  // A group added since construction gets the min_lr the scheduler was made with.
  if (min_lrs_.size() < lrs.size()) min_lrs_.resize(lrs.size(), options_.min_lr);
  if (!reduce_) return lrs;
  reduce_ = false;
  for (size_t i = 0; i < lrs.size(); ++i) {
    const double reduced = std::max(lrs[i] * options_.factor, min_lrs_[i]);
    if (lrs[i] - reduced > options_.eps) lrs[i] = reduced;
  }
  return lrs;
}

void ReduceLROnPlateau::save_fields(TypedDict& state) const {
  state.insert("mode", to_string(options_.mode));
  state.insert("factor", options_.factor);
  state.insert("patience", options_.patience);
  state.insert("threshold", options_.threshold);
  state.insert("threshold_mode", to_string(options_.threshold_mode));
  state.insert("cooldown", options_.cooldown);
  state.insert("min_lrs", to_list(min_lrs_));
  state.insert("eps", options_.eps);
  state.insert("best", best_);
  state.insert("mode_worse", mode_worse(options_.mode));
  state.insert("num_bad_epochs", num_bad_epochs_);
  state.insert("cooldown_counter", cooldown_counter_);
}

void ReduceLROnPlateau::load_fields(FieldReader& reader) {
  if (const auto v = reader.string("mode")) {
    try {
      options_.mode = parse_mode(*v);
    } catch (const Error& e) {
      reader.problem(fmt::format("{}: {}", reader.name("mode"), e.what()));
    }
  }
  if (const auto v = reader.string("threshold_mode")) {
    try {
      options_.threshold_mode = parse_threshold_mode(*v);
    } catch (const Error& e) {
      reader.problem(fmt::format("{}: {}", reader.name("threshold_mode"), e.what()));
    }
  }
  if (const auto v = reader.number("factor")) options_.factor = *v;
  if (const auto v = reader.integer("patience")) options_.patience = *v;
  if (const auto v = reader.number("threshold")) options_.threshold = *v;
  if (const auto v = reader.integer("cooldown")) options_.cooldown = *v;
  if (const auto v = reader.number("eps")) options_.eps = *v;
  if (auto v = per_group(reader, "min_lrs", group_count())) min_lrs_ = std::move(*v);
  if (const auto v = reader.number("best")) best_ = *v;
  if (const auto v = reader.integer("num_bad_epochs")) num_bad_epochs_ = *v;
  if (const auto v = reader.integer("cooldown_counter")) cooldown_counter_ = *v;
}

}  // namespace volt
