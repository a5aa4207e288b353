#include "volt/callbacks/model_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <regex>

#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/module/lightning_module.h"

namespace volt {

ModelCheckpoint::ModelCheckpoint(ModelCheckpointOptions options, Clock clock)
    : options_(std::move(options)), clock_(clock ? std::move(clock) : Clock(&std::chrono::steady_clock::now)) {
  VOLT_CHECK(options_.save_top_k >= -1,
             "ModelCheckpoint save_top_k={} is invalid; expected -1 (keep all), 0 (none) or a positive "
             "count. HINT: use 1 (the default) to keep one checkpoint, or -1 to keep them all.",
             options_.save_top_k);
  VOLT_CHECK(options_.every_n_train_steps >= 0,
             "ModelCheckpoint every_n_train_steps={} must be >= 0. HINT: use 0 (the default) not to save by step.",
             options_.every_n_train_steps);
  VOLT_CHECK(!options_.every_n_epochs || *options_.every_n_epochs >= 0,
             "ModelCheckpoint every_n_epochs={} must be >= 0. HINT: use 0 not to save by epoch, or leave it unset for "
             "the default.",
             options_.every_n_epochs.value_or(0));
  VOLT_CHECK(!(options_.monitor.empty() && options_.save_top_k > 1),
             "ModelCheckpoint(save_top_k={}, monitor='') cannot rank checkpoints without a metric. HINT: "
             "set monitor, or use save_top_k=-1 to keep every checkpoint.",
             options_.save_top_k);
  if (const auto& interval = options_.train_time_interval) {
    VOLT_CHECK(interval->count() > 0,
               "ModelCheckpoint train_time_interval={} must be positive. HINT: leave it unset to save by epochs or "
               "steps only.",
               timedelta_repr(*interval));
    VOLT_CHECK(options_.every_n_train_steps == 0 && options_.every_n_epochs.value_or(0) == 0,
               "ModelCheckpoint(every_n_train_steps={}, every_n_epochs={}, train_time_interval={}): these triggers "
               "are mutually exclusive, as in Lightning. HINT: keep train_time_interval and drop the others, or use "
               "two ModelCheckpoint callbacks with different dirpath or filename.",
               options_.every_n_train_steps,
               options_.every_n_epochs ? std::to_string(*options_.every_n_epochs) : "None", timedelta_repr(*interval));
  }
  // Lightning: once epoch and step triggers are off, every epoch (unless time triggers instead).
  const bool other_trigger = options_.every_n_train_steps > 0 || options_.train_time_interval.has_value();
  every_n_epochs_ = options_.every_n_epochs.value_or(other_trigger ? 0 : 1);
}

std::string ModelCheckpoint::timedelta_repr(std::chrono::microseconds interval) {
  // timedelta normalizes to days, 0 <= seconds < 86400 and 0 <= microseconds < 10^6.
  constexpr int64_t kMicros = 1000000;
  constexpr int64_t kDay = 86400 * kMicros;
  const int64_t total = interval.count();
  const int64_t days = total >= 0 ? total / kDay : -((-total + kDay - 1) / kDay);
  const int64_t rest = total - days * kDay;
  std::vector<std::string> fields;
  if (days != 0) fields.push_back(fmt::format("days={}", days));
  if (rest / kMicros != 0) fields.push_back(fmt::format("seconds={}", rest / kMicros));
  if (rest % kMicros != 0) fields.push_back(fmt::format("microseconds={}", rest % kMicros));
  if (fields.empty()) return "datetime.timedelta(0)";
  return "datetime.timedelta(" + join(fields, ", ") + ")";
}

std::string ModelCheckpoint::state_key() const {
  // Lightning's key (repr of its trigger settings), so that either Trainer finds the other's state.
  return fmt::format(
      "ModelCheckpoint{{'monitor': {}, 'mode': '{}', 'every_n_train_steps': {}, 'every_n_epochs': {}, "
      "'train_time_interval': {}}}",
      options_.monitor.empty() ? std::string("None") : "'" + options_.monitor + "'", to_string(options_.mode),
      options_.every_n_train_steps, every_n_epochs_,
      options_.train_time_interval ? timedelta_repr(*options_.train_time_interval) : std::string("None"));
}

std::string ModelCheckpoint::legacy_state_key() const {
  return fmt::format(
      "ModelCheckpoint{{'monitor': '{}', 'mode': '{}', 'every_n_train_steps': {}, "
      "'every_n_epochs': {}}}",
      options_.monitor, to_string(options_.mode), options_.every_n_train_steps, every_n_epochs_);
}

void ModelCheckpoint::setup(const FitInfo& info) {
  // Each fit (a resumed one too) counts time from its own first batch, as Lightning does from
  // its train start: the clock of an earlier process means nothing here.
  last_time_checked_.reset();
  trained_ = false;
  save_on_train_epoch_end_ = options_.save_on_train_epoch_end.value_or(!info.has_validation);
  if (!options_.dirpath.empty()) {
    dirpath_ = options_.dirpath;
  } else {
    dirpath_ = (std::filesystem::path(info.log_dir.empty() ? info.root_dir : info.log_dir) / "checkpoints").string();
  }
}

bool ModelCheckpoint::saves_checkpoint_at_train_batch_end(const CallbackContext& context) const {
  // A time interval is decided inside on_train_batch_end (rank 0's clock), so any step may save.
  // Weights-only files hold no metric states.
  if (options_.save_weights_only) return false;
  return options_.train_time_interval.has_value() || step_due(context);
}

bool ModelCheckpoint::step_due(const CallbackContext& context) const {
  return options_.every_n_train_steps > 0 && context.global_step > 0 &&
         context.global_step % options_.every_n_train_steps == 0;
}

Decision ModelCheckpoint::on_train_batch_end(const CallbackContext& context, CallbackServices& services) {
  trained_ = true;
  // Asked at every batch (a collective under ddp), even when the step alone decides.
  const bool time_due = this->time_due(services);
  if (step_due(context) || time_due) save(context, services);
  return {};
}

bool ModelCheckpoint::time_due(CallbackServices& services) {
  if (!options_.train_time_interval) return false;
  const auto now = clock_();
  if (!last_time_checked_) last_time_checked_ = now;
  // Clocks differ between processes: rank 0's decides, as in Lightning (which broadcasts it).
  const bool due = services.broadcast_decision(now - *last_time_checked_ >= *options_.train_time_interval);
  if (due) last_time_checked_ = now;
  return due;
}

Decision ModelCheckpoint::on_train_epoch_end(const CallbackContext& context, CallbackServices& services) {
  if (save_on_train_epoch_end_ && every_n_epochs_ > 0 && (context.epoch + 1) % every_n_epochs_ == 0) {
    save(context, services);
  }
  return {};
}

Decision ModelCheckpoint::on_validation_end(const CallbackContext& context, CallbackServices& services) {
  if (!save_on_train_epoch_end_ && !context.sanity_checking && every_n_epochs_ > 0 &&
      (context.epoch + 1) % every_n_epochs_ == 0) {
    save(context, services);
  }
  return {};
}

Decision ModelCheckpoint::on_train_end(const CallbackContext& context, CallbackServices& services) {
  // A stop inside an epoch (max_steps, a signal, a callback) comes after the last save: a resume
  // from that one would silently train the steps since again. Lightning's last.ckpt is where the
  // fit ended. Every process gets here at the same step, so all of them agree on saving.
  if (!options_.save_last || !trained_ || context.global_step == last_saved_step_) return {};
  last_saved_step_ = context.global_step;
  last_model_path_ = last_path();
  write(last_model_path_, services);
  return {};
}

std::string ModelCheckpoint::format_filename(const std::string& pattern, int64_t epoch, int64_t step,
                                             const std::map<std::string, double>& metrics, bool insert_names) {
  static const std::regex kField(R"(\{([^{}:]+)(?::([^{}]*))?\})");
  std::string out;
  auto begin = std::sregex_iterator(pattern.begin(), pattern.end(), kField);
  std::size_t last = 0;
  for (auto it = begin; it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    out += pattern.substr(last, static_cast<std::size_t>(m.position()) - last);
    last = static_cast<std::size_t>(m.position() + m.length());
    const std::string name = m[1].str();
    const std::string spec = m[2].matched ? m[2].str() : "";
    std::string value;
    if (name == "epoch") {
      value = std::to_string(epoch);
    } else if (name == "step") {
      value = std::to_string(step);
    } else {
      const auto metric = metrics.find(name);
      // Lightning writes 0 for a metric that is not available yet; so do we.
      const double v = metric == metrics.end() ? 0.0 : metric->second;
      value = spec.empty() ? fmt::format("{}", v) : fmt::format(fmt::runtime("{:" + spec + "}"), v);
    }
    std::string shown = name;
    std::replace(shown.begin(), shown.end(), '/', '_');
    out += insert_names ? shown + "=" + value : value;
  }
  out += pattern.substr(last);
  return out;
}

std::string ModelCheckpoint::path_for(const CallbackContext& context) const {
  const std::string pattern = options_.filename.empty() ? "{epoch}-{step}" : options_.filename;
  const auto metrics = context.metrics ? *context.metrics : std::map<std::string, double>{};
  const std::string name =
      format_filename(pattern, context.epoch, context.global_step, metrics, options_.auto_insert_metric_name);
  return (std::filesystem::path(dirpath_) / (name + ".ckpt")).string();
}

void ModelCheckpoint::save(const CallbackContext& context, CallbackServices& services) {
  // The same step can reach here from the batch and the epoch hook: save it once.
  if (context.global_step == last_saved_step_) return;
  last_saved_step_ = context.global_step;
  if (options_.save_top_k != 0) {
    const std::string path = path_for(context);
    // The bookkeeping comes first, as in Lightning, so that the file records itself (a resume
    // from the best checkpoint knows it is the best); older files go only after it is written.
    std::vector<std::string> stale;
    if (options_.monitor.empty()) {
      best_model_path_ = path;
      last_model_path_ = path;
      if (std::find(recent_.begin(), recent_.end(), path) == recent_.end()) recent_.push_back(path);
      while (options_.save_top_k > 0 && static_cast<int64_t>(recent_.size()) > options_.save_top_k) {
        if (recent_.front() != path) stale.push_back(recent_.front());
        recent_.erase(recent_.begin());
      }
      write(path, services);
      for (const std::string& old : stale) services.remove_checkpoint(old);
    } else {
      const double score = internal::monitored_value(context.metrics, options_.monitor, "ModelCheckpoint");
      const bool min = options_.mode == Mode::kMin;
      const auto better = [min](double a, double b) { return min ? a < b : a > b; };
      const auto worst = [&]() {
        return std::max_element(best_k_models_.begin(), best_k_models_.end(),
                                [&](const auto& a, const auto& b) { return better(a.second, b.second); });
      };
      const bool room = options_.save_top_k == -1 || static_cast<int64_t>(best_k_models_.size()) < options_.save_top_k;
      if (room || better(score, worst()->second)) {
        best_k_models_[path] = score;
        if (!room) {
          const auto drop = worst();
          if (drop->first != path) stale.push_back(drop->first);
          best_k_models_.erase(drop);
        }
        const auto best = std::min_element(best_k_models_.begin(), best_k_models_.end(),
                                           [&](const auto& a, const auto& b) { return better(a.second, b.second); });
        best_model_path_ = best->first;
        best_model_score_ = best->second;
        write(path, services);
        for (const std::string& old : stale) services.remove_checkpoint(old);
      }
    }
  }
  if (options_.save_last) {
    last_model_path_ = last_path();
    write(last_model_path_, services);
  }
}

std::string ModelCheckpoint::last_path() const { return (std::filesystem::path(dirpath_) / "last.ckpt").string(); }

void ModelCheckpoint::write(const std::string& path, CallbackServices& services) const {
  if (options_.save_weights_only) {
    services.save_weights_checkpoint(path);
  } else {
    services.save_checkpoint(path);
  }
}

StateDict ModelCheckpoint::state_dict() const {
  StateDict state = make_state_dict();
  state.insert("monitor", options_.monitor.empty() ? c10::IValue() : c10::IValue(options_.monitor));
  state.insert("best_model_path", best_model_path_);
  state.insert("best_model_score",
               best_model_score_ ? c10::IValue(internal::score_tensor(*best_model_score_)) : c10::IValue());
  state.insert("last_model_path", last_model_path_);
  state.insert("dirpath", dirpath_);
  c10::Dict<std::string, at::Tensor> best_k;
  for (const auto& [path, score] : best_k_models_) best_k.insert(path, internal::score_tensor(score));
  state.insert("best_k_models", best_k);
  // Lightning ranks a new score against the worst kept one by these two (it looks the path up in
  // best_k_models, so it must be one of them once any is kept).
  const bool min = options_.mode == Mode::kMin;
  const auto worst =
      std::max_element(best_k_models_.begin(), best_k_models_.end(),
                       [min](const auto& a, const auto& b) { return min ? a.second < b.second : a.second > b.second; });
  const bool any = worst != best_k_models_.end();
  state.insert("kth_best_model_path", any ? worst->first : std::string());
  state.insert("kth_value", internal::score_tensor(any ? worst->second
                                                       : (min ? std::numeric_limits<double>::infinity()
                                                              : -std::numeric_limits<double>::infinity())));
  return state;
}

void ModelCheckpoint::load_state_dict(const StateDict& state) {
  if (state.contains("best_model_path")) best_model_path_ = state.at("best_model_path").toStringRef();
  // Lightning keeps the old bookkeeping only when the directory is unchanged: files elsewhere
  // are not ours to rank or delete.
  if (!state.contains("dirpath")) return;
  if (state.at("dirpath").toStringRef() != dirpath_) {
    dirpath_left_ = state.at("dirpath").toStringRef();
    return;
  }
  if (state.contains("best_model_score") && !state.at("best_model_score").isNone())
    best_model_score_ = internal::score_value(state.at("best_model_score"));
  if (state.contains("last_model_path")) last_model_path_ = state.at("last_model_path").toStringRef();
  if (state.contains("best_k_models")) {
    best_k_models_.clear();
    for (const auto& entry : state.at("best_k_models").toGenericDict())
      best_k_models_[entry.key().toStringRef()] = internal::score_value(entry.value());
  }
}

void ModelCheckpoint::on_load_checkpoint(const CallbackContext& context, const StateDict&) {
  if (dirpath_left_.empty() || context.module == nullptr) return;
  context.module->print(fmt::format(
      "warning: ModelCheckpoint: the dirpath has changed from {} to {}, so best_model_score, best_k_models and "
      "last_model_path were not restored, only best_model_path (as in Lightning); this run ranks its checkpoints "
      "anew, and its best may be worse than the interrupted run's. HINT: give ModelCheckpoint a dirpath of its own "
      "(ModelCheckpointOptions::dirpath) to keep the best-k list across resumes.",
      dirpath_left_, dirpath_));
  dirpath_left_.clear();
}

}  // namespace volt
