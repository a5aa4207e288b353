// Saves checkpoints periodically and keeps the best ones.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>

#include "volt/callbacks/callback.h"

namespace volt {

/// Options of ModelCheckpoint, with Lightning's defaults.
///
/// Example: `ModelCheckpoint({.filename = "{epoch}-{val/acc:.3f}", .monitor = "val/acc", .mode = Mode::kMax,
/// .save_top_k = 2, .save_last = true})`.
struct ModelCheckpointOptions {
  /// Directory for the files; empty: `<log_dir>/checkpoints`, or `<root_dir>/checkpoints` without a logger.
  std::string dirpath;
  /// File name template without ".ckpt": `{epoch}`, `{step}` and `{<metric>}` or `{<metric>:<fmt spec>}`
  /// are replaced by `name=value`; empty: "{epoch}-{step}".
  std::string filename;
  /// The metric ranking checkpoints; empty keeps the latest save_top_k checkpoints.
  std::string monitor;
  /// Whether lower or higher `monitor` is better.
  Mode mode = Mode::kMin;
  /// How many checkpoints to keep: -1 all, 0 none (only `last`).
  int64_t save_top_k = 1;
  /// Also write `last.ckpt` each time a checkpoint is considered, and when the fit ends at a step
  /// no save covered (max_steps, a signal or a callback stopping inside an epoch), so that
  /// `last.ckpt` is always where the fit stopped.
  bool save_last = false;
  /// Consider saving every this many epochs; unset: 1 unless every_n_train_steps is set.
  std::optional<int64_t> every_n_epochs;
  /// Consider saving every this many optimizer steps (0: off).
  int64_t every_n_train_steps = 0;
  /// Save at the end of the training epoch instead of after validation; unset: only when
  /// there is no validation.
  std::optional<bool> save_on_train_epoch_end;
  /// Write `name=value` in file names (false: only the value).
  bool auto_insert_metric_name = true;
  /// Write only the module's weights (Lightning's layout: epoch, step, state_dict, loops,
  /// hyperparameters; no optimizer states, schedulers or callbacks). Such files are smaller and
  /// load with load_weights or as validate/test ckpt_path, but fit refuses to resume from them.
  bool save_weights_only = false;
  /// Also save whenever this much wall-clock time has passed since the last time-triggered save
  /// (or since the fit's first training batch), checked after each training batch, e.g.
  /// `std::chrono::minutes(30)`. Global rank 0's clock decides, for every process. Excludes
  /// every_n_train_steps and every_n_epochs, as in Lightning. A resumed fit starts counting anew.
  std::optional<std::chrono::microseconds> train_time_interval;
};

/// Lightning's ModelCheckpoint. Its best and last paths serve ckpt_path="best"/"last".
class ModelCheckpoint : public Callback {
 public:
  /// What train_time_interval measures with: a monotonic clock's now().
  using Clock = std::function<std::chrono::steady_clock::time_point()>;

  /// Throws volt::Error on invalid options (save_top_k < -1, negative intervals, a non-positive
  /// train_time_interval or one combined with another trigger). `clock` (tests) replaces
  /// std::chrono::steady_clock::now.
  explicit ModelCheckpoint(ModelCheckpointOptions options = {}, Clock clock = nullptr);

  std::string state_key() const override;
  /// The key Volt used before it matched Lightning's (no train_time_interval, monitor quoted).
  std::string legacy_state_key() const override;
  void setup(const FitInfo& info) override;
  bool saves_checkpoint_at_train_batch_end(const CallbackContext& context) const override;
  Decision on_train_batch_end(const CallbackContext& context, CallbackServices& services) override;
  Decision on_train_epoch_end(const CallbackContext& context, CallbackServices& services) override;
  Decision on_validation_end(const CallbackContext& context, CallbackServices& services) override;
  /// With save_last, writes `last.ckpt` at the step the fit ended, unless a save this fit was at
  /// that step already (or the fit trained no batch).
  Decision on_train_end(const CallbackContext& context, CallbackServices& services) override;
  StateDict state_dict() const override;
  /// Restores the best-k bookkeeping when the checkpoint was written into the same dirpath; from
  /// another (a resume whose logger opened a new version folder), only best_model_path, as
  /// Lightning does, and on_load_checkpoint warns.
  void load_state_dict(const StateDict& state) override;
  /// Warns when load_state_dict left the best-k list behind: the resumed run ranks its
  /// checkpoints anew, so its "best" may be worse than the interrupted run's.
  void on_load_checkpoint(const CallbackContext& context, const StateDict& checkpoint) override;

  /// The best checkpoint so far (empty when none).
  const std::string& best_model_path() const { return best_model_path_; }
  /// Its monitored value (unset without a monitor).
  std::optional<double> best_model_score() const { return best_model_score_; }
  /// The most recent `last.ckpt` or, without save_last, the most recent checkpoint.
  const std::string& last_model_path() const { return last_model_path_; }
  /// The kept checkpoints and their scores.
  const std::map<std::string, double>& best_k_models() const { return best_k_models_; }
  /// The options it was built with (dirpath as given, before setup() resolves it).
  const ModelCheckpointOptions& options() const { return options_; }
  /// The directory checkpoints go to (resolved by setup()).
  const std::string& dirpath() const { return dirpath_; }

  /// Formats a file name from a template (exposed for tests): `{epoch}-{val/loss:.2f}` with
  /// epoch 3 and val/loss 0.1234 gives "epoch=3-val_loss=0.12" ("/" becomes "_").
  static std::string format_filename(const std::string& pattern, int64_t epoch, int64_t step,
                                     const std::map<std::string, double>& metrics, bool insert_names);
  /// Python's repr of a datetime.timedelta of `interval`, as Lightning's state key writes it:
  /// "datetime.timedelta(seconds=1800)", "datetime.timedelta(days=1, microseconds=5)".
  static std::string timedelta_repr(std::chrono::microseconds interval);

 private:
  void save(const CallbackContext& context, CallbackServices& services);
  std::string path_for(const CallbackContext& context) const;
  /// `<dirpath>/last.ckpt`.
  std::string last_path() const;

  /// Saves `path` whole or weights-only, as save_weights_only says.
  void write(const std::string& path, CallbackServices& services) const;
  /// Whether train_time_interval has passed (rank 0's clock; a collective when it is set).
  bool time_due(CallbackServices& services);
  /// Whether every_n_train_steps says this step saves.
  bool step_due(const CallbackContext& context) const;

  ModelCheckpointOptions options_;
  Clock clock_;
  std::optional<std::chrono::steady_clock::time_point> last_time_checked_;  // unset until the first batch
  int64_t every_n_epochs_ = 1;
  bool save_on_train_epoch_end_ = false;
  std::string dirpath_;
  std::string best_model_path_;
  std::optional<double> best_model_score_;
  std::string last_model_path_;
  std::map<std::string, double> best_k_models_;
  std::string dirpath_left_;         // the checkpoint's other dirpath, until on_load_checkpoint warns
  std::vector<std::string> recent_;  // without a monitor: newest last
  int64_t last_saved_step_ = -1;
  bool trained_ = false;  // a training batch ended in this fit
};

}  // namespace volt
