#include "volt/plan/run_plan.h"

#include <gtest/gtest.h>

#include "volt/base/torch_version.h"
#include "volt/core/error.h"

namespace volt {
namespace {

const MachineInfo kMachine{8, "/work", "host0"};

RunPlan plan(const TrainerOptions& options, Env::Vars env = {}) {
  return resolve_run_plan(options, Env(std::move(env)), kMachine);
}

std::string error_of(const TrainerOptions& options, Env::Vars env = {}) {
  try {
    plan(options, std::move(env));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RunPlan, DefaultsMatchLightning) {
  const RunPlan p = plan({});
  EXPECT_EQ(p.max_epochs, 1000);
  EXPECT_EQ(p.max_steps, -1);
  EXPECT_EQ(p.num_sanity_val_steps, 2);
  EXPECT_EQ(p.log_every_n_steps, 50);
  EXPECT_EQ(p.devices, 1);
  EXPECT_EQ(p.precision, Precision::k32True);
  EXPECT_EQ(p.root_dir, "/work");
  EXPECT_TRUE(p.enable_checkpointing);
}

TEST(RunPlan, MaxStepsAloneMeansUnlimitedEpochs) {
  EXPECT_EQ(plan({.max_steps = 10}).max_epochs, -1);
  EXPECT_EQ(plan({.max_steps = -1}).max_epochs, 1000);  // -1 is Lightning's "no limit", like unset
  EXPECT_EQ(plan({.max_epochs = 2, .max_steps = 10}).max_epochs, 2);
}

TEST(RunPlan, ThreadsComeFromOptionsThenEnvironmentThenCores) {
  EXPECT_EQ(plan({.num_threads = 3}).num_threads, 3);
  EXPECT_NE(error_of({.num_threads = 0}).find("HINT: leave num_threads unset"), std::string::npos);
  EXPECT_EQ(plan({}, {{"OMP_NUM_THREADS", "2"}}).num_threads, 2);
  EXPECT_EQ(plan({}, {{"SLURM_CPUS_PER_TASK", "4"}}).num_threads, 4);
  EXPECT_EQ(plan({}).num_threads, 8);
}

TEST(RunPlan, RelativeRootDirIsResolvedAgainstTheWorkingDirectory) {
  EXPECT_EQ(plan({.default_root_dir = "runs/a/"}).root_dir, "/work/runs/a");
  EXPECT_EQ(plan({.default_root_dir = "/abs"}).root_dir, "/abs");
}

TEST(RunPlan, FastDevRunLimitsEverythingAndWritesNothing) {
  const RunPlan p = plan({.fast_dev_run = 2});
  EXPECT_TRUE(p.fast_dev_run);
  EXPECT_EQ(p.limit_train_batches.count(), 2);
  EXPECT_EQ(p.limit_val_batches.count(), 2);
  EXPECT_EQ(p.max_epochs, 1);
  EXPECT_FALSE(p.enable_checkpointing);
  EXPECT_FALSE(p.use_default_logger);
  EXPECT_EQ(p.num_sanity_val_steps, 0);
  TrainerOptions snapshots{.fast_dev_run = 2};
  snapshots.snapshot_every_n_steps = 1;
  EXPECT_FALSE(plan(snapshots).snapshot_every_n_steps) << "no snapshots either";
  EXPECT_EQ(plan(snapshots).snapshot_memory_root, "");
}

TEST(RunPlan, ThePeerCopyGoesToTheNextNodeAndNeedsTheMemoryTier) {
  TrainerOptions options{.devices = 2, .strategy = StrategyRequest::kDdp, .num_nodes = 2};
  options.snapshot_every_n_steps = 50;
  options.snapshot_peer_copy = true;
  const Env::Vars node1{{"NODE_RANK", "1"}, {"MASTER_ADDR", "10.1.1.1"}, {"MASTER_PORT", "5555"}};
  const RunPlan p = plan(options, node1);
  EXPECT_EQ(p.snapshot_peer_rank, 2) << "node 1's local rank 0, on every process alike";
  EXPECT_NE(p.describe().find("the newest also in /dev/shm and in rank 2's node's memory"), std::string::npos)
      << p.describe();
  TrainerOptions one_node = options;
  one_node.num_nodes = 1;
  EXPECT_FALSE(plan(one_node).snapshot_peer_rank) << "no other node to survive the loss of";
  TrainerOptions off = options;
  off.snapshot_peer_copy = false;
  EXPECT_FALSE(plan(off, node1).snapshot_peer_rank);
  TrainerOptions files_only = options;
  files_only.snapshot_in_memory = false;
  const std::string message = error_of(files_only, node1);
  EXPECT_NE(message.find("snapshot_peer_copy=true keeps rank 0's newest snapshot in another node's shared memory, "
                         "and snapshot_in_memory=false keeps none. HINT: set snapshot_in_memory=true"),
            std::string::npos)
      << message;
  TrainerOptions sharded = options;
  sharded.strategy = StrategyRequest::kFsdp;
  sharded.state_dict_type = StateDictType::kSharded;
  const RunPlan copies = plan(sharded, node1);
  EXPECT_EQ(copies.snapshot_peer_rank, 2) << "every process's shard goes to the same local rank on the next node";
  EXPECT_NE(copies.describe().find("the newest also in /dev/shm, each shard also in the next node's memory"),
            std::string::npos)
      << copies.describe();
  sharded.snapshot_peer_copy = false;
  EXPECT_EQ(plan(sharded, node1).snapshot_memory_root, "/dev/shm") << "each process keeps its shard in memory";
}

TEST(RunPlan, SnapshotsNeedAPositiveIntervalAndKeepAtLeastOne) {
  TrainerOptions options;
  options.snapshot_every_n_steps = 50;
  options.snapshots_to_keep = 3;
  const RunPlan p = plan(options);
  EXPECT_EQ(p.snapshot_every_n_steps, 50);
  EXPECT_EQ(p.snapshots_to_keep, 3);
  EXPECT_NE(p.describe().find("every 50 steps into"), std::string::npos) << p.describe();
  // The memory tier: /dev/shm unless the environment names another tmpfs; off when asked.
  EXPECT_EQ(p.snapshot_memory_root, "/dev/shm");
  EXPECT_NE(p.describe().find("the newest also in /dev/shm"), std::string::npos) << p.describe();
  EXPECT_EQ(plan(options, {{"VOLT_SNAPSHOT_MEMORY_DIR", "/run/user/7"}}).snapshot_memory_root, "/run/user/7");
  EXPECT_EQ(plan({}).snapshot_memory_root, "") << "no snapshots, no tier";
  TrainerOptions files_only = options;
  files_only.snapshot_in_memory = false;
  EXPECT_EQ(plan(files_only).snapshot_memory_root, "");
  // By time too: a positive number of seconds, and a tier for it as for steps.
  TrainerOptions timed;
  timed.snapshot_every_n_seconds = 600;
  EXPECT_EQ(plan(timed).snapshot_memory_root, "/dev/shm");
  EXPECT_NE(plan(timed).describe().find("about every 600 s into"), std::string::npos) << plan(timed).describe();
  timed.snapshot_every_n_seconds = 0;
  EXPECT_NE(error_of(timed).find("snapshot_every_n_seconds=0 must be > 0. HINT:"), std::string::npos);
  options.snapshot_every_n_steps = 0;
  EXPECT_NE(error_of(options).find("snapshot_every_n_steps=0 must be >= 1. HINT: leave it unset"), std::string::npos);
  options.snapshot_every_n_steps = 5;
  options.snapshots_to_keep = 3;
  options.snapshot_every_n_steps = 5;
  options.snapshots_to_keep = 0;
  EXPECT_NE(error_of(options).find("snapshots_to_keep=0 must be >= 1"), std::string::npos);
}

TEST(RunPlan, MlflowIsOptInAndTakesWhatIsUnsetFromMlflowsVariables) {
  TrainerOptions options;
  options.mlflow = MLFlowOptions{.experiment_name = "mine"};
  const Env::Vars env = {{"MLFLOW_TRACKING_URI", "http://env:5000/"},
                         {"MLFLOW_EXPERIMENT_NAME", "theirs"},
                         {"MLFLOW_TRACKING_TOKEN", "t"}};
  const RunPlan p = plan(options, env);
  ASSERT_TRUE(p.mlflow.has_value());
  EXPECT_EQ(p.mlflow->tracking_uri, "http://env:5000");
  EXPECT_EQ(p.mlflow->experiment_name, "mine");
  EXPECT_EQ(p.mlflow->token, "t");
  EXPECT_NE(p.describe().find("http://env:5000, experiment mine, log_model none"), std::string::npos) << p.describe();
  // The environment alone does not turn MLflow on.
  EXPECT_FALSE(plan({}, env).mlflow.has_value());
  // Set, but no server anywhere.
  EXPECT_NE(error_of(options).find("HINT: pass --mlflow-tracking-uri"), std::string::npos) << error_of(options);
  options.mlflow->tracking_uri = "file:./mlruns";
  EXPECT_NE(error_of(options).find("'file:./mlruns' is not an http(s) server"), std::string::npos);
  // fast_dev_run writes nothing, MLflow included.
  options.mlflow->tracking_uri = "http://h:1";
  options.fast_dev_run = 1;
  EXPECT_FALSE(plan(options).mlflow.has_value());
}

TEST(RunPlan, UnsupportedHardwareSaysWhatIsSupported) {
  EXPECT_NE(error_of({.accelerator = AcceleratorRequest::kGpu}).find("LibTorch without CUDA"), std::string::npos);
  EXPECT_NE(error_of({.accelerator = AcceleratorRequest::kGpu}).find("available: cpu"), std::string::npos);
  EXPECT_NE(error_of({.process_group_backend = ProcessGroupBackend::kNccl}).find("not available in this CPU build"),
            std::string::npos);
  EXPECT_NE(error_of({.devices = 2, .strategy = StrategyRequest::kSingleDevice}).find("strategy='ddp'"),
            std::string::npos);
  EXPECT_NE(error_of({.gpus = DeviceRequest(2)}).find("gpus=2 is not available"), std::string::npos);
  EXPECT_NE(error_of({.gpus = DeviceRequest(2)}).find("available: cpu"), std::string::npos);
  if (!VOLT_TORCH_CPU_FLOAT16) {  // LibTorch 2.4+ runs float16 autocast on CPU
    EXPECT_NE(error_of({.precision = Precision::k16Mixed}).find("HINT: use precision='bf16-mixed'"), std::string::npos);
  }
  EXPECT_NE(error_of({.strategy = StrategyRequest::kDdp, .num_nodes = 2}).find("MASTER_ADDR and MASTER_PORT"),
            std::string::npos);
}

TEST(RunPlan, SeveralDevicesMeanDdpLaunchedByVolt) {
  const RunPlan p = plan({.devices = 3});
  EXPECT_EQ(p.strategy, StrategyKind::kDdp);
  EXPECT_EQ(p.topology.world_size, 3);
  EXPECT_EQ(p.topology.global_rank, 0);
  EXPECT_TRUE(p.launch_local_processes);
  EXPECT_EQ(p.num_threads, 8 / 3);  // the cores are shared among the node's processes
  EXPECT_EQ(p.topology.host, "host0");
}

TEST(RunPlan, FsdpShardsGradientsAndStateByDefaultAndFullShardTakesAWrappingPolicy) {
  const RunPlan sharded = plan({.devices = 2, .strategy = StrategyRequest::kFsdp});
  EXPECT_EQ(sharded.sharding_strategy, ShardingStrategy::kShardGradOp);
  EXPECT_EQ(sharded.fsdp_min_unit_params, 0);
  const RunPlan full = plan({.devices = 2,
                             .strategy = StrategyRequest::kFsdp,
                             .sharding_strategy = ShardingStrategy::kFullShard,
                             .fsdp_min_unit_params = 1000});
  EXPECT_EQ(full.sharding_strategy, ShardingStrategy::kFullShard);
  EXPECT_EQ(full.fsdp_min_unit_params, 1000);
  EXPECT_NE(full.describe().find("volt::FsdpUnit with >= 1000 elements"), std::string::npos) << full.describe();
  // The policy belongs to full_shard alone.
  EXPECT_NE(error_of({.devices = 2,
                      .strategy = StrategyRequest::kFsdp,
                      .sharding_strategy = ShardingStrategy::kShardGradOp,
                      .fsdp_min_unit_params = 10})
                .find("full_shard's wrapping policy"),
            std::string::npos);
  EXPECT_NE(error_of({.devices = 2, .strategy = StrategyRequest::kDdp, .fsdp_min_unit_params = 10})
                .find("an option of strategy='fsdp'"),
            std::string::npos);
  EXPECT_NE(error_of({.devices = 2,
                      .strategy = StrategyRequest::kFsdp,
                      .sharding_strategy = ShardingStrategy::kFullShard,
                      .fsdp_min_unit_params = -1})
                .find("must be >= 0"),
            std::string::npos);
}

TEST(RunPlan, TheAllocatorIsTunedUnlessFullShardWasChosenForMemory) {
  EXPECT_TRUE(plan({}).tune_allocator);
  EXPECT_TRUE(plan({.devices = 2, .strategy = StrategyRequest::kDdp}).tune_allocator);
  EXPECT_TRUE(plan({.devices = 2, .strategy = StrategyRequest::kFsdp}).tune_allocator);  // shard_grad_op
  const TrainerOptions full{
      .devices = 2, .strategy = StrategyRequest::kFsdp, .sharding_strategy = ShardingStrategy::kFullShard};
  EXPECT_FALSE(plan(full).tune_allocator);
  // What the user set wins, both ways.
  TrainerOptions tuned = full;
  tuned.tune_allocator = true;
  EXPECT_TRUE(plan(tuned).tune_allocator);
  TrainerOptions untuned;
  untuned.tune_allocator = false;
  EXPECT_FALSE(plan(untuned).tune_allocator);
}

TEST(RunPlan, DpIsOneProcessWithAReplicaPerDevice) {
  const RunPlan p = plan({.devices = DeviceRequest("0, 1"), .strategy = StrategyRequest::kDp});
  EXPECT_EQ(p.strategy, StrategyKind::kDp);
  EXPECT_EQ(p.replicas_per_process, 2);
  EXPECT_EQ(p.topology.world_size, 1);
  EXPECT_FALSE(p.launch_local_processes);
  EXPECT_EQ(p.num_threads, 4);  // the cores are shared among the replicas
  EXPECT_NE(p.describe().find("replicas per process"), std::string::npos);
  EXPECT_NE(error_of({.devices = 2, .strategy = StrategyRequest::kDp, .num_nodes = 2}).find("strategy='ddp2'"),
            std::string::npos);
  EXPECT_EQ(plan({.gpus = DeviceRequest(0), .strategy = StrategyRequest::kDp}).accelerator,
            Accelerator::kCpu);  // gpus=0: the CPU
}

TEST(RunPlan, Ddp2RanksAndWorldSizeCountNodes) {
  const RunPlan p = plan({.devices = 2, .strategy = StrategyRequest::kDdp2, .num_nodes = 2},
                         {{"NODE_RANK", "1"}, {"MASTER_ADDR", "10.1.1.1"}, {"MASTER_PORT", "5555"}});
  EXPECT_EQ(p.strategy, StrategyKind::kDdp2);
  EXPECT_EQ(p.replicas_per_process, 2);
  EXPECT_EQ(p.topology.world_size, 2);
  EXPECT_EQ(p.topology.global_rank, 1);
  EXPECT_EQ(p.topology.processes_per_node, 1);
  EXPECT_FALSE(p.launch_local_processes);  // one process per node: nothing to launch
}

TEST(RunPlan, LaunchedChildrenReadTheirRankAndDoNotLaunchAgain) {
  const RunPlan p = plan({.devices = 2}, {{"LOCAL_RANK", "1"},
                                          {"NODE_RANK", "0"},
                                          {"WORLD_SIZE", "2"},
                                          {"MASTER_ADDR", "127.0.0.1"},
                                          {"MASTER_PORT", "4444"}});
  EXPECT_FALSE(p.launch_local_processes);
  EXPECT_EQ(p.topology.global_rank, 1);
  EXPECT_EQ(p.topology.main_port, 4444);
}

TEST(RunPlan, TwoNodesUnderALocalLauncherTakeTheNodeRankFromTheEnvironment) {
  const RunPlan p = plan({.devices = 2, .strategy = StrategyRequest::kDdp, .num_nodes = 2},
                         {{"NODE_RANK", "1"}, {"MASTER_ADDR", "10.1.1.1"}, {"MASTER_PORT", "5555"}});
  EXPECT_EQ(p.topology.world_size, 4);
  EXPECT_EQ(p.topology.global_rank, 2);
  EXPECT_EQ(p.topology.node_rank, 1);
  EXPECT_TRUE(p.launch_local_processes);
  EXPECT_EQ(p.topology.main_address, "10.1.1.1");
}

Env::Vars slurm_step(int procid) {
  return {{"SLURM_JOB_ID", "77"},
          {"SLURM_JOB_NAME", "train"},
          {"SLURM_NTASKS", "4"},
          {"SLURM_NNODES", "2"},
          {"SLURM_NTASKS_PER_NODE", "2"},
          {"SLURM_PROCID", std::to_string(procid)},
          {"SLURM_LOCALID", std::to_string(procid % 2)},
          {"SLURM_NODEID", std::to_string(procid / 2)},
          {"SLURM_JOB_NODELIST", "node[1-2]"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_STEP_NUM_TASKS", "4"}};
}

TEST(RunPlan, MaxRestartsMakesTheStartedProcessASupervisorAndItsWorkersTrain) {
  TrainerOptions options{.devices = 2};
  options.max_restarts = 3;
  const RunPlan supervisor = plan(options);
  EXPECT_TRUE(supervisor.supervises);
  EXPECT_FALSE(supervisor.launch_local_processes) << "the supervisor starts every rank itself";
  EXPECT_EQ(supervisor.topology.world_size, 2);
  const RunPlan worker = plan(options, {{"LOCAL_RANK", "0"},
                                        {"NODE_RANK", "0"},
                                        {"WORLD_SIZE", "2"},
                                        {"MASTER_ADDR", "127.0.0.1"},
                                        {"MASTER_PORT", "4444"},
                                        {"VOLT_RESTART_COUNT", "1"}});
  EXPECT_FALSE(worker.supervises);
  EXPECT_FALSE(worker.launch_local_processes);
  EXPECT_EQ(worker.restart_attempt, 1);
  EXPECT_NE(worker.describe().find("restart attempt"), std::string::npos);

  TrainerOptions two_nodes = options;
  two_nodes.num_nodes = 2;
  EXPECT_NE(error_of(two_nodes, slurm_step(0)).find("HINT: render the job with `volt slurm render --max-restarts N`"),
            std::string::npos);
  options.num_nodes = 2;
  const Env::Vars node_one{{"NODE_RANK", "1"}, {"MASTER_ADDR", "10.1.1.1"}, {"MASTER_PORT", "5555"}};
  EXPECT_NE(error_of(options, node_one).find("restarts the processes of one node only"), std::string::npos)
      << error_of(options, node_one);
  options.num_nodes = 1;
  options.max_restarts = -1;
  EXPECT_NE(error_of(options).find("max_restarts=-1 must be >= 0"), std::string::npos);
}

TEST(RunPlan, SlurmTasksAreJoinedNotLaunched) {
  const RunPlan p = plan({.devices = 2, .num_nodes = 2}, slurm_step(3));
  EXPECT_EQ(p.cluster, ClusterKind::kSlurm);
  EXPECT_FALSE(p.launch_local_processes);
  EXPECT_EQ(p.topology.global_rank, 3);
  EXPECT_EQ(p.topology.node_rank, 1);
  EXPECT_EQ(p.topology.main_address, "node1");
  EXPECT_EQ(p.topology.expected_host(2), "node2");
}

TEST(RunPlan, Ddp2UnderSlurmWantsOneTaskPerNode) {
  try {
    plan({.devices = 2, .strategy = StrategyRequest::kDdp2, .num_nodes = 2}, slurm_step(0));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--ntasks-per-node=1"), std::string::npos) << e.what();
  }
}

TEST(RunPlan, SlurmAllocationMismatchesSayWhatToChange) {
  const std::string devices = [] {
    try {
      plan({.devices = 4, .num_nodes = 2}, slurm_step(0));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  }();
  EXPECT_NE(devices.find("--ntasks-per-node=4"), std::string::npos) << devices;
  EXPECT_NE(devices.find("SLURM_NTASKS=4"), std::string::npos) << devices;
  auto batch_shell = slurm_step(0);
  batch_shell.erase("SLURM_STEP_ID");
  batch_shell.erase("SLURM_STEP_NUM_TASKS");
  try {
    plan({.devices = 2, .num_nodes = 2}, batch_shell);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("srun"), std::string::npos) << e.what();
  }
}

// ---- CUDA plans, resolved for a machine with GPUs that a CUDA build would report ----------------

MachineInfo gpu_machine(int64_t gpus) {
  MachineInfo m = kMachine;
  m.gpus = gpus;
  m.cuda_build = true;
  return m;
}

RunPlan gpu_plan(const TrainerOptions& options, int64_t gpus, Env::Vars env = {}) {
  return resolve_run_plan(options, Env(std::move(env)), gpu_machine(gpus));
}

std::string gpu_error(const TrainerOptions& options, int64_t gpus, Env::Vars env = {}) {
  try {
    gpu_plan(options, gpus, std::move(env));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RunPlanCuda, AutoUsesEveryVisibleGpuWithDdpAndNccl) {
  const RunPlan p = gpu_plan({}, 4);
  EXPECT_EQ(p.accelerator, Accelerator::kCuda);
  EXPECT_EQ(p.devices, 4);
  EXPECT_EQ(p.strategy, StrategyKind::kDdp);
  EXPECT_EQ(p.process_group_backend, ProcessGroupBackend::kNccl);
  EXPECT_TRUE(p.launch_local_processes);
  EXPECT_EQ(p.cuda_devices, std::vector<int64_t>({0}));
  EXPECT_EQ(p.root_device(), c10::Device(c10::DeviceType::CUDA, 0));
  EXPECT_EQ(p.child_env.at("CUDA_VISIBLE_DEVICES"), "0,1,2,3");
  EXPECT_EQ(p.child_env.at("CUDA_DEVICE_ORDER"), "PCI_BUS_ID");
  EXPECT_NE(p.describe().find("cuda:0"), std::string::npos);
  // The CPU stays available on a GPU machine, and Gloo on GPUs when asked for.
  EXPECT_EQ(gpu_plan({.accelerator = AcceleratorRequest::kCpu}, 4).root_device(), c10::Device(c10::DeviceType::CPU));
  EXPECT_EQ(gpu_plan({.process_group_backend = ProcessGroupBackend::kGloo}, 2).process_group_backend,
            ProcessGroupBackend::kGloo);
}

TEST(RunPlanCuda, SeedDocumentGpuRequestsSelectDevices) {
  const RunPlan one = gpu_plan({.gpus = DeviceRequest(1)}, 4);
  EXPECT_EQ(one.strategy, StrategyKind::kSingleDevice);
  EXPECT_EQ(one.cuda_devices, std::vector<int64_t>({0}));
  const RunPlan listed = gpu_plan({.gpus = DeviceRequest("1, 3"), .strategy = StrategyRequest::kDdp}, 4);
  EXPECT_EQ(listed.devices, 2);
  EXPECT_EQ(listed.cuda_devices, std::vector<int64_t>({1}));  // rank 0 of the selection
  EXPECT_EQ(listed.child_env.at("CUDA_VISIBLE_DEVICES"), "1,3");
  const RunPlan single = gpu_plan({.accelerator = AcceleratorRequest::kGpu, .devices = DeviceRequest({2})}, 4);
  EXPECT_EQ(single.root_device(), c10::Device(c10::DeviceType::CUDA, 2));
  EXPECT_TRUE(single.child_env.empty());
  EXPECT_EQ(gpu_plan({.gpus = DeviceRequest(-1), .strategy = StrategyRequest::kDp}, 3).replicas_per_process, 3);
}

TEST(RunPlanCuda, DpAndDdp2DriveTheNodesGpusFromOneProcess) {
  const RunPlan dp = gpu_plan({.gpus = DeviceRequest(2), .strategy = StrategyRequest::kDp}, 2);
  EXPECT_EQ(dp.cuda_devices, std::vector<int64_t>({0, 1}));
  EXPECT_EQ(dp.replicas_per_process, 2);
  EXPECT_EQ(dp.topology.world_size, 1);
  const RunPlan ddp2 = gpu_plan({.gpus = DeviceRequest(2), .strategy = StrategyRequest::kDdp2, .num_nodes = 2}, 2,
                                {{"NODE_RANK", "1"}, {"MASTER_ADDR", "10.1.1.1"}, {"MASTER_PORT", "5555"}});
  EXPECT_EQ(ddp2.cuda_devices, std::vector<int64_t>({0, 1}));
  EXPECT_EQ(ddp2.topology.world_size, 2);
  EXPECT_EQ(ddp2.process_group_backend, ProcessGroupBackend::kNccl);
}

TEST(RunPlanCuda, SlurmTasksKeepTheGpusSlurmGaveThem) {
  // --gpus-per-task=1: each task sees only its own GPU, as device 0.
  const RunPlan bound = gpu_plan({.gpus = DeviceRequest(2), .num_nodes = 2}, 1, slurm_step(3));
  EXPECT_EQ(bound.cuda_devices, std::vector<int64_t>({0}));
  EXPECT_TRUE(bound.child_env.empty());
  // --gres=gpu:2 without binding: each task sees the node's GPUs and takes its local rank's.
  const RunPlan shared = gpu_plan({.gpus = DeviceRequest(2), .num_nodes = 2}, 2, slurm_step(3));
  EXPECT_EQ(shared.cuda_devices, std::vector<int64_t>({1}));
  EXPECT_TRUE(shared.child_env.empty());
}

TEST(RunPlanCuda, RequestsTheMachineCannotServeSayWhatIsAvailable) {
  EXPECT_NE(gpu_error({.accelerator = AcceleratorRequest::kGpu}, 0).find("sees none"), std::string::npos);
  EXPECT_NE(gpu_error({.gpus = DeviceRequest(4)}, 2).find("sees 2"), std::string::npos);
  EXPECT_NE(
      gpu_error({.accelerator = AcceleratorRequest::kGpu, .devices = DeviceRequest({5})}, 2).find("CUDA device 5"),
      std::string::npos);
  EXPECT_NE(gpu_error({.accelerator = AcceleratorRequest::kCpu, .process_group_backend = ProcessGroupBackend::kNccl}, 2)
                .find("accelerator is cpu"),
            std::string::npos);
}

TEST(RunPlanCuda, SixteenBitMixedRunsOnGpus) {
  EXPECT_EQ(gpu_plan({.gpus = DeviceRequest(1), .precision = Precision::k16Mixed}, 1).precision, Precision::k16Mixed);
  const RunPlan amp = gpu_plan({.gpus = DeviceRequest(2), .strategy = StrategyRequest::kDp, .use_amp = true}, 2);
  EXPECT_EQ(amp.precision, Precision::k16Mixed);  // dp + 16-bit: the seed documents' Lightning could not
  ASSERT_EQ(amp.notes.size(), 1u);
}

TEST(RunPlan, OverfitBatchesReplacesTheTrainAndValLimitsOnly) {
  const RunPlan p = plan({.limit_test_batches = 5, .overfit_batches = 3});
  EXPECT_TRUE(p.overfit_batches);
  EXPECT_EQ(p.limit_train_batches.to_string(), "3");
  EXPECT_EQ(p.limit_val_batches.to_string(), "3");
  EXPECT_EQ(p.limit_test_batches.to_string(), "5") << "test and predict keep theirs, as in Lightning";
  EXPECT_EQ(p.limit_predict_batches.to_string(), "1.0");
  EXPECT_TRUE(p.notes.empty()) << "no limit of the user's was replaced";
  EXPECT_NE(p.describe().find("overfit_batches         3 (no shuffling)"), std::string::npos) << p.describe();

  const RunPlan fraction = plan({.overfit_batches = 0.01});
  EXPECT_TRUE(fraction.limit_train_batches.is_fraction());
  EXPECT_EQ(fraction.limit_val_batches.fraction(), 0.01);
}

TEST(RunPlan, OverfitBatchesSaysWhichLimitsItReplaced) {
  const RunPlan p = plan({.limit_train_batches = 0.5, .overfit_batches = 4});
  ASSERT_EQ(p.notes.size(), 1u);
  EXPECT_EQ(p.notes[0], "overfit_batches=4 replaced limit_train_batches=0.5, as in Lightning");
}

TEST(RunPlan, OverfitBatchesZeroIsOffAsInLightning) {
  for (const BatchLimit& off : {BatchLimit(0), BatchLimit(0.0)}) {
    const RunPlan p = plan({.limit_train_batches = 7, .overfit_batches = off});
    EXPECT_FALSE(p.overfit_batches);
    EXPECT_EQ(p.limit_train_batches.to_string(), "7");
  }
  EXPECT_FALSE(plan({}).overfit_batches);
}

TEST(RunPlan, OverfitBatchesWinsOverFastDevRunsLimits) {
  const RunPlan p = plan({.fast_dev_run = 1, .overfit_batches = 6});
  EXPECT_EQ(p.limit_train_batches.to_string(), "6");
  EXPECT_EQ(p.max_steps, 1) << "fast_dev_run still stops after its steps";
}

TEST(RunPlan, MinStepsIsKeptAndCheckedAgainstMaxSteps) {
  EXPECT_EQ(plan({}).min_steps, 0);
  EXPECT_EQ(plan({.min_steps = 50}).min_steps, 50);
  EXPECT_EQ(plan({.max_steps = 50, .min_steps = 50}).min_steps, 50);
  std::string message = error_of({.max_steps = 10, .min_steps = 20});
  EXPECT_NE(message.find("min_steps=20 is more than max_steps=10"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
  message = error_of({.min_steps = -1});
  EXPECT_NE(message.find("min_steps=-1 must be >= 0"), std::string::npos) << message;
}

TEST(RunPlan, DeterministicModesAndAnomalyDetectionAreKept) {
  EXPECT_EQ(plan({}).deterministic, DeterministicMode::kOff);
  EXPECT_EQ(plan({.deterministic = true}).deterministic, DeterministicMode::kOn);
  const RunPlan warn = plan({.detect_anomaly = true, .deterministic = "warn"});
  EXPECT_EQ(warn.deterministic, DeterministicMode::kWarn);
  EXPECT_TRUE(warn.detect_anomaly);
  EXPECT_NE(warn.describe().find("deterministic           warn"), std::string::npos) << warn.describe();
  EXPECT_FALSE(plan({}).detect_anomaly);
}

TEST(RunPlan, ModelSummaryDepthZeroTurnsTheSummaryOff) {
  EXPECT_TRUE(plan({}).enable_model_summary);
  EXPECT_EQ(plan({}).model_summary_max_depth, 1);
  EXPECT_EQ(plan({.model_summary_max_depth = -1}).model_summary_max_depth, -1);
  EXPECT_FALSE(plan({.model_summary_max_depth = 0}).enable_model_summary);
  EXPECT_FALSE(plan({.enable_model_summary = false, .model_summary_max_depth = 3}).enable_model_summary);
  const std::string message = error_of({.model_summary_max_depth = -2});
  EXPECT_NE(message.find("model_summary_max_depth=-2 is invalid"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
}

TEST(RunPlan, OutOfRangeValuesAreErrors) {
  EXPECT_NE(error_of({.overfit_batches = 1.5}).find("overfit_batches=1.5 is out of range"), std::string::npos);
  EXPECT_NE(error_of({.limit_train_batches = 1.5}).find("limit_train_batches=1.5"), std::string::npos);
  EXPECT_NE(error_of({.accumulate_grad_batches = 0}).find("accumulate_grad_batches=0"), std::string::npos);
  EXPECT_NE(error_of({.val_check_interval = 0}).find("HINT"), std::string::npos);
  EXPECT_NE(error_of({.max_epochs = -2}).find("max_epochs=-2"), std::string::npos);
  EXPECT_NE(error_of({.max_steps = -2}).find("max_steps=-2"), std::string::npos);
  EXPECT_NE(error_of({.devices = 0}).find("devices=0 asks for no devices"), std::string::npos);
  EXPECT_NE(error_of({.num_nodes = 0}).find("HINT"), std::string::npos);
}

TEST(RunPlan, MalformedThreadEnvironmentNamesTheVariable) {
  try {
    plan({}, {{"OMP_NUM_THREADS", "many"}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("OMP_NUM_THREADS='many'"), std::string::npos);
  }
}

// ---- precision ----------------------------------------------------------------------------------

TEST(RunPlan, PrecisionIsKeptAndDescribed) {
  EXPECT_EQ(plan({.precision = Precision::kBf16Mixed}).precision, Precision::kBf16Mixed);
  EXPECT_EQ(plan({.precision = Precision::kBf16True}).precision, Precision::kBf16True);
  EXPECT_EQ(plan({.precision = Precision::k64True}).precision, Precision::k64True);
  EXPECT_NE(plan({.precision = Precision::kBf16Mixed}).describe().find("bf16-mixed (autocast to bfloat16)"),
            std::string::npos);
}

#if !VOLT_TORCH_CPU_FLOAT16
TEST(RunPlan, UseAmpBecomes16MixedWhichCpuRefusesNamingBf16Mixed) {
  const std::string message = error_of({.use_amp = true});
  EXPECT_NE(message.find("use_amp=true became precision='16-mixed'"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT: use precision='bf16-mixed'"), std::string::npos) << message;
}

TEST(RunPlan, AmpLevelMapsToTheNearestNativeMode) {
  EXPECT_NE(error_of({.use_amp = true, .amp_level = AmpLevel::kO2}).find("amp_level='O2' became precision='16-mixed'"),
            std::string::npos);
  EXPECT_NE(error_of({.use_amp = true, .amp_level = AmpLevel::kO3}).find("HINT: use precision='bf16-true'"),
            std::string::npos);
}
#endif

TEST(RunPlan, AmpLevelO0IsFullPrecisionWithANote) {
  const RunPlan p = plan({.use_amp = true, .amp_level = AmpLevel::kO0});
  EXPECT_EQ(p.precision, Precision::k32True);
  ASSERT_EQ(p.notes.size(), 1u);
  EXPECT_EQ(p.notes[0], "amp_level='O0' became precision='32-true'");
  EXPECT_NE(p.describe().find("amp_level='O0' became"), std::string::npos);
}

TEST(RunPlan, AmpLevelWithoutAmpIsIgnoredAsInLightning) {
  const RunPlan p = plan({.amp_level = AmpLevel::kO1});
  EXPECT_EQ(p.precision, Precision::k32True);
  ASSERT_EQ(p.notes.size(), 1u);
  EXPECT_NE(p.notes[0].find("ignored"), std::string::npos);
}

TEST(RunPlan, UseAmpKeepsAnExplicitMixedPrecisionAndRefuses64) {
  const RunPlan p = plan({.precision = Precision::kBf16Mixed, .use_amp = true});
  EXPECT_EQ(p.precision, Precision::kBf16Mixed);
  EXPECT_TRUE(p.notes.empty());
  EXPECT_NE(error_of({.precision = Precision::k64True, .use_amp = true}).find("conflicts"), std::string::npos);
}

}  // namespace
}  // namespace volt
