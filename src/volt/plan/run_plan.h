// What will run: TrainerOptions with every "auto" resolved.
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <string>
#include <vector>

#include "volt/core/env.h"
#include "volt/distributed/topology.h"
#include "volt/environments/cluster_environment.h"
#include "volt/environments/requeue.h"
#include "volt/environments/restarts.h"
#include "volt/options/run_layout.h"
#include "volt/options/trainer_options.h"
#include "volt/precision/precision.h"

namespace volt {

/// The device type whose kernels the accelerator runs (CPU for kCpu, CUDA for kCuda).
c10::DeviceType device_type(Accelerator accelerator);

/// A fully resolved run: nothing in it is "auto" and every value has been validated.
struct RunPlan {
  Accelerator accelerator = Accelerator::kCpu;          ///< where tensors live
  StrategyKind strategy = StrategyKind::kSingleDevice;  ///< how processes cooperate
  Precision precision = Precision::k32True;             ///< parameter and compute dtype
  int64_t devices = 1;               ///< devices per node: processes (ddp) or replicas of one process (dp, ddp2)
  int64_t replicas_per_process = 1;  ///< dp, ddp2: module replicas each process runs, one per device
  int64_t num_nodes = 1;             ///< nodes
  /// CUDA devices this process uses, as it numbers them (after CUDA_VISIBLE_DEVICES): one under
  /// ddp and single_device, the node's devices under dp and ddp2, the root first. Empty on CPU.
  std::vector<int64_t> cuda_devices;
  /// Variables for the local ranks this process launches (CUDA_DEVICE_ORDER and
  /// CUDA_VISIBLE_DEVICES naming the selected GPUs); empty on CPU and under srun/torchrun.
  Env::Vars child_env;
  Topology topology;                          ///< ranks, world size and rendezvous address of this process
  ClusterKind cluster = ClusterKind::kLocal;  ///< who made the processes
  bool launch_local_processes = false;        ///< this process starts its node's other local ranks
  /// c10d backend (ddp): kGloo or kNccl, never kAuto (resolved by the accelerator and the build).
  ProcessGroupBackend process_group_backend = ProcessGroupBackend::kGloo;
  std::chrono::milliseconds process_group_timeout{120000};  ///< collective timeout (ddp)
  std::chrono::milliseconds join_timeout{60000};            ///< rendezvous deadline (ddp)
  bool find_unused_parameters = false;                      ///< ddp reducer option
  /// fsdp: what is sharded (full_shard, shard_grad_op or no_shard); no_shard under every other
  /// strategy.
  ShardingStrategy sharding_strategy = ShardingStrategy::kNoShard;
  /// fsdp full_shard: the fewest parameter elements a volt::FsdpUnit needs to be a unit (0: all).
  int64_t fsdp_min_unit_params = 0;
  /// fsdp: checkpoints' optimizer state in one gathered file (full) or a file per process
  /// (sharded); full under every other strategy.
  StateDictType state_dict_type = StateDictType::kFull;
  /// pipeline: layers per stage (empty: auto, measured on the first batch).
  std::vector<int64_t> pipeline_balance;
  /// pipeline: micro-batches per batch.
  int64_t pipeline_chunks = 1;
  /// pipeline: the order of a Pipe::train_step's micro-batches.
  PipelineSchedule pipeline_schedule = PipelineSchedule::kGPipe;
  bool sync_batchnorm = false;          ///< SyncBatchNorm layers synchronize
  int64_t bucket_cap_mb = 25;           ///< ddp reducer option
  bool use_distributed_sampler = true;  ///< shard loaders across processes
  int64_t num_threads = 1;              ///< intra-op threads of this process
  bool tune_allocator = true;           ///< pin glibc malloc thresholds (off by default under full_shard)

  int64_t max_epochs = 1000;               ///< -1: unlimited
  int64_t min_epochs = 0;                  ///< epochs before a callback may stop training
  int64_t max_steps = -1;                  ///< -1: unlimited
  int64_t min_steps = 0;                   ///< optimizer steps before a callback may stop training
  std::optional<double> max_time;          ///< seconds of training before a Timer stops it
  BatchLimit limit_train_batches = 1.0;    ///< per training epoch
  BatchLimit limit_val_batches = 1.0;      ///< per validation run
  BatchLimit limit_test_batches = 1.0;     ///< when testing
  BatchLimit limit_predict_batches = 1.0;  ///< when predicting
  bool fast_dev_run = false;               ///< a smoke run: no logs, no checkpoints
  /// overfit_batches: the limits above hold its value, and the training and validation loaders
  /// do not shuffle.
  bool overfit_batches = false;
  BatchLimit val_check_interval = 1.0;            ///< fraction of an epoch or a batch count
  int64_t check_val_every_n_epoch = 1;            ///< validate every this many epochs
  int64_t num_sanity_val_steps = 2;               ///< -1: the whole validation set
  int64_t reload_dataloaders_every_n_epochs = 0;  ///< 0: never reload

  int64_t accumulate_grad_batches = 1;                                           ///< batches per optimizer step
  std::optional<double> gradient_clip_val;                                       ///< unset: no clipping
  GradientClipAlgorithm gradient_clip_algorithm = GradientClipAlgorithm::kNorm;  ///< norm or value
  bool detect_anomaly = false;  ///< fit runs under autograd's anomaly mode

  std::optional<uint64_t> seed;                               ///< unset: LibTorch's RNG is left alone
  uint64_t loader_seed = 0;                                   ///< the shuffle seed of loaders that set none
  DeterministicMode deterministic = DeterministicMode::kOff;  ///< deterministic algorithms: off, only, or warn

  std::string root_dir;                  ///< absolute default_root_dir
  int64_t log_every_n_steps = 50;        ///< logger cadence
  std::optional<ProfilerKind> profiler;  ///< unset: actions timed, nothing reported
  int64_t profiler_wait = 1;             ///< profiler=pytorch: steps skipped before the trace
  int64_t profiler_warmup = 1;           ///< profiler=pytorch: steps traced and thrown away
  int64_t profiler_active = 3;           ///< profiler=pytorch: steps traced and kept
  /// Batches between straggler checks; unset: none (one process, or detect_stragglers=false).
  std::optional<int64_t> straggler_every_n_steps;
  double straggler_threshold = 0.2;     ///< slower than the others' median by more than this: a straggler
  bool use_default_logger = true;       ///< add TensorBoard and CSV loggers when none was given
  bool enable_progress_bar = true;      ///< show progress
  bool enable_checkpointing = true;     ///< add a default ModelCheckpoint
  bool enable_model_summary = true;     ///< print the summary table (false also for max depth 0)
  int64_t model_summary_max_depth = 1;  ///< submodule levels the summary lists; -1: all
  std::string ckpt_path;                ///< "", "last", "best" or a path
  RequeuePolicy requeue;                ///< SLURM auto-requeue and the SIGTERM checkpoint
  std::string hpc_checkpoint_dir;       ///< absolute directory of hpc_ckpt_<N>.ckpt files
  int64_t hpc_checkpoints_to_keep = 2;  ///< HPC checkpoints kept after each save
  /// Optimizer steps between snapshots (in hpc_checkpoint_dir); unset: none (also under fast_dev_run).
  std::optional<int64_t> snapshot_every_n_steps;
  /// About this many seconds between snapshots (rank 0's pace turned into steps); unset: none.
  std::optional<double> snapshot_every_n_seconds;
  /// Whether snapshots are saved at all (by steps or by time).
  bool saves_snapshots() const { return snapshot_every_n_steps || snapshot_every_n_seconds; }
  int64_t snapshots_to_keep = 2;  ///< snapshots kept after each one completes
  /// The tmpfs whose folder keeps the newest snapshot in memory (snapshot_memory.h), e.g.
  /// "/dev/shm"; "" when there is none (no snapshots, snapshot_in_memory=false).
  std::string snapshot_memory_root;
  /// The rank that keeps a copy of rank 0's newest snapshot in its node's memory tier (the first
  /// process of node 1, so also the number of processes per node: under sharded snapshots rank r's
  /// shard goes to rank r + this, modulo the world; snapshot_peer_copy on several nodes); unset: none.
  std::optional<int64_t> snapshot_peer_rank;
  bool skip_snapshot_when_busy = false;  ///< skip a snapshot due while the previous is being written
  bool async_checkpointing = false;      ///< ModelCheckpoint's saves written in the background too
  int64_t restart_attempt = 0;           ///< which attempt of a restarted run this is (restart_attempt)
  int64_t max_restarts = 0;              ///< restarts of a failed group (Volt's own launcher)
  /// This process only supervises the run's processes (max_restarts > 0 under Volt's own
  /// launcher, in the process the user started): fit runs them and starts them again on failure.
  bool supervises = false;
  std::optional<FaultInjection> fault;  ///< the fault VOLT_INJECT_FAULT injects into this attempt
  /// Log to this MLflow server too (its URI set and checked, the environment's MLFLOW_* read);
  /// unset: no MLflow, also under fast_dev_run.
  std::optional<MLFlowOptions> mlflow;
  /// What resolving changed that the user should know (seed-document flags that were mapped,
  /// e.g. "use_amp=true became precision='16-mixed'"); the Trainer prints them once.
  std::vector<std::string> notes;

  /// True for the process that writes logs and checkpoints.
  bool is_global_zero() const { return topology.global_rank == 0; }
  /// Whether this process draws progress bars: enabled, and global rank 0 (one bar per run).
  bool shows_progress() const { return enable_progress_bar && is_global_zero(); }
  /// Where the module's parameters live and batches go: the CPU, or the first of cuda_devices.
  c10::Device root_device() const;
  /// A multi-line description ("precision: 32-true" ...), printed by the CLI's --print-plan.
  std::string describe() const;
};

/// Facts about the machine that a plan depends on, injected so resolve_run_plan stays pure.
struct MachineInfo {
  /// Cores available to this process.
  int64_t cores = 1;
  /// The working directory, for a relative default_root_dir.
  std::string cwd = "/";
  /// This host's name (for messages naming ranks).
  std::string host = "localhost";
  /// CUDA devices this process sees (after CUDA_VISIBLE_DEVICES); 0 in CPU builds.
  int64_t gpus = 0;
  /// True when Volt was built against a CUDA LibTorch, which has c10d's NCCL backend.
  bool cuda_build = false;
  /// This machine, read once (sched_getaffinity cores, getcwd).
  static MachineInfo current();
};

/// "every N steps", "about every T s" or both joined by "and": how often snapshots are saved, as
/// the plan's summary and the fit's snapshot report say it.
std::string describe_snapshot_interval(const std::optional<int64_t>& every_n_steps,
                                       const std::optional<double>& every_n_seconds);

/// Resolves and validates `options` against the environment and machine; pure. The processes and
/// devices per node come from resolve_run_layout (volt/options/run_layout.h), which the `volt`
/// tool's job checks call too. Throws volt::Error naming the option, what was given, what is
/// supported, and a HINT.
RunPlan resolve_run_plan(const TrainerOptions& options, const Env& env, const MachineInfo& machine);

}  // namespace volt
