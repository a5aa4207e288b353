// What the user asks the Trainer for (Lightning's Trainer arguments). No LibTorch.
//
// TrainerOptions is user intent and may say "auto"; resolve_run_plan (volt/plan/run_plan.h)
// turns it, once, into a RunPlan in which nothing is "auto". Only the Trainer facade reads
// TrainerOptions: every value through the plan, and the objects it carries (loggers, callbacks,
// config) as they are; the loops see the plan only. The `volt` tool reads the same options from
// a program's command line (volt/options/trainer_flags.h) and lays them out on nodes with the
// function resolve_run_plan uses (volt/options/run_layout.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "volt/loggers/mlflow_logger.h"
#include "volt/options/option_enums.h"

namespace volt {

class Callback;
class Logger;

/// A number of batches or a fraction of the available ones (Lightning's int-or-float limits).
///
/// `10` means 10 batches; `0.25` means a quarter of the epoch; `1.0` means all of it.
class BatchLimit {
 public:
  /// A fraction in [0, 1] of the available batches.
  BatchLimit(double fraction) : fraction_(fraction), is_fraction_(true) {}  // NOLINT: implicit on purpose
  /// A count of batches (>= 0).
  BatchLimit(int count) : count_(count) {}  // NOLINT
  /// A count of batches (>= 0).
  BatchLimit(long count) : count_(count) {}  // NOLINT
  /// A count of batches (>= 0).
  BatchLimit(long long count) : count_(count) {}  // NOLINT

  /// Parses "10" as a count and "0.25" or "1.0" as a fraction; throws volt::Error naming `what`.
  static BatchLimit parse(const std::string& text, const std::string& what);

  /// True for a fraction, false for a count.
  bool is_fraction() const { return is_fraction_; }
  /// The fraction (only when is_fraction()).
  double fraction() const { return fraction_; }
  /// The count (only when !is_fraction()).
  int64_t count() const { return count_; }
  /// The number of batches to run out of `available`: a count is capped at `available`; a
  /// fraction f gives floor(available * f), at least 1 when f > 0 and batches exist.
  int64_t resolve(int64_t available) const;
  /// The number of batches to run from a stream, whose length is unknown: a count as it is,
  /// 1.0 as unset (to the stream's end); any other fraction throws volt::Error naming `what`
  /// (e.g. "limit_train_batches").
  std::optional<int64_t> resolve_unknown(const std::string& what) const;
  /// "10" or "0.25".
  std::string to_string() const;

 private:
  double fraction_ = 0.0;
  int64_t count_ = 0;
  bool is_fraction_ = false;
};

/// Which devices to use: a count, "auto", -1 for all, or a list of indices.
class DeviceRequest {
 public:
  /// "auto": one CPU process, or every visible GPU.
  DeviceRequest() = default;
  /// A count; -1 means all. Throws volt::Error below -1.
  DeviceRequest(int count);  // NOLINT: implicit on purpose
  /// "auto", a count "2", "-1", or a list "0,1".
  DeviceRequest(const char* text) : DeviceRequest(std::string(text)) {}  // NOLINT
  /// "auto", a count "2", "-1", or a list "0,1"; throws volt::Error on anything else.
  DeviceRequest(const std::string& text);  // NOLINT
  /// Explicit device indices.
  DeviceRequest(std::initializer_list<int> indices);

  /// True for "auto".
  bool is_auto() const { return is_auto_; }
  /// The count (-1: all); meaningful when indices() is empty and !is_auto().
  int count() const { return count_; }
  /// Explicit indices, when given.
  const std::vector<int>& indices() const { return indices_; }
  /// As the user would write it: "auto", "2", "[0, 1]".
  std::string to_string() const;

 private:
  int count_ = 0;
  bool is_auto_ = true;
  std::vector<int> indices_;
};

/// Lightning's `deterministic=`: true, false or "warn"; see DeterministicMode.
///
/// Example: `{.deterministic = true}`, `{.deterministic = "warn"}`.
class Deterministic {
 public:
  /// true: kOn; false: kOff (the default).
  Deterministic(bool on = false) : mode_(on ? DeterministicMode::kOn : DeterministicMode::kOff) {}  // NOLINT
  /// The mode itself.
  Deterministic(DeterministicMode mode) : mode_(mode) {}  // NOLINT
  /// "true", "false" or "warn" (parse_deterministic_mode); throws volt::Error on anything else.
  /// Without it a string literal would silently convert to `true` through the pointer.
  Deterministic(const char* text) : mode_(parse_deterministic_mode(text)) {}  // NOLINT
  /// "true", "false" or "warn"; throws volt::Error on anything else.
  Deterministic(const std::string& text) : mode_(parse_deterministic_mode(text)) {}  // NOLINT

  /// What was asked for.
  DeterministicMode mode() const { return mode_; }
  /// "false", "true" or "warn".
  const char* to_string() const { return volt::to_string(mode_); }
  /// Equal when the modes are.
  bool operator==(const Deterministic& other) const { return mode_ == other.mode_; }

 private:
  DeterministicMode mode_;
};

/// Parses a duration as Lightning's max_time takes it: "DD:HH:MM:SS" (e.g. "00:12:00:00") or a
/// number of seconds ("3600", "90.5"); throws volt::Error naming `what` (e.g. "--max-time").
std::chrono::duration<double> parse_duration(const std::string& text, const std::string& what);
/// "DD:HH:MM:SS" for whole seconds (what parse_duration reads back), else the seconds ("90.5").
std::string format_duration(std::chrono::duration<double> duration);

/// The name of the file TrainerOptions::config is saved to in the log directory (LightningCLI's).
inline constexpr const char* kConfigFileName = "config.yaml";

/// The Trainer's options, with Lightning's defaults.
///
/// Example:
/// ```
/// volt::Trainer trainer({.max_epochs = 3, .limit_train_batches = 0.5, .seed = 42});
/// volt::Trainer ddp({.devices = 2, .strategy = volt::StrategyRequest::kDdp, .precision =
/// volt::Precision::kBf16Mixed});
/// ```
struct TrainerOptions {
  // ---- hardware ------------------------------------------------------------------------------
  /// kCpu, kGpu (CUDA builds) or kAuto (the GPUs when this process sees any).
  AcceleratorRequest accelerator = AcceleratorRequest::kAuto;
  /// How many devices per node; see DeviceRequest. Under ddp each device is a process; under
  /// dp and ddp2 one process per node drives them all (on CPU: one replica thread each).
  DeviceRequest devices;
  /// The seed documents' GPU request (`gpus=2`, `gpus="0,1"`, -1 for all): CUDA devices, so an
  /// error in CPU builds unless 0. Unset: use accelerator and devices.
  std::optional<DeviceRequest> gpus;
  /// kAuto (ddp when devices x num_nodes > 1), kSingleDevice, kDdp, kDdpFindUnusedParametersTrue,
  /// kDp (one process splits each batch across its devices), kDdp2 (dp inside each node, ddp
  /// across nodes) or kFsdp (ddp with gradients and optimizer state sharded over the processes).
  /// The flag's old name `--distributed-backend` is the seed documents'.
  StrategyRequest strategy = StrategyRequest::kAuto;
  /// What strategy=kFsdp shards. Unset: shard_grad_op (full_shard, Lightning's default, shards
  /// only the parameters of the layers the module wraps in volt::FsdpUnit). Refused with any
  /// other strategy.
  std::optional<ShardingStrategy> sharding_strategy;
  /// sharding_strategy=full_shard's wrapping policy: a volt::FsdpUnit holding fewer parameter
  /// elements than this is not a unit of its own (its parameters go with the enclosing unit, or
  /// stay whole like the model's outside every unit), since each unit costs two all-gathers and a
  /// reduce-scatter per step. Unset: 0, every FsdpUnit. Refused without full_shard.
  std::optional<int64_t> fsdp_min_unit_params;
  /// strategy=kFsdp: how checkpoints hold the sharded optimizer state. Unset: full (gathered on
  /// rank 0 into one file). Sharded needs shard_grad_op or full_shard; refused with any other
  /// strategy.
  std::optional<StateDictType> state_dict_type;
  /// strategy=kPipeline: layers per stage of the module's volt::Pipe, one count per device.
  /// Unset: "auto", balanced by the layers' times measured on the first batch.
  std::optional<std::vector<int64_t>> pipeline_balance;
  /// strategy=kPipeline: micro-batches each batch is cut into. Unset: 8 (Lightning's pipe plugin).
  std::optional<int64_t> pipeline_chunks;
  /// strategy=kPipeline: the micro-batches' order in a step that the module runs through
  /// `Pipe::train_step` (its loss per micro-batch): GPipe's fill-drain or 1F1B (fewer activations
  /// alive). A loss from `Pipe::forward` always runs GPipe's order. Unset: kGPipe.
  std::optional<PipelineSchedule> pipeline_schedule;
  /// k32True (default), k64True, k16Mixed, kBf16Mixed, k16True or kBf16True. The mixed modes run
  /// the steps under autocast (16-mixed also scales the loss); a CPU build with LibTorch 1.13 runs
  /// 32-true, 64-true, bf16-mixed and bf16-true.
  Precision precision = Precision::k32True;
  /// Seed documents (Lightning 0.x): true means precision='16-mixed' (a note says so).
  bool use_amp = false;
  /// Seed documents: apex's level with use_amp, O0 (32-true), O1/O2 (16-mixed) or O3 (16-true).
  std::optional<AmpLevel> amp_level;
  /// Nodes in the job.
  int64_t num_nodes = 1;
  /// Intra-op threads per process (>= 1); unset: OMP_NUM_THREADS, else SLURM_CPUS_PER_TASK, else
  /// all cores divided among this node's processes. Debian's LibTorch starts with 1, so this is
  /// set on purpose.
  std::optional<int64_t> num_threads;
  /// ddp: allow parameters that get no gradient in some steps (costs a graph walk per step).
  bool find_unused_parameters = false;
  /// ddp: synchronize the module's volt::SyncBatchNorm layers across processes (batch statistics
  /// and their gradients over the global batch). A model with plain torch::nn::BatchNorm layers
  /// is refused: LibTorch cannot swap a module's layers, so declare volt::SyncBatchNorm.
  bool sync_batchnorm = false;
  /// ddp: gradient bucket size in MiB (PyTorch DDP's bucket_cap_mb).
  int64_t bucket_cap_mb = 25;
  /// ddp: kAuto (nccl on GPUs in CUDA builds, gloo on CPU), kGloo or kNccl (CUDA builds).
  ProcessGroupBackend process_group_backend = ProcessGroupBackend::kAuto;
  /// ddp: seconds a collective may wait for a peer before the run fails (a hung rank).
  double process_group_timeout = 120.0;
  /// ddp: seconds to wait for every rank to join the rendezvous before naming the missing ones.
  double join_timeout = 60.0;
  /// Shard the train/val/test loaders across processes with a DistributedSampler (the seed
  /// documents call it replace_sampler_ddp); false: the loaders are used as given on every rank.
  bool use_distributed_sampler = true;
  /// Keep glibc malloc from returning LibTorch's step buffers to the OS after every step
  /// (pins M_MMAP_THRESHOLD/M_TRIM_THRESHOLD); ~15% faster small-model steps. Unset: on, except
  /// under strategy='fsdp' with sharding_strategy='full_shard', which is chosen for memory: it
  /// frees and allocates each unit's whole parameters several times a step, and pinned thresholds
  /// keep those blocks in the heap (the resident set grew to shard_grad_op's under LibTorch 2.x).
  std::optional<bool> tune_allocator;

  // ---- how long ------------------------------------------------------------------------------
  /// Stop after this many epochs; unset: 1000, or unlimited when max_steps is set.
  std::optional<int64_t> max_epochs;
  /// Keep training at least this many epochs even if a callback asks to stop.
  int64_t min_epochs = 0;
  /// Stop after this many optimizer steps; unset or -1: no limit.
  std::optional<int64_t> max_steps;
  /// Keep training at least this many optimizer steps even if a callback asks to stop (with
  /// min_epochs, both must be reached); 0: no minimum. Limits and signals still stop.
  int64_t min_steps = 0;
  /// Stop training after this much time (Lightning's max_time: a Timer callback checks after
  /// every step, and saves `last.ckpt` to resume from); unset: no limit. A Timer among the
  /// callbacks wins over it. Flag and config: "DD:HH:MM:SS" or seconds.
  std::optional<std::chrono::duration<double>> max_time;
  /// Batches per training epoch (a count or a fraction).
  BatchLimit limit_train_batches = 1.0;
  /// Batches per validation run.
  BatchLimit limit_val_batches = 1.0;
  /// Batches when testing.
  BatchLimit limit_test_batches = 1.0;
  /// Batches when predicting.
  BatchLimit limit_predict_batches = 1.0;
  /// Run 1 batch of every stage (n > 0: n batches) once, with no logging or checkpoints, to find bugs.
  int64_t fast_dev_run = 0;
  /// Train and validate on the same few batches every epoch, to check that the model can overfit
  /// them: a count (10) or a fraction (0.01) that replaces limit_train_batches and
  /// limit_val_batches, with the training and validation loaders' shuffling turned off (a
  /// warning says so). Unset or 0: off (Lightning's 0.0).
  std::optional<BatchLimit> overfit_batches;

  // ---- validation ----------------------------------------------------------------------------
  /// Validate every this fraction of a training epoch, or every this many training batches.
  BatchLimit val_check_interval = 1.0;
  /// Validate every this many epochs.
  int64_t check_val_every_n_epoch = 1;
  /// Validation batches run before training, to catch bugs early (-1: all).
  int64_t num_sanity_val_steps = 2;
  /// Ask the module (or DataModule) for new training and validation loaders at every epoch that
  /// is a multiple of this (0, Lightning's default: never). Loaders passed to fit() are kept.
  int64_t reload_dataloaders_every_n_epochs = 0;

  // ---- optimization --------------------------------------------------------------------------
  /// Accumulate gradients over this many batches before each optimizer step.
  int64_t accumulate_grad_batches = 1;
  /// Clip gradients to this value (unset or 0: no clipping).
  std::optional<double> gradient_clip_val;
  /// Clip by total norm or by value.
  GradientClipAlgorithm gradient_clip_algorithm = GradientClipAlgorithm::kNorm;
  /// Run fit under autograd's anomaly mode (torch::autograd::DetectAnomalyGuard): a backward
  /// that produces NaN throws, naming the forward operation that caused it. Slow; for
  /// debugging. Switched off again when fit returns.
  bool detect_anomaly = false;

  // ---- reproducibility -----------------------------------------------------------------------
  /// Seeds LibTorch's global generator and the loaders' shuffles (Lightning's seed_everything).
  std::optional<uint64_t> seed;
  /// Use deterministic algorithms only (true), where they exist with a warning for the rest
  /// ("warn"), or whatever is fastest (false). Applies while a stage runs; restored after.
  Deterministic deterministic;

  // ---- output --------------------------------------------------------------------------------
  /// Where logs and checkpoints go; empty: the current directory.
  std::string default_root_dir;
  /// Send step metrics to the loggers every this many training batches (under gradient
  /// accumulation a batch that did not step counts too; LearningRateMonitor counts optimizer steps).
  int64_t log_every_n_steps = 50;
  /// Lightning's `profiler=`: kSimple prints the wall time per action (data fetch, forward,
  /// backward, gradient synchronization wait, optimizer step, validation, checkpoint save, ...)
  /// at the end of each stage, every process side by side under ddp, and writes
  /// `<log_dir>/profile-<stage>-rank<N>.txt`; kPytorch also traces `profiler_schedule`'s steps
  /// with LibTorch's profiler into `<log_dir>/trace-<stage>-rank<N>.json` (Chrome trace format).
  /// Unset: no profiler (the actions are still timed, for the straggler report).
  std::optional<ProfilerKind> profiler;
  /// profiler=kPytorch: steps skipped, then traced and thrown away (warm-up), then kept
  /// (torch.profiler.schedule's wait, warmup, active; Lightning's default 1, 1, 3).
  int64_t profiler_wait = 1;
  int64_t profiler_warmup = 1;  ///< see profiler_wait
  int64_t profiler_active = 3;  ///< see profiler_wait
  /// Under ddp, every `straggler_every_n_steps` training batches the processes exchange their
  /// step times and gradient-synchronization waits; a process slower than the others' median
  /// by more than `straggler_threshold` (0.2: 20%) in two checks in a row is named, with its
  /// host and slow phase, in the log and on the progress line. False: no exchange.
  bool detect_stragglers = true;
  int64_t straggler_every_n_steps = 100;  ///< see detect_stragglers
  double straggler_threshold = 0.2;       ///< see detect_stragglers
  /// Use the default loggers (TensorBoard and CSV, in one version folder) when `loggers` is empty.
  bool logger = true;
  /// Loggers to use instead of the default.
  std::vector<std::shared_ptr<Logger>> loggers;
  /// Also log to an MLflow tracking server: fit adds an MLFlowLogger beside the other loggers, in
  /// the default loggers' version folder. What is unset comes from MLFLOW_TRACKING_URI and the
  /// other MLFLOW_* variables, so `mlflow = MLFlowOptions{}` uses the environment's server.
  /// Unset: no MLflow.
  std::optional<MLFlowOptions> mlflow;
  /// Callbacks, called in order.
  std::vector<std::shared_ptr<Callback>> callbacks;
  /// Show progress (a bar on a terminal, a line every ~30 s otherwise).
  bool enable_progress_bar = true;
  /// Add a ModelCheckpoint (save every epoch) when none is among the callbacks.
  bool enable_checkpointing = true;
  /// Print the model summary when fit starts.
  bool enable_model_summary = true;
  /// Levels of submodules the summary lists (Lightning's ModelSummary(max_depth)): 1 the direct
  /// submodules, 2 also theirs, -1 all, 0 no summary.
  int64_t model_summary_max_depth = 1;
  /// The program's resolved configuration, e.g. `volt::resolved_config(app)` (what
  /// `--print-config` prints); null: none. fit() writes it to `<log_dir>/config.yaml` (global
  /// rank 0, when there is a logger), and every checkpoint carries it as
  /// `hyper_parameters["config"]`, so a checkpoint says how its run was configured.
  nlohmann::json config;

  // ---- resuming ------------------------------------------------------------------------------
  /// Resume fit from "last", "best" or a checkpoint path; empty: start fresh. Trainer::fit's
  /// argument, when given, takes precedence. An HPC checkpoint (below) takes precedence over both.
  std::string ckpt_path;

  // ---- clusters (SLURM auto-requeue; Lightning's SLURMEnvironment) -----------------------------
  /// In a SLURM batch job, on `requeue_signal`: stop at the next step boundary (all ranks at the
  /// same step), save an HPC checkpoint, run `scontrol requeue`, and return
  /// StopReason::kRequeued. The restarted job resumes from that checkpoint. Never outside SLURM
  /// or in interactive allocations.
  bool auto_requeue = true;
  /// The signal SLURM sends before the wall time (`#SBATCH --signal=USR1@90`): SIGUSR1 (default),
  /// SIGUSR2 (where NCCL uses SIGUSR1), SIGHUP, ...
  RequeueSignal requeue_signal = RequeueSignal::kSigUsr1;
  /// In a SLURM batch job, on SIGTERM (preemption, scancel, the time limit): save an HPC
  /// checkpoint at the next step boundary before stopping, so a requeue resumes from it.
  bool checkpoint_on_sigterm = true;
  /// Where HPC checkpoints (hpc_ckpt_<N>.ckpt) are saved and looked for; empty: default_root_dir.
  std::string hpc_checkpoint_dir;
  /// HPC checkpoints kept; older ones are deleted after each save (>= 1).
  int64_t hpc_checkpoints_to_keep = 2;

  // ---- snapshots (a run that fails resumes from the newest by itself; docs/failures.md) --------
  /// Save a snapshot every this many optimizer steps: snapshot_<N>.ckpt in hpc_checkpoint_dir,
  /// holding all an exact resume needs. Rank 0 copies the state to host memory at the step's end
  /// and a background thread writes it while training goes on. A run that starts again (torchrun
  /// --max-restarts, a SLURM step run again, the same command) resumes from the newest snapshot
  /// or HPC checkpoint. Unset: none.
  std::optional<int64_t> snapshot_every_n_steps;
  /// Also (or instead) save a snapshot about every this many seconds: at each snapshot rank 0
  /// turns the seconds into a step count at the pace since the previous one, which every process
  /// adopts, so all save at the same step. Unset: by steps only.
  std::optional<double> snapshot_every_n_seconds;
  /// Snapshots kept; older ones are deleted once a newer one is complete (>= 1).
  int64_t snapshots_to_keep = 2;
  /// Also keep the newest snapshot in node-local shared memory (/dev/shm, or the tmpfs that
  /// VOLT_SNAPSHOT_MEMORY_DIR names): a restart on the same node reads it from there, and a
  /// snapshot whose file a crash cut short is still whole. Costs host memory of one snapshot's
  /// size until the fit ends. Under sharded checkpoints every process keeps its own shard there,
  /// and a snapshot is resumable from memory once every shard is in its node's.
  bool snapshot_in_memory = true;
  /// On several nodes, also send the newest snapshot to the first process of the next node, which
  /// keeps it in its node's shared memory: a restart after rank 0's node is lost (with the
  /// snapshot's file not yet written) still resumes from it. Costs one snapshot's size of network
  /// traffic per snapshot, sent by rank 0's background writer, and host memory on that node. Under
  /// sharded snapshots every process sends its shard to the same local rank of the next node, and
  /// a restart's processes that lack theirs get them back from there. Needs snapshot_in_memory
  /// and hpc_checkpoint_dir on a file system every node sees.
  bool snapshot_peer_copy = false;
  /// A snapshot that comes due while the previous one is still being written: false waits for it
  /// (the step stalls; docs/failures.md says how many steps a failure can lose); true skips it
  /// (counted in FitResult::snapshots.skipped).
  bool skip_snapshot_when_busy = false;
  /// ModelCheckpoint's saves (and a callback's save_checkpoint) go through the snapshots'
  /// background writer too: rank 0 copies the state to host memory and goes on, the file is
  /// written behind it, and the checkpoints a save replaces are deleted after it. Under sharded
  /// checkpoints every process copies its shard and its writer writes it; rank 0 commits the files
  /// at a later step boundary, once every shard is on disk, as sharded snapshots are. The end of
  /// fit waits for the writes.
  bool async_checkpointing = false;
  /// Under Volt's own launcher (one node, not torchrun, SLURM or MPI): this process supervises
  /// the run's processes instead of being rank 0; when one fails, it ends the others and starts
  /// them all again, up to this many times (torchrun's --max-restarts), and each resumes from the
  /// newest snapshot. fit() then returns a FitResult with `supervised` set: the workers ran the
  /// whole program, so this process should exit (see FitResult::supervised). 0: no restarts.
  int64_t max_restarts = 0;
};

}  // namespace volt
