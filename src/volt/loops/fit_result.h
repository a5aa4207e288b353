// What Trainer::fit, validate and test return.
#pragma once

#include <map>
#include <optional>
#include <string>

namespace volt {

/// Why training stopped.
enum class StopReason {
  kMaxEpochs,    ///< max_epochs reached
  kMaxSteps,     ///< max_steps reached (also the end of a fast_dev_run)
  kCallback,     ///< a callback (e.g. EarlyStopping) decided to stop
  kInterrupted,  ///< SIGINT or SIGTERM (under SLURM an HPC checkpoint was saved first)
  kRequeued,     ///< SLURM's requeue signal: an HPC checkpoint was saved and the job requeued
};
/// "max_epochs", "max_steps", "callback", "interrupted", "requeued".
const char* to_string(StopReason reason);

/// What a fit's snapshots cost (TrainerOptions::snapshot_every_n_steps), as rank 0 measured it.
struct SnapshotStats {
  /// Snapshots saved.
  int64_t saved = 0;
  /// Snapshots skipped because the previous one was still being written (skip_snapshot_when_busy).
  int64_t skipped = 0;
  /// Seconds the training thread spent copying state to host memory, in total: the stall.
  double copy_seconds = 0.0;
  /// Of copy_seconds, the first snapshot's: it also allocates the host buffers the later ones
  /// reuse (pinned memory for a GPU's tensors, slow to allocate: 0.76 s for 1.5 GB on an H200's
  /// host), unless a background save (async_checkpointing) allocated them before it.
  double first_copy_seconds = 0.0;
  /// Seconds the training thread waited for a write in flight, in total.
  double waited_seconds = 0.0;
  /// Seconds the background thread spent writing, in total.
  double write_seconds = 0.0;
};

/// The outcome of Trainer::fit (Ceres' Solver::Summary: returned, not printed).
struct FitResult {
  /// Why it stopped.
  StopReason reason = StopReason::kMaxEpochs;
  /// The stopping callback's explanation, if any.
  std::string message;
  /// Epochs fully trained.
  int64_t epochs_completed = 0;
  /// Optimizer steps taken in total (resumed runs include the earlier ones).
  int64_t global_step = 0;
  /// The callback metrics at the end: latest training values and last epoch aggregates.
  std::map<std::string, double> metrics;
  /// The best checkpoint of the first ModelCheckpoint (empty when none).
  std::string best_model_path;
  /// Its score, when it monitors a metric.
  std::optional<double> best_model_score;
  /// The most recent checkpoint written.
  std::string last_model_path;
  /// The log directory (empty without loggers).
  std::string log_dir;
  /// The checkpoint training resumed from (empty when fresh).
  std::string resumed_from;
  /// The HPC checkpoint saved because SLURM asked the job to stop (requeue signal or SIGTERM).
  std::string hpc_checkpoint_path;
  /// True when stopping requeued the job: the program should exit now (with 0), because SLURM
  /// is about to end this run and start the job again, which resumes from hpc_checkpoint_path.
  bool requeued() const { return reason == StopReason::kRequeued; }
  /// Wall time of fit, in seconds.
  double seconds = 0.0;
  /// The snapshots this fit saved (none without snapshot_every_n_steps).
  SnapshotStats snapshots;
  /// True when this process only supervised the run (max_restarts under Volt's own launcher):
  /// the worker processes ran the whole program, including what follows fit, and this result
  /// holds none of their training. The program should exit now with 0, as after requeued().
  bool supervised = false;
  /// The restarts the supervised run took.
  int64_t restarts = 0;

  /// One line: "stopped: max_epochs after 3 epochs (2814 steps) in 41.2 s; val/acc=0.901 ...";
  /// for a supervisor, supervised_report().
  std::string brief_report() const;
  /// Several lines: everything above, one metric per line; for a supervisor, supervised_report().
  std::string full_report() const;
  /// "supervised: the worker processes ran the fit, with 1 restart, in 12.3 s; ...".
  std::string supervised_report() const;
};

/// The outcome of Trainer::validate or Trainer::test.
struct EvalResult {
  /// "validate" or "test".
  std::string stage;
  /// The epoch aggregates of what the steps logged.
  std::map<std::string, double> metrics;
  /// Batches evaluated.
  int64_t batches = 0;
  /// Examples this process evaluated (padding duplicates excluded); under ddp each process
  /// counts its own share, while `metrics` cover every process's.
  int64_t examples = 0;
  /// A Lightning-style table of the metrics.
  std::string report() const;
};

}  // namespace volt
