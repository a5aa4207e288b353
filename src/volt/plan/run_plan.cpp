#include "volt/plan/run_plan.h"

#include <sched.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "volt/base/torch_version.h"
#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/loggers/mlflow_rest.h"
#include "volt/plan/gpu_placement.h"
#include "volt/slurm/hostlist.h"

namespace volt {

c10::DeviceType device_type(Accelerator accelerator) {
  switch (accelerator) {
    case Accelerator::kCpu:
      return c10::DeviceType::CPU;
    case Accelerator::kCuda:
      return c10::DeviceType::CUDA;
  }
  return c10::DeviceType::CPU;
}

MachineInfo MachineInfo::current() {
  MachineInfo info;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    info.cores = CPU_COUNT(&set);
  } else {
    info.cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  }
  std::error_code ec;
  info.cwd = std::filesystem::current_path(ec).string();
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) info.host = host;
  info.gpus = static_cast<int64_t>(torch::cuda::device_count());
#ifdef USE_C10D_NCCL
  info.cuda_build = true;  // the CUDA LibTorch's torch_cuda target defines it
#endif
  return info;
}

namespace {

/// Checks that this build and machine can run `accelerator`; `what` is how the user asked for it
/// ("accelerator='gpu'", "gpus=2").
void check_accelerator_available(Accelerator accelerator, const std::string& what, const MachineInfo& machine) {
  if (accelerator == Accelerator::kCpu) return;
  VOLT_CHECK(machine.cuda_build,
             "{} is not available in this build (LibTorch without CUDA); available: cpu; supported here: 'cpu', "
             "'auto'. HINT: use accelerator=\"cpu\" with devices=N (N processes, or N replicas under dp), or build "
             "Volt against a CUDA LibTorch (scripts/build-cuda.sh).",
             what);
  VOLT_CHECK(machine.gpus > 0,
             "{} asks for CUDA devices, but this process sees none (CUDA build, 0 devices visible); available: "
             "cpu; supported here: 'cpu', 'auto'. HINT: check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES, "
             "or use accelerator='cpu'.",
             what);
}

/// Apex's optimization levels as the native mode nearest to each.
Precision precision_of_amp_level(AmpLevel level) {
  switch (level) {
    case AmpLevel::kO0:
      return Precision::k32True;
    case AmpLevel::kO1:
    case AmpLevel::kO2:
      return Precision::k16Mixed;
    case AmpLevel::kO3:
      return Precision::k16True;
  }
  return Precision::k32True;
}

/// options.precision, with the seed documents' use_amp and amp_level (Lightning 0.x with apex)
/// mapped onto it; each mapping leaves a note, and an unsupported result names the mapping.
Precision resolve_precision(const TrainerOptions& options, Accelerator accelerator, std::vector<std::string>& notes) {
  Precision precision = options.precision;
  const bool asked_for_amp = options.use_amp || precision == Precision::k16Mixed;
  if (options.amp_level) {
    const char* level = to_string(*options.amp_level);
    const Precision mapped = precision_of_amp_level(*options.amp_level);
    if (!asked_for_amp) {
      notes.push_back(
          fmt::format("amp_level='{}' was ignored: it applies only with use_amp=true or precision=16, as "
                      "in Lightning",
                      level));
    } else {
      precision = mapped;
      notes.push_back(fmt::format("amp_level='{}' became precision='{}'{}", level, to_string(mapped),
                                  *options.amp_level == AmpLevel::kO2
                                      ? " (apex's float16 weights with float32 master copies have no LibTorch "
                                        "equivalent; native 16-mixed is Lightning's replacement)"
                                      : ""));
    }
  } else if (options.use_amp) {
    VOLT_CHECK(precision != Precision::k64True,
               "use_amp=true conflicts with precision='64-true'. HINT: drop use_amp, or set precision='16-mixed' "
               "(or 'bf16-mixed' on CPU) instead of both.");
    if (precision == Precision::k32True) {
      precision = Precision::k16Mixed;
      notes.push_back("use_amp=true became precision='16-mixed'");
    }
  }
  try {
    check_precision_supported(precision, device_type(accelerator));
  } catch (const Error& e) {
    if (notes.empty()) throw;
    throw Error(fmt::format("{}; {}", join(notes, "; "), e.what()));
  }
  return precision;
}

std::string slurm_layout(const Env& env) {
  return fmt::format("SLURM_NTASKS={}, SLURM_NNODES={}, SLURM_NTASKS_PER_NODE={}", env.get_or("SLURM_NTASKS", "?"),
                     env.get_or("SLURM_NNODES", "?"), env.get_or("SLURM_NTASKS_PER_NODE", "?"));
}

/// Checks the launcher's processes against what the Trainer was told, and builds the topology.
Topology resolve_topology(const ClusterInfo& cluster, int64_t devices, int64_t num_nodes, const Env& env,
                          const MachineInfo& machine) {
  Topology t;
  t.world_size = devices * num_nodes;
  t.processes_per_node = devices;
  t.num_nodes = num_nodes;
  t.host = machine.host;
  // LibTorch 2.x's TCPStore client speaks torchrun 2.x's (libuv) store protocol; 1.13's does not.
  const Rendezvous rendezvous = resolve_rendezvous(cluster, /*can_join_launcher_store=*/VOLT_TORCH_2);
  t.main_address = rendezvous.address;
  t.main_port = rendezvous.port;
  t.join_launcher_store = rendezvous.join_launcher_store;
  t.store_key_prefix = rendezvous.key_prefix;
  if (cluster.creates_processes_externally) {
    const bool slurm = cluster.kind == ClusterKind::kSlurm;
    const std::string hint =
        slurm ? fmt::format(
                    "HINT: make the job script and the Trainer agree: #SBATCH --nodes={} and "
                    "--ntasks-per-node={}, or set devices and num_nodes to the allocation ({}).",
                    num_nodes, devices, slurm_layout(env))
              : fmt::format(
                    "HINT: start {} processes per node on {} nodes (e.g. torchrun --nproc-per-node={} "
                    "--nnodes={}), or set devices and num_nodes to match.",
                    devices, num_nodes, devices, num_nodes);
    VOLT_CHECK(!cluster.local_world_size || *cluster.local_world_size == devices,
               "the Trainer has devices={} per node, but {} started {} processes on this node. {}", devices,
               to_string(cluster.kind), cluster.local_world_size.value_or(0), hint);
    VOLT_CHECK(!cluster.num_nodes || *cluster.num_nodes == num_nodes,
               "the Trainer has num_nodes={}, but the {} job has {} nodes. {}", num_nodes, to_string(cluster.kind),
               cluster.num_nodes.value_or(0), hint);
    VOLT_CHECK(cluster.world_size.value_or(1) == t.world_size,
               "the Trainer expects devices={} x num_nodes={} = {} processes, but {} started {}. {}", devices,
               num_nodes, t.world_size, to_string(cluster.kind), cluster.world_size.value_or(1), hint);
    if (slurm && t.world_size > 1) {
      // The batch shell of an sbatch job carries the job's task count but is one process:
      // without srun, the other ranks would never exist.
      VOLT_CHECK(env.has("SLURM_STEP_NUM_TASKS") || env.has("SLURM_STEP_ID"),
                 "this looks like the batch script of SLURM job {} (no job step), so only 1 of its {} tasks is "
                 "running. HINT: start the program with `srun` in the job script (srun python/your binary ...).",
                 cluster.job_id, t.world_size);
    }
    t.global_rank = cluster.global_rank;
    t.local_rank = cluster.local_rank;
    t.node_rank = cluster.node_rank;
    if (slurm) {
      // Messages about missing ranks can then name the host each was expected on.
      const std::string nodes = slurm_node_list(env);
      if (!nodes.empty()) t.node_hosts = slurm::expand_hostlist(nodes);
    }
    return t;
  }
  // Local: a plain run (this process will launch the others) or a child Volt launched.
  VOLT_CHECK(!cluster.world_size || *cluster.world_size == t.world_size,
             "WORLD_SIZE={} but the Trainer expects devices={} x num_nodes={} = {} processes. HINT: unset WORLD_SIZE, "
             "or make devices and num_nodes match it.",
             cluster.world_size.value_or(0), devices, num_nodes, t.world_size);
  VOLT_CHECK(cluster.local_rank < devices,
             "LOCAL_RANK={} is outside the {} devices of this node. HINT: start devices={} processes per node "
             "(LOCAL_RANK 0..{}), or raise devices to the launcher's processes per node.",
             cluster.local_rank, devices, devices, devices - 1);
  VOLT_CHECK(cluster.node_rank < num_nodes, "NODE_RANK={} is outside num_nodes={}. HINT: number the nodes 0..{}.",
             cluster.node_rank, num_nodes, num_nodes - 1);
  t.local_rank = cluster.local_rank;
  t.node_rank = cluster.node_rank;
  t.global_rank = t.node_rank * devices + t.local_rank;
  if (num_nodes > 1) {
    VOLT_CHECK(env.has("MASTER_ADDR") && env.has("MASTER_PORT"),
               "num_nodes={} outside a cluster launcher needs MASTER_ADDR and MASTER_PORT (rank 0's host and a free "
               "port) and NODE_RANK on every node. HINT: export them on each node, or run under srun or torchrun.",
               num_nodes);
  }
  return t;
}

int64_t resolve_threads(const TrainerOptions& options, const Env& env, const MachineInfo& machine,
                        int64_t processes_per_node) {
  if (options.num_threads) {
    VOLT_CHECK(*options.num_threads >= 1,
               "num_threads={} must be >= 1. HINT: leave num_threads unset to use OMP_NUM_THREADS, "
               "SLURM_CPUS_PER_TASK or the cores divided among the node's processes.",
               *options.num_threads);
    return *options.num_threads;
  }
  for (const char* name : {"OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK"}) {
    if (const auto value = env.get_int(name)) {
      VOLT_CHECK(*value >= 1, "environment variable {}={} must be >= 1. HINT: unset it or give a positive count.", name,
                 *value);
      return *value;
    }
  }
  return std::max<int64_t>(1, machine.cores / processes_per_node);
}

/// c10d's backend: NCCL for CUDA tensors where this LibTorch has it, Gloo otherwise; never kAuto.
ProcessGroupBackend resolve_backend(ProcessGroupBackend backend, Accelerator accelerator, const MachineInfo& machine) {
  const bool cuda = accelerator == Accelerator::kCuda;
  switch (backend) {
    case ProcessGroupBackend::kAuto:
      return cuda && machine.cuda_build ? ProcessGroupBackend::kNccl : ProcessGroupBackend::kGloo;
    case ProcessGroupBackend::kGloo:
      return ProcessGroupBackend::kGloo;
    case ProcessGroupBackend::kNccl:
      VOLT_CHECK(machine.cuda_build,
                 "process_group_backend='nccl' is not available in this CPU build; supported: 'auto', 'gloo'. HINT: "
                 "'nccl' needs a CUDA build of LibTorch (scripts/build-cuda.sh); use 'gloo' on CPU.");
      VOLT_CHECK(cuda,
                 "process_group_backend='nccl' reduces CUDA tensors, but the run's accelerator is cpu. HINT: use "
                 "accelerator=\"gpu\", or process_group_backend='gloo' (or 'auto') on CPU.");
      return ProcessGroupBackend::kNccl;
  }
  return ProcessGroupBackend::kGloo;
}

/// `dir` made absolute against the machine's working directory, normalized, without a trailing '/'.
std::string absolute_dir(const std::string& dir, const MachineInfo& machine) {
  std::filesystem::path path = dir;
  if (path.is_relative()) path = std::filesystem::path(machine.cwd) / path;
  std::string out = path.lexically_normal().string();
  if (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

/// Whether overfit_batches is on: set and not 0 (Lightning's 0.0 means off).
bool overfits(const TrainerOptions& options) {
  if (!options.overfit_batches) return false;
  const BatchLimit& n = *options.overfit_batches;
  return n.is_fraction() ? n.fraction() > 0.0 : n.count() > 0;
}

void check_non_negative(int64_t value, const char* name) {
  VOLT_CHECK(value >= 0, "{}={} must be >= 0. HINT: 0 (the default) turns it off.", name, value);
}

void check_limit(const BatchLimit& limit, const char* name) {
  if (limit.is_fraction()) {
    VOLT_CHECK(limit.fraction() >= 0.0 && limit.fraction() <= 1.0,
               "{}={} is out of range; a fraction must be in [0.0, 1.0]. HINT: pass an integer for a batch count.",
               name, limit.fraction());
  } else {
    VOLT_CHECK(limit.count() >= 0, "{}={} must be >= 0 batches. HINT: a count of batches, or a fraction in [0, 1].",
               name, limit.count());
  }
}

}  // namespace

std::string describe_snapshot_interval(const std::optional<int64_t>& every_n_steps,
                                       const std::optional<double>& every_n_seconds) {
  std::string interval = every_n_steps ? fmt::format("every {} steps", *every_n_steps) : "";
  if (every_n_seconds) interval += fmt::format("{}about every {} s", interval.empty() ? "" : " and ", *every_n_seconds);
  return interval;
}

RunPlan resolve_run_plan(const TrainerOptions& options, const Env& env, const MachineInfo& machine) {
  RunPlan plan;
  check_accelerator_available(resolve_accelerator(options, machine.gpus), describe_accelerator_request(options),
                              machine);
  const RunLayout layout = resolve_run_layout(options, NodeResources{.cores = machine.cores, .gpus = machine.gpus});
  plan.accelerator = layout.accelerator;
  plan.precision = resolve_precision(options, plan.accelerator, plan.notes);
  plan.strategy = layout.strategy;
  plan.devices = layout.devices;
  plan.num_nodes = layout.num_nodes;
  plan.replicas_per_process = layout.replicas_per_process;
  const int64_t processes_per_node = layout.processes_per_node;
  const ClusterInfo cluster = detect_cluster(env);
  plan.cluster = cluster.kind;
  // A pipeline on one node is one process; on several, one process per node (pipeline x ddp).
  if (plan.strategy == StrategyKind::kSingleDevice || plan.strategy == StrategyKind::kDp ||
      (plan.strategy == StrategyKind::kPipeline && plan.num_nodes == 1)) {
    plan.topology.host = machine.host;
    VOLT_CHECK(cluster.world_size.value_or(1) == 1,
               "strategy='{}' runs one process, but {} started {}. HINT: start one task (e.g. srun --ntasks=1), or "
               "use strategy='ddp'.",
               to_string(plan.strategy), to_string(cluster.kind), cluster.world_size.value_or(1));
  } else {
    plan.topology = resolve_topology(cluster, processes_per_node, plan.num_nodes, env, machine);
    plan.launch_local_processes =
        !cluster.creates_processes_externally && processes_per_node > 1 && !env.has("LOCAL_RANK");
  }
  if (plan.accelerator == Accelerator::kCuda) {
    GpuPlacementRequest request;
    request.devices = layout.device_request;
    request.processes_per_node = processes_per_node;
    request.local_rank = plan.topology.local_rank;
    request.cluster = cluster.kind;
    request.launches_local_processes = plan.launch_local_processes;
    request.visible_gpus = machine.gpus;
    GpuPlacement placement = place_gpus(request, env);
    plan.cuda_devices = std::move(placement.devices);
    plan.child_env = std::move(placement.child_env);
  }
  plan.process_group_backend = resolve_backend(options.process_group_backend, plan.accelerator, machine);
  VOLT_CHECK(options.process_group_timeout > 0 && options.join_timeout > 0,
             "process_group_timeout={} and join_timeout={} must be positive (seconds). HINT: the defaults are 120 and "
             "60 seconds.",
             options.process_group_timeout, options.join_timeout);
  plan.process_group_timeout = std::chrono::milliseconds(static_cast<int64_t>(options.process_group_timeout * 1000));
  plan.join_timeout = std::chrono::milliseconds(static_cast<int64_t>(options.join_timeout * 1000));
  plan.find_unused_parameters = options.find_unused_parameters || layout.strategy_finds_unused_parameters;
  VOLT_CHECK(!options.sync_batchnorm || (plan.strategy != StrategyKind::kDp && plan.strategy != StrategyKind::kDdp2),
             "sync_batchnorm=true with strategy='{}': its replicas run on threads of one process, which "
             "SyncBatchNorm's process-group collectives cannot span. HINT: use strategy='ddp' (one process per "
             "device), or set sync_batchnorm=false.",
             to_string(plan.strategy));
  plan.sync_batchnorm = options.sync_batchnorm;
  VOLT_CHECK(!options.sharding_strategy || plan.strategy == StrategyKind::kFsdp,
             "sharding_strategy='{}' is an option of strategy='fsdp', but the strategy is '{}'. HINT: set "
             "strategy='fsdp', or leave sharding_strategy unset.",
             to_string(options.sharding_strategy.value_or(ShardingStrategy::kNoShard)), to_string(plan.strategy));
  VOLT_CHECK(!options.fsdp_min_unit_params || plan.strategy == StrategyKind::kFsdp,
             "fsdp_min_unit_params={} is an option of strategy='fsdp' with sharding_strategy='full_shard', but the "
             "strategy is '{}'. HINT: set strategy='fsdp', or leave fsdp_min_unit_params unset.",
             options.fsdp_min_unit_params.value_or(0), to_string(plan.strategy));
  VOLT_CHECK((!options.pipeline_balance && !options.pipeline_chunks && !options.pipeline_schedule) ||
                 plan.strategy == StrategyKind::kPipeline,
             "pipeline_balance, pipeline_chunks and pipeline_schedule are options of strategy='pipeline', but the "
             "strategy is '{}'. "
             "HINT: set strategy='pipeline', or leave them unset.",
             to_string(plan.strategy));
  if (plan.strategy == StrategyKind::kPipeline) {
    plan.pipeline_chunks = options.pipeline_chunks.value_or(8);
    VOLT_CHECK(plan.pipeline_chunks >= 1, "pipeline_chunks={} must be >= 1. HINT: 1 runs each batch whole.",
               plan.pipeline_chunks);
    plan.pipeline_schedule = options.pipeline_schedule.value_or(PipelineSchedule::kGPipe);
    plan.pipeline_balance = options.pipeline_balance.value_or(std::vector<int64_t>{});
    VOLT_CHECK(plan.pipeline_balance.empty() || static_cast<int64_t>(plan.pipeline_balance.size()) == plan.devices,
               "pipeline_balance has {} stages, but devices={} makes {}. HINT: give one layer count per device, or "
               "pipeline_balance='auto'.",
               plan.pipeline_balance.size(), plan.devices, plan.devices);
  }
  if (plan.strategy == StrategyKind::kFsdp) {
    plan.sharding_strategy = options.sharding_strategy.value_or(ShardingStrategy::kShardGradOp);
    VOLT_CHECK(!options.fsdp_min_unit_params || plan.sharding_strategy == ShardingStrategy::kFullShard,
               "fsdp_min_unit_params={} is full_shard's wrapping policy, but sharding_strategy is '{}', which keeps "
               "every parameter whole. HINT: set sharding_strategy='full_shard', or leave fsdp_min_unit_params unset.",
               options.fsdp_min_unit_params.value_or(0), to_string(plan.sharding_strategy));
    plan.fsdp_min_unit_params = options.fsdp_min_unit_params.value_or(0);
    VOLT_CHECK(plan.fsdp_min_unit_params >= 0,
               "fsdp_min_unit_params={} must be >= 0. HINT: 0 makes every "
               "volt::FsdpUnit a unit.",
               plan.fsdp_min_unit_params);
    plan.state_dict_type = options.state_dict_type.value_or(StateDictType::kFull);
    VOLT_CHECK(plan.state_dict_type == StateDictType::kFull || plan.sharding_strategy != ShardingStrategy::kNoShard,
               "state_dict_type='sharded' writes each process's shard of the optimizer state, but "
               "sharding_strategy='{}' shards nothing. HINT: use sharding_strategy='shard_grad_op' or 'full_shard', "
               "or state_dict_type='full'.",
               to_string(plan.sharding_strategy));
  }
  VOLT_CHECK(!options.state_dict_type || plan.strategy == StrategyKind::kFsdp,
             "state_dict_type='{}' is an option of strategy='fsdp', but the strategy is '{}'. HINT: set "
             "strategy='fsdp', or leave state_dict_type unset.",
             to_string(options.state_dict_type.value_or(StateDictType::kFull)), to_string(plan.strategy));
  VOLT_CHECK(options.bucket_cap_mb >= 1,
             "bucket_cap_mb={} must be >= 1. HINT: 25 (the default, as PyTorch's DDP) reduces gradients in 25 MB "
             "buckets.",
             options.bucket_cap_mb);
  plan.bucket_cap_mb = options.bucket_cap_mb;
  plan.use_distributed_sampler = options.use_distributed_sampler;
  plan.num_threads = resolve_threads(options, env, machine, plan.devices);
  // full_shard is chosen for memory: its freed unit buffers must go back to the OS.
  plan.tune_allocator = options.tune_allocator.value_or(
      !(plan.strategy == StrategyKind::kFsdp && plan.sharding_strategy == ShardingStrategy::kFullShard));

  VOLT_CHECK(!options.max_epochs || *options.max_epochs >= -1,
             "max_epochs={} is invalid; expected -1 (no limit) or a count >= 0. HINT: leave it unset for Lightning's "
             "default (1000 epochs, unless max_steps bounds the run).",
             options.max_epochs.value_or(0));
  VOLT_CHECK(options.max_steps.value_or(-1) >= -1,
             "max_steps={} is invalid; expected a count >= 0, or -1 (no limit). HINT: leave max_steps unset for no "
             "limit.",
             options.max_steps.value_or(-1));
  check_non_negative(options.min_epochs, "min_epochs");
  VOLT_CHECK(options.min_steps >= 0, "min_steps={} must be >= 0. HINT: 0 (the default) sets no minimum.",
             options.min_steps);
  VOLT_CHECK(options.max_steps.value_or(-1) == -1 || options.min_steps <= *options.max_steps,
             "min_steps={} is more than max_steps={}; training stops at max_steps. HINT: lower min_steps, or raise "
             "max_steps (-1: no limit).",
             options.min_steps, options.max_steps.value_or(-1));
  VOLT_CHECK(options.model_summary_max_depth >= -1,
             "model_summary_max_depth={} is invalid; expected -1 (every level), 0 (no summary) or a depth >= 1. "
             "HINT: 1 lists the direct submodules.",
             options.model_summary_max_depth);
  if (options.overfit_batches) check_limit(*options.overfit_batches, "overfit_batches");
  check_non_negative(options.fast_dev_run, "fast_dev_run");
  check_limit(options.limit_train_batches, "limit_train_batches");
  check_limit(options.limit_val_batches, "limit_val_batches");
  check_limit(options.limit_test_batches, "limit_test_batches");
  check_limit(options.limit_predict_batches, "limit_predict_batches");
  check_limit(options.val_check_interval, "val_check_interval");
  VOLT_CHECK(options.val_check_interval.is_fraction() ? options.val_check_interval.fraction() > 0.0
                                                      : options.val_check_interval.count() > 0,
             "val_check_interval={} must be positive. HINT: use limit_val_batches=0 to disable validation.",
             options.val_check_interval.to_string());
  VOLT_CHECK(options.check_val_every_n_epoch >= 1,
             "check_val_every_n_epoch={} must be >= 1. HINT: 1 validates every epoch; limit_val_batches=0 turns "
             "validation off.",
             options.check_val_every_n_epoch);
  VOLT_CHECK(options.reload_dataloaders_every_n_epochs >= 0,
             "reload_dataloaders_every_n_epochs={} must be >= 0. HINT: 0 never reloads, n reloads every n epochs.",
             options.reload_dataloaders_every_n_epochs);
  VOLT_CHECK(options.num_sanity_val_steps >= -1,
             "num_sanity_val_steps={} is invalid; expected -1 (all) or >= 0. HINT: 0 skips the sanity check.",
             options.num_sanity_val_steps);
  VOLT_CHECK(options.accumulate_grad_batches >= 1,
             "accumulate_grad_batches={} must be >= 1. HINT: 1 (the default) steps the optimizers every batch; k "
             "accumulates k batches per step.",
             options.accumulate_grad_batches);
  VOLT_CHECK(!options.gradient_clip_val || *options.gradient_clip_val >= 0.0,
             "gradient_clip_val={} must be >= 0. HINT: leave it unset (or 0) not to clip.",
             options.gradient_clip_val.value_or(0.0));
  VOLT_CHECK(options.log_every_n_steps >= 1,
             "log_every_n_steps={} must be >= 1. HINT: 50 (the default) logs step values every 50 training batches; "
             "to log nothing, set logger=false.",
             options.log_every_n_steps);
  VOLT_CHECK(options.profiler_wait >= 0 && options.profiler_warmup >= 0 && options.profiler_active >= 1,
             "profiler_wait={}, profiler_warmup={}, profiler_active={}: expected wait >= 0, warmup >= 0 and "
             "active >= 1 steps. HINT: the defaults 1, 1, 3 trace steps 3 to 5.",
             options.profiler_wait, options.profiler_warmup, options.profiler_active);
  VOLT_CHECK(!options.detect_stragglers || options.straggler_every_n_steps >= 1,
             "straggler_every_n_steps={} must be >= 1. HINT: set detect_stragglers=false "
             "(--no-detect-stragglers) for no straggler checks.",
             options.straggler_every_n_steps);
  VOLT_CHECK(!options.detect_stragglers || options.straggler_threshold > 0.0,
             "straggler_threshold={} must be > 0 (0.2: a process 20% slower than the others' median is named). HINT: "
             "keep the default 0.2, or set detect_stragglers=false (--no-detect-stragglers) for no straggler checks.",
             options.straggler_threshold);

  // Lightning: max_epochs defaults to 1000 unless max_steps bounds the run.
  plan.max_steps = options.max_steps.value_or(-1);
  plan.max_epochs = options.max_epochs.value_or(plan.max_steps == -1 ? 1000 : -1);
  plan.min_epochs = options.min_epochs;
  plan.min_steps = options.min_steps;
  if (options.max_time) {
    VOLT_CHECK(std::isfinite(options.max_time->count()) && options.max_time->count() > 0,
               "max_time={} s must be a positive duration. HINT: leave max_time unset for no time limit.",
               options.max_time->count());
    plan.max_time = options.max_time->count();
  }
  plan.limit_train_batches = options.limit_train_batches;
  plan.limit_val_batches = options.limit_val_batches;
  plan.limit_test_batches = options.limit_test_batches;
  plan.limit_predict_batches = options.limit_predict_batches;
  plan.val_check_interval = options.val_check_interval;
  plan.check_val_every_n_epoch = options.check_val_every_n_epoch;
  plan.num_sanity_val_steps = options.num_sanity_val_steps;
  plan.reload_dataloaders_every_n_epochs = options.reload_dataloaders_every_n_epochs;
  plan.accumulate_grad_batches = options.accumulate_grad_batches;
  // Lightning's reading of 0: no clipping (clipping to 0 would zero every gradient).
  if (options.gradient_clip_val && *options.gradient_clip_val > 0.0) plan.gradient_clip_val = options.gradient_clip_val;
  plan.gradient_clip_algorithm = options.gradient_clip_algorithm;
  plan.seed = options.seed;
  plan.loader_seed = options.seed.value_or(0);
  plan.detect_anomaly = options.detect_anomaly;
  plan.deterministic = options.deterministic.mode();
  plan.log_every_n_steps = options.log_every_n_steps;
  plan.profiler = options.profiler;
  plan.profiler_wait = options.profiler_wait;
  plan.profiler_warmup = options.profiler_warmup;
  plan.profiler_active = options.profiler_active;
  if (options.detect_stragglers && plan.topology.world_size > 1)
    plan.straggler_every_n_steps = options.straggler_every_n_steps;
  plan.straggler_threshold = options.straggler_threshold;
  plan.use_default_logger = options.logger;
  if (options.mlflow) {
    plan.mlflow = mlflow_options_from_env(*options.mlflow, env);
    VOLT_CHECK(plan.mlflow->tracking_uri.has_value(),
               "mlflow is set but names no tracking server, and MLFLOW_TRACKING_URI is not set. HINT: pass "
               "--mlflow-tracking-uri http://HOST:PORT (TrainerOptions::mlflow->tracking_uri) or export "
               "MLFLOW_TRACKING_URI; `mlflow server --host 127.0.0.1 --port 5000` starts a local server.");
    plan.mlflow->tracking_uri = mlflow::normalize_tracking_uri(*plan.mlflow->tracking_uri);
  }
  plan.enable_progress_bar = options.enable_progress_bar;
  plan.enable_checkpointing = options.enable_checkpointing;
  // Lightning's ModelSummary(max_depth=0) prints nothing.
  plan.enable_model_summary = options.enable_model_summary && options.model_summary_max_depth != 0;
  plan.model_summary_max_depth = options.model_summary_max_depth;
  plan.ckpt_path = options.ckpt_path;

  plan.root_dir = absolute_dir(options.default_root_dir.empty() ? machine.cwd : options.default_root_dir, machine);

  plan.requeue = resolve_requeue_policy(env, options.auto_requeue, signal_number(options.requeue_signal),
                                        options.checkpoint_on_sigterm);
  VOLT_CHECK(options.hpc_checkpoints_to_keep >= 1,
             "hpc_checkpoints_to_keep={} must be >= 1: a requeued job resumes from the newest one. HINT: use 1 to "
             "keep only the newest, or auto_requeue=false and checkpoint_on_sigterm=false to write none.",
             options.hpc_checkpoints_to_keep);
  plan.hpc_checkpoints_to_keep = options.hpc_checkpoints_to_keep;
  plan.hpc_checkpoint_dir =
      options.hpc_checkpoint_dir.empty() ? plan.root_dir : absolute_dir(options.hpc_checkpoint_dir, machine);
  VOLT_CHECK(!options.snapshot_every_n_steps || *options.snapshot_every_n_steps >= 1,
             "snapshot_every_n_steps={} must be >= 1. HINT: leave it unset for no snapshots.",
             options.snapshot_every_n_steps.value_or(0));
  VOLT_CHECK(options.snapshots_to_keep >= 1,
             "snapshots_to_keep={} must be >= 1: a run that fails resumes from the newest one. HINT: use 1 to keep "
             "only the newest.",
             options.snapshots_to_keep);
  VOLT_CHECK(!options.snapshot_every_n_seconds || *options.snapshot_every_n_seconds > 0,
             "snapshot_every_n_seconds={} must be > 0. HINT: leave it unset to save snapshots by steps only.",
             options.snapshot_every_n_seconds.value_or(0));
  plan.snapshot_every_n_steps = options.snapshot_every_n_steps;
  plan.snapshot_every_n_seconds = options.snapshot_every_n_seconds;
  // Sharded snapshots too: every process keeps its shard in its node's tier.
  if (plan.saves_snapshots() && options.snapshot_in_memory)
    plan.snapshot_memory_root = env.get_or("VOLT_SNAPSHOT_MEMORY_DIR", "/dev/shm");
  if (options.snapshot_peer_copy && plan.saves_snapshots()) {
    VOLT_CHECK(options.snapshot_in_memory,
               "snapshot_peer_copy=true keeps rank 0's newest snapshot in another node's shared memory, and "
               "snapshot_in_memory=false keeps none. HINT: set snapshot_in_memory=true (--snapshot-in-memory).");
    // The first process of the next node: on another host than rank 0's whenever nodes are hosts.
    // Sharded snapshots: every process's shard goes to the same local rank on the next node.
    if (plan.num_nodes > 1) plan.snapshot_peer_rank = plan.topology.processes_per_node;
  }
  plan.snapshots_to_keep = options.snapshots_to_keep;
  plan.skip_snapshot_when_busy = options.skip_snapshot_when_busy;
  plan.async_checkpointing = options.async_checkpointing;
  plan.restart_attempt = restart_attempt(env);
  VOLT_CHECK(options.max_restarts >= 0, "max_restarts={} must be >= 0. HINT: use 0 for no restarts.",
             options.max_restarts);
  plan.max_restarts = options.max_restarts;
  if (options.max_restarts > 0) {
    VOLT_CHECK(plan.cluster == ClusterKind::kLocal,
               "max_restarts={} restarts the processes Volt's own launcher starts, but {} started this one. HINT: {}.",
               options.max_restarts, to_string(plan.cluster),
               plan.cluster == ClusterKind::kTorchrun ? "pass --max-restarts to torchrun instead"
               : plan.cluster == ClusterKind::kSlurm
                   ? "render the job with `volt slurm render --max-restarts N`, which runs a failed srun step again"
                   : "start mpirun again yourself; every start resumes from the newest snapshot");
    VOLT_CHECK(plan.num_nodes == 1,
               "max_restarts={} with num_nodes={}: Volt's own launcher restarts the processes of one node only. "
               "HINT: start multi-node runs with torchrun --max-restarts or a SLURM job (volt slurm render "
               "--max-restarts).",
               options.max_restarts, plan.num_nodes);
    // The workers it starts carry LOCAL_RANK: they train, and never supervise in turn.
    plan.supervises = !env.has("LOCAL_RANK");
    if (plan.supervises) plan.launch_local_processes = false;
  }
  plan.fault = read_fault_injection(env, plan.restart_attempt);

  if (options.fast_dev_run > 0) {
    // Lightning's fast_dev_run: n batches of each stage, one epoch, nothing written.
    const BatchLimit n(static_cast<long long>(options.fast_dev_run));
    plan.fast_dev_run = true;
    plan.limit_train_batches = plan.limit_val_batches = plan.limit_test_batches = plan.limit_predict_batches = n;
    plan.max_epochs = 1;
    plan.max_steps = options.fast_dev_run;
    plan.num_sanity_val_steps = 0;
    plan.val_check_interval = 1.0;
    plan.check_val_every_n_epoch = 1;
    plan.use_default_logger = false;
    plan.mlflow.reset();
    plan.snapshot_every_n_steps.reset();
    plan.snapshot_every_n_seconds.reset();
    plan.snapshot_memory_root.clear();
    plan.snapshot_peer_rank.reset();
    plan.enable_checkpointing = false;
    plan.requeue.enabled = false;
    plan.requeue.checkpoint_on_sigterm = false;
    plan.requeue.disabled_reason = "fast_dev_run";
  }
  if (overfits(options)) {
    // Lightning's overfit_batches: the same batches of the training and validation loaders every
    // epoch (their shuffling is turned off when the loaders are set up). Test and predict keep
    // their limits; as in Lightning, it also wins over fast_dev_run's limits.
    const BatchLimit& n = *options.overfit_batches;
    // A limit the user set is replaced, as in Lightning; say so rather than drop it silently.
    std::vector<std::string> replaced;
    for (const auto& [limit, name] : {std::pair{&options.limit_train_batches, "limit_train_batches"},
                                      std::pair{&options.limit_val_batches, "limit_val_batches"}}) {
      const bool is_default = limit->is_fraction() && limit->fraction() == 1.0;
      if (!is_default) replaced.push_back(fmt::format("{}={}", name, limit->to_string()));
    }
    if (!replaced.empty()) {
      plan.notes.push_back(
          fmt::format("overfit_batches={} replaced {}, as in Lightning", n.to_string(), join(replaced, " and ")));
    }
    plan.overfit_batches = true;
    plan.limit_train_batches = plan.limit_val_batches = n;
  }
  return plan;
}

c10::Device RunPlan::root_device() const {
  if (accelerator == Accelerator::kCpu || cuda_devices.empty()) return c10::Device(c10::DeviceType::CPU);
  return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(cuda_devices.front()));
}

std::string RunPlan::describe() const {
  std::string out;
  const auto line = [&out](const char* key, const std::string& value) { out += fmt::format("{:<24}{}\n", key, value); };
  line("accelerator", to_string(accelerator));
  line("libtorch", compat::torch_version());
  line("strategy", to_string(strategy));
  line("precision", fmt::format("{}{}", to_string(precision),
                                is_mixed(precision) ? fmt::format(" (autocast to {})", precision == Precision::k16Mixed
                                                                                           ? "float16, loss scaling"
                                                                                           : "bfloat16")
                                                    : std::string()));
  line("devices x nodes", fmt::format("{} x {} (world size {})", devices, num_nodes, topology.world_size));
  if (!cuda_devices.empty()) {
    std::vector<std::string> ids;
    for (int64_t d : cuda_devices) ids.push_back(fmt::format("cuda:{}", d));
    line("this process's devices", join(ids, ", "));
  }
  const bool process_group = strategy == StrategyKind::kDdp || strategy == StrategyKind::kDdp2 ||
                             strategy == StrategyKind::kFsdp || (strategy == StrategyKind::kPipeline && num_nodes > 1);
  if (process_group) line("process group backend", to_string(process_group_backend));
  if (strategy == StrategyKind::kFsdp) {
    line("sharding strategy",
         fmt::format("{}{}", to_string(sharding_strategy),
                     sharding_strategy == ShardingStrategy::kShardGradOp
                         ? " (gradients and optimizer state split over the processes)"
                     : sharding_strategy == ShardingStrategy::kFullShard
                         ? fmt::format(" (also the parameters of each volt::FsdpUnit with >= {} elements, gathered "
                                       "for its forward and backward)",
                                       fsdp_min_unit_params)
                         : std::string(" (gradients all-reduced, as ddp)")));
    line("checkpoints", state_dict_type == StateDictType::kFull
                            ? "full (optimizer state gathered on rank 0 into one file)"
                            : "sharded (each process writes its optimizer shard beside rank 0's index file)");
  }
  line("cluster environment", to_string(cluster));
  line("rank",
       fmt::format("global {} / local {} / node {}", topology.global_rank, topology.local_rank, topology.node_rank));
  if (strategy == StrategyKind::kPipeline) {
    line("pipeline",
         fmt::format("{} stages (one per device), balance {}, {} micro-batches per batch, schedule {}", devices,
                     pipeline_balance.empty() ? std::string("auto") : to_string_pipeline_balance(pipeline_balance),
                     pipeline_chunks, to_string(pipeline_schedule)));
  }
  if (replicas_per_process > 1 || strategy == StrategyKind::kDp || strategy == StrategyKind::kDdp2) {
    line("replicas per process",
         fmt::format("{} (each batch split across them; losses combined by training_step_end)", replicas_per_process));
  }
  if (strategy == StrategyKind::kDdp2) {
    line("gradient all-reduce", fmt::format("across {} nodes (one process each; loaders sharded by node)", num_nodes));
  }
  if (process_group) {
    line("rendezvous",
         fmt::format("{}:{}{}", topology.main_address,
                     topology.main_port == 0 ? std::string("(free port)") : std::to_string(topology.main_port),
                     topology.join_launcher_store ? " (the launcher's store)" : ""));
    line("launcher", launch_local_processes ? "volt (re-runs this program)" : "external or child");
  }
  line("threads per process", std::to_string(num_threads));
  line("max_epochs", max_epochs == -1 ? "unlimited" : std::to_string(max_epochs));
  line("max_steps", max_steps == -1 ? "unlimited" : std::to_string(max_steps));
  if (min_epochs > 0) line("min_epochs", std::to_string(min_epochs));
  if (min_steps > 0) line("min_steps", std::to_string(min_steps));
  if (max_time)
    line("max_time", format_duration(std::chrono::duration<double>(*max_time)) + " (a Timer stops training)");
  if (overfit_batches) line("overfit_batches", limit_train_batches.to_string() + " (no shuffling)");
  line("limit_train_batches", limit_train_batches.to_string());
  line("limit_val_batches", limit_val_batches.to_string());
  line("limit_test_batches", limit_test_batches.to_string());
  line("limit_predict_batches", limit_predict_batches.to_string());
  line("val_check_interval", val_check_interval.to_string());
  line("accumulate_grad_batches", std::to_string(accumulate_grad_batches));
  line("gradient clipping",
       gradient_clip_val ? fmt::format("{} by {}", *gradient_clip_val, to_string(gradient_clip_algorithm)) : "off");
  line("seed", seed ? std::to_string(*seed) : "unset");
  line("deterministic", to_string(deterministic));
  if (detect_anomaly) line("detect_anomaly", "true");
  line("model summary", enable_model_summary ? fmt::format("max depth {}", model_summary_max_depth) : "off");
  line("root dir", root_dir);
  if (mlflow) {
    line("mlflow", fmt::format("{}, experiment {}, log_model {}", *mlflow->tracking_uri,
                               mlflow->experiment_name.value_or("lightning_logs"), to_string(mlflow->log_model)));
  }
  line("auto-requeue", requeue.enabled
                           ? fmt::format("on {} (scontrol requeue {})", signal_name(requeue.signal), requeue.job_id)
                           : fmt::format("off ({})", requeue.disabled_reason));
  line("checkpoint on SIGTERM", requeue.checkpoint_on_sigterm ? "yes" : "no");
  line("HPC checkpoints", fmt::format("{} (keep {})", hpc_checkpoint_dir, hpc_checkpoints_to_keep));
  line("async checkpointing", async_checkpointing ? "yes" : "no");
  std::string in_memory;
  if (!snapshot_memory_root.empty()) in_memory = fmt::format(", the newest also in {}", snapshot_memory_root);
  if (snapshot_peer_rank) {
    in_memory += state_dict_type == StateDictType::kSharded
                     ? std::string(", each shard also in the next node's memory")
                     : fmt::format(" and in rank {}'s node's memory", *snapshot_peer_rank);
  }
  line("snapshots",
       saves_snapshots()
           ? fmt::format("{} into {} (keep {}; {} when busy){}",
                         describe_snapshot_interval(snapshot_every_n_steps, snapshot_every_n_seconds),
                         hpc_checkpoint_dir, snapshots_to_keep, skip_snapshot_when_busy ? "skip" : "wait", in_memory)
           : std::string("none"));
  if (restart_attempt > 0) line("restart attempt", std::to_string(restart_attempt));
  if (max_restarts > 0) {
    line("max_restarts", fmt::format("{}{}", max_restarts,
                                     supervises ? " (this process supervises the workers and restarts them)" : ""));
  }
  if (fault)
    line("injected fault",
         fmt::format("rank {} dies at {} of step {}", fault->rank, to_string(fault->at), fault->step));
  line("fast_dev_run", fast_dev_run ? "true" : "false");
  for (const auto& note : notes) line("note", note);
  return out;
}

}  // namespace volt
