#include "volt/options/trainer_flags.h"

#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <vector>

#include "volt/core/edit_distance.h"
#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/loggers/mlflow_rest.h"
#include "volt/options/cli_config.h"
#include "volt/options/run_main.h"

namespace volt {
namespace {

const char* bool_text(bool value) { return value ? "true" : "false"; }

/// --tune-allocator's value: the flag gives "true", its negation "false"; `--tune-allocator=X` and
/// a config file may say yes/no, on/off or 1/0 as for any flag. Anything else is an error.
bool parse_tune_allocator(const std::string& text) {
  if (const std::optional<bool> value = parse_switch_word(text)) return *value;
  throw Error(
      fmt::format("tune_allocator='{}' is not a switch; expected true or false. HINT: pass --tune-allocator or "
                  "--no-tune-allocator, or leave both out (on, except under strategy='fsdp' with full_shard).",
                  text));
}

/// A CLI11 check that runs one of Volt's parsers: on the command line its volt::Error ends the
/// run as before (exit 1); in a config file it is reported with the file and the key. Empty text
/// is what --print-config writes for an unset option (`gpus: ''`): it keeps the default.
CLI::Validator parsed_by(std::function<void(const std::string&)> parse) {
  return CLI::Validator(
      [parse = std::move(parse)](std::string& text) {
        if (!text.empty()) parse(text);
        return std::string();
      },
      "");
}

/// What --print-config and TrainerOptions::config show for a Trainer flag that was not given:
/// the TrainerOptions value it stands for (the text flags' variables are empty until given,
/// and CLI11 cannot read a flag's bool), and checks that name the config key of a bad value.
void describe_trainer_flags(CLI::App& app, const TrainerOptions& o) {
  const std::map<std::string, std::function<std::string()>> resolved = {
      {"--accelerator", [&o] { return std::string(to_string(o.accelerator)); }},
      {"--strategy", [&o] { return std::string(to_string(o.strategy)); }},
      {"--sharding-strategy", [&o] { return o.sharding_strategy ? to_string(*o.sharding_strategy) : ""; }},
      {"--state-dict-type", [&o] { return o.state_dict_type ? to_string(*o.state_dict_type) : ""; }},
      {"--fsdp-min-unit-params",
       [&o] { return o.fsdp_min_unit_params ? std::to_string(*o.fsdp_min_unit_params) : ""; }},
      {"--profiler", [&o] { return o.profiler ? to_string(*o.profiler) : ""; }},
      {"--detect-stragglers", [&o] { return bool_text(o.detect_stragglers); }},
      {"--pipeline-balance", [&o] { return to_string_pipeline_balance(o.pipeline_balance); }},
      {"--pipeline-chunks", [&o] { return o.pipeline_chunks ? std::to_string(*o.pipeline_chunks) : ""; }},
      {"--pipeline-schedule", [&o] { return o.pipeline_schedule ? to_string(*o.pipeline_schedule) : ""; }},
      {"--precision", [&o] { return std::string(to_string(o.precision)); }},
      {"--amp-level", [&o] { return o.amp_level ? std::string(to_string(*o.amp_level)) : ""; }},
      {"--process-group-backend", [&o] { return std::string(to_string(o.process_group_backend)); }},
      {"--requeue-signal", [&o] { return std::string(to_string(o.requeue_signal)); }},
      {"--devices", [&o] { return o.devices.to_string(); }},
      {"--gpus", [&o] { return o.gpus ? o.gpus->to_string() : ""; }},
      {"--num-threads", [&o] { return o.num_threads ? std::to_string(*o.num_threads) : ""; }},
      {"--max-epochs", [&o] { return o.max_epochs ? std::to_string(*o.max_epochs) : ""; }},
      {"--max-steps", [&o] { return o.max_steps ? std::to_string(*o.max_steps) : ""; }},
      {"--max-time", [&o] { return o.max_time ? format_duration(*o.max_time) : ""; }},
      {"--limit-train-batches", [&o] { return o.limit_train_batches.to_string(); }},
      {"--limit-val-batches", [&o] { return o.limit_val_batches.to_string(); }},
      {"--limit-test-batches", [&o] { return o.limit_test_batches.to_string(); }},
      {"--limit-predict-batches", [&o] { return o.limit_predict_batches.to_string(); }},
      {"--val-check-interval", [&o] { return o.val_check_interval.to_string(); }},
      {"--gradient-clip-val", [&o] { return o.gradient_clip_val ? fmt::format("{}", *o.gradient_clip_val) : ""; }},
      {"--gradient-clip-algorithm", [&o] { return std::string(to_string(o.gradient_clip_algorithm)); }},
      {"--seed", [&o] { return o.seed ? std::to_string(*o.seed) : ""; }},
      {"--find-unused-parameters", [&o] { return bool_text(o.find_unused_parameters); }},
      {"--sync-batchnorm", [&o] { return bool_text(o.sync_batchnorm); }},
      {"--use-distributed-sampler", [&o] { return bool_text(o.use_distributed_sampler); }},
      {"--tune-allocator", [&o] { return o.tune_allocator ? std::string(bool_text(*o.tune_allocator)) : ""; }},
      {"--deterministic", [&o] { return std::string(o.deterministic.to_string()); }},
      {"--overfit-batches", [&o] { return o.overfit_batches ? o.overfit_batches->to_string() : ""; }},
      {"--detect-anomaly", [&o] { return bool_text(o.detect_anomaly); }},
      {"--logger", [&o] { return bool_text(o.logger); }},
      {"--enable-progress-bar", [&o] { return bool_text(o.enable_progress_bar); }},
      {"--enable-checkpointing", [&o] { return bool_text(o.enable_checkpointing); }},
      {"--enable-model-summary", [&o] { return bool_text(o.enable_model_summary); }},
      {"--auto-requeue", [&o] { return bool_text(o.auto_requeue); }},
      {"--checkpoint-on-sigterm", [&o] { return bool_text(o.checkpoint_on_sigterm); }},
      {"--mlflow-tracking-uri", [&o] { return o.mlflow ? o.mlflow->tracking_uri.value_or("") : ""; }},
      {"--mlflow-experiment-name", [&o] { return o.mlflow ? o.mlflow->experiment_name.value_or("") : ""; }},
      {"--mlflow-log-model", [&o] { return o.mlflow ? std::string(to_string(o.mlflow->log_model)) : ""; }},
  };
  for (const auto& [name, value] : resolved) {
    CLI::Option* option = app.get_option_no_throw(name);
    VOLT_INTERNAL_ASSERT(option != nullptr, "add_trainer_flags lost {}", name);
    // Shown by --help now; --print-config captures it again after parsing.
    option->default_function(value)->capture_default_str();
  }
  for (const char* name : {"--limit-train-batches", "--limit-val-batches", "--limit-test-batches",
                           "--limit-predict-batches", "--val-check-interval", "--overfit-batches"}) {
    app.get_option(name)->check(
        parsed_by([name = std::string(name)](const std::string& text) { BatchLimit::parse(text, name); }));
  }
  app.get_option("--max-time")->check(parsed_by([](const std::string& text) { parse_duration(text, "--max-time"); }));
  app.get_option("--devices")->check(parsed_by([](const std::string& text) { (void)DeviceRequest(text); }));
  app.get_option("--gpus")->check(parsed_by([](const std::string& text) { (void)DeviceRequest(text); }));
  app.get_option("--accelerator")->check(parsed_by([](const std::string& text) { parse_accelerator_request(text); }));
  app.get_option("--strategy")->check(parsed_by([](const std::string& text) { parse_strategy_request(text); }));
  app.get_option("--sharding-strategy")->check(parsed_by([](const std::string& text) {
    parse_sharding_strategy(text);
  }));
  app.get_option("--state-dict-type")->check(parsed_by([](const std::string& text) { parse_state_dict_type(text); }));
  app.get_option("--profiler")->check(parsed_by([](const std::string& text) { parse_profiler_kind(text); }));
  app.get_option("--mlflow-tracking-uri")->check(parsed_by([](const std::string& text) {
    (void)mlflow::normalize_tracking_uri(text);
  }));
  app.get_option("--mlflow-log-model")->check(parsed_by([](const std::string& text) { parse_log_model(text); }));
  app.get_option("--pipeline-balance")->check(parsed_by([](const std::string& text) { parse_pipeline_balance(text); }));
  app.get_option("--pipeline-schedule")->check(parsed_by([](const std::string& text) {
    parse_pipeline_schedule(text);
  }));
  app.get_option("--precision")->check(parsed_by([](const std::string& text) { parse_precision(text); }));
  app.get_option("--amp-level")->check(parsed_by([](const std::string& text) { parse_amp_level(text); }));
  app.get_option("--process-group-backend")->check(parsed_by([](const std::string& text) {
    parse_process_group_backend(text);
  }));
  app.get_option("--requeue-signal")->check(parsed_by([](const std::string& text) { parse_requeue_signal(text); }));
  app.get_option("--deterministic")->check(parsed_by([](const std::string& text) { parse_deterministic_mode(text); }));
  app.get_option("--gradient-clip-algorithm")->check(parsed_by([](const std::string& text) {
    parse_gradient_clip_algorithm(text);
  }));
  app.get_option("--num-threads")->check(parsed_by([](const std::string& text) {
    const auto threads = parse_int(text);
    VOLT_CHECK(!threads || *threads >= 0,
               "--num-threads={} must be >= 1, or 0 for automatic. HINT: leave --num-threads out to use "
               "OMP_NUM_THREADS, SLURM_CPUS_PER_TASK or the cores divided among the node's processes.",
               text);
  }));
  app.get_option("--tune-allocator")->check(parsed_by([](const std::string& text) { parse_tune_allocator(text); }));
  app.get_option("--seed")->check(parsed_by([](const std::string& text) {
    const auto seed = parse_int(text);
    VOLT_CHECK(!seed || *seed >= 0,
               "--seed={} must be >= 0. HINT: leave --seed out for an unseeded run; -1 does not mean unseeded.", text);
  }));
  app.get_option("--gradient-clip-val")->check(parsed_by([](const std::string& text) {
    char* end = nullptr;
    const double value = std::strtod(text.c_str(), &end);
    VOLT_CHECK(end == text.c_str() || value >= 0.0,
               "--gradient-clip-val={} must be >= 0. HINT: leave --gradient-clip-val out (or pass 0) to not clip; -1 "
               "does not mean off.",
               text);
  }));
}

}  // namespace

void add_trainer_flags(CLI::App& app, TrainerOptions& o, TrainerFlagText& t) {
  add_config_flags(app);
  // The group is the config section: these flags are the keys under `trainer:`.
  const std::string previous_group = app.option_defaults()->get_group();
  app.option_defaults()->group(kTrainerGroup);
  // The enum flags' values come from the enums' lists, so a new value shows in --help by itself.
  app.add_option("--accelerator", t.accelerator,
                 names_or(kAcceleratorRequests) + " (alias cuda); auto: the GPUs when any is visible");
  app.add_option("--devices", t.devices, "devices per node: a count, -1, auto, or a list 0,1");
  app.add_option("--gpus", t.gpus, "CUDA devices (the seed documents' name): a count, -1, or a list 0,1");
  app.add_option("--strategy,--distributed-backend", t.strategy,
                 names_or(kStrategyRequests) + " (--distributed-backend: the old name)");
  app.add_option("--sharding-strategy", t.sharding_strategy,
                 "fsdp: " + names_or(kShardingStrategies) +
                     "; default shard_grad_op; full_shard also shards the parameters of the volt::FsdpUnit layers");
  app.add_option("--fsdp-min-unit-params", t.fsdp_min_unit_params,
                 "fsdp full_shard: a volt::FsdpUnit with fewer parameter elements is not a unit of its own "
                 "(default 0)");
  app.add_option("--state-dict-type", t.state_dict_type,
                 "fsdp: " + names_or(kStateDictTypes) +
                     ": checkpoints' optimizer state gathered into one file (full, default) or a file per process");
  app.add_option("--pipeline-balance", t.pipeline_balance,
                 "pipeline: layers per stage (e.g. 2,1,3), or auto (measured on the first batch)");
  app.add_option("--pipeline-chunks", t.pipeline_chunks, "pipeline: micro-batches per batch (default 8)");
  app.add_option(
      "--pipeline-schedule", t.pipeline_schedule,
      "pipeline: " + names_or(kPipelineSchedules) + ", the micro-batches' order in Pipe::train_step (default gpipe)");
  app.add_flag("--find-unused-parameters", o.find_unused_parameters, "ddp: allow parameters without gradients");
  app.add_flag("--sync-batchnorm", o.sync_batchnorm, "ddp: BatchNorm statistics over the global batch (SyncBatchNorm)");
  app.add_option("--bucket-cap-mb", o.bucket_cap_mb, "ddp: gradient bucket size in MiB")->capture_default_str();
  app.add_option("--process-group-backend", t.process_group_backend,
                 "ddp: " + names_or(kProcessGroupBackends) + "; auto: nccl on GPUs, gloo on CPUs");
  app.add_option("--process-group-timeout", o.process_group_timeout, "ddp: seconds a collective may wait")
      ->capture_default_str();
  app.add_option("--join-timeout", o.join_timeout, "ddp: seconds to wait for every rank to join")
      ->capture_default_str();
  app.add_flag("--use-distributed-sampler,--replace-sampler-ddp,!--no-distributed-sampler", o.use_distributed_sampler,
               "shard the loaders across processes (default on)");
  app.add_option("--precision", t.precision,
                 names_or(kPrecisions) + " (aliases 32, 64, 16 for 16-mixed, bf16 for bf16-mixed)");
  app.add_flag("--use-amp", o.use_amp, "seed documents: precision 16-mixed (prints what it became)");
  app.add_option("--amp-level", t.amp_level,
                 "seed documents: apex level " + names_or(kAmpLevels) + " (mapped to a precision)");
  app.add_option("--num-nodes,--nb-gpu-nodes", o.num_nodes, "nodes in the job (--nb-gpu-nodes: the old name)")
      ->capture_default_str();
  app.add_option("--num-threads", t.num_threads, "intra-op threads per process (0 or unset: automatic)");
  // Unset is a third state (the plan decides), so it prints as null: a word flag, like --deterministic.
  app.add_flag("--tune-allocator,!--no-tune-allocator", t.tune_allocator,
               "pin glibc malloc thresholds (unset: on, except under fsdp full_shard)")
      ->type_name("true|false");
  app.add_option("--max-epochs", t.max_epochs, "stop after this many epochs (-1: no limit)");
  app.add_option("--min-epochs", o.min_epochs, "train at least this many epochs")->capture_default_str();
  app.add_option("--max-steps", t.max_steps, "stop after this many optimizer steps (-1 or unset: no limit)");
  app.add_option("--min-steps", o.min_steps, "train at least this many optimizer steps")->capture_default_str();
  app.add_option("--max-time", t.max_time, "stop training after this long, saving last.ckpt: DD:HH:MM:SS or seconds");
  app.add_option("--limit-train-batches", t.limit_train_batches,
                 "batches per epoch: a count (10) or a fraction (0.25)");
  app.add_option("--limit-val-batches", t.limit_val_batches, "validation batches: a count or a fraction");
  app.add_option("--limit-test-batches", t.limit_test_batches, "test batches: a count or a fraction");
  app.add_option("--limit-predict-batches", t.limit_predict_batches, "predict batches: a count or a fraction");
  app.add_option("--fast-dev-run", o.fast_dev_run, "run N batches of each stage once, writing nothing")
      ->capture_default_str();
  app.add_option("--overfit-batches", t.overfit_batches,
                 "train and validate on these batches only, unshuffled: a count (10) or a fraction (0.01); 0: off");
  app.add_option("--val-check-interval", t.val_check_interval, "validate every fraction of an epoch or N batches");
  app.add_option("--check-val-every-n-epoch", o.check_val_every_n_epoch, "validate every N epochs")
      ->capture_default_str();
  app.add_option("--num-sanity-val-steps", o.num_sanity_val_steps, "validation batches before training (-1: all)")
      ->capture_default_str();
  app.add_option("--reload-dataloaders-every-n-epochs", o.reload_dataloaders_every_n_epochs,
                 "ask for new loaders every N epochs (0: never)")
      ->capture_default_str();
  app.add_option("--accumulate-grad-batches", o.accumulate_grad_batches, "batches per optimizer step")
      ->capture_default_str();
  app.add_option("--gradient-clip-val", t.gradient_clip_val, "clip gradients to this value");
  app.add_option("--gradient-clip-algorithm", t.gradient_clip_algorithm, names_or(kGradientClipAlgorithms));
  app.add_option("--seed", t.seed, "seed LibTorch and the loaders");
  // A flag that also takes a word: --deterministic, --deterministic=false, --deterministic=warn. Its
  // type name lists the words, which config files (cli_config) accept for it.
  app.add_flag("--deterministic", t.deterministic,
               "use deterministic algorithms only (=warn: where they exist, warning about the rest)")
      ->type_name("true|false|warn");
  app.add_flag("--detect-anomaly", o.detect_anomaly, "run fit in autograd's anomaly mode (slow; finds NaN sources)");
  app.add_option("--default-root-dir", o.default_root_dir, "where logs and checkpoints go (default: .)");
  app.add_option("--log-every-n-steps", o.log_every_n_steps, "log step metrics every N steps")->capture_default_str();
  app.add_option("--profiler", t.profiler,
                 names_or(kProfilerKinds) +
                     "; simple: time per action, a table per stage; pytorch: also a Chrome trace of a few steps");
  app.add_option("--profiler-wait", o.profiler_wait, "profiler=pytorch: steps skipped before tracing")
      ->capture_default_str();
  app.add_option("--profiler-warmup", o.profiler_warmup, "profiler=pytorch: steps traced and thrown away")
      ->capture_default_str();
  app.add_option("--profiler-active", o.profiler_active, "profiler=pytorch: steps traced and kept")
      ->capture_default_str();
  app.add_flag("--detect-stragglers,!--no-detect-stragglers", o.detect_stragglers,
               "ddp: name a process persistently slower than the others (default on)");
  app.add_option("--straggler-every-n-steps", o.straggler_every_n_steps, "ddp: batches between straggler checks")
      ->capture_default_str();
  app.add_option("--straggler-threshold", o.straggler_threshold,
                 "ddp: how much slower than the others' median a straggler is (0.2: 20%)")
      ->capture_default_str();
  app.add_flag("--logger,!--no-logger", o.logger,
               "write TensorBoard and CSV logs when no logger is given (default on)");
  app.add_option("--mlflow-tracking-uri", t.mlflow_tracking_uri,
                 "also log to this MLflow tracking server, http://HOST:PORT (or MLFLOW_TRACKING_URI with "
                 "--mlflow-experiment-name)");
  app.add_option("--mlflow-experiment-name", t.mlflow_experiment_name,
                 "the MLflow experiment (default: MLFLOW_EXPERIMENT_NAME, else lightning_logs)");
  app.add_option("--mlflow-log-model", t.mlflow_log_model,
                 "checkpoints uploaded to MLflow: none, end (the kept ones, when fit ends) or all (each as saved)");
  app.add_flag("--enable-progress-bar,!--no-progress-bar", o.enable_progress_bar, "show progress (default on)");
  app.add_flag("--enable-checkpointing,!--no-checkpointing", o.enable_checkpointing, "save checkpoints (default on)");
  app.add_flag("--enable-model-summary,!--no-model-summary", o.enable_model_summary,
               "print the model summary (default on)");
  app.add_option("--model-summary-max-depth", o.model_summary_max_depth,
                 "submodule levels the summary lists (-1: all, 0: no summary)")
      ->capture_default_str();
  app.add_option("--ckpt-path", o.ckpt_path, "resume from last, best or a checkpoint file");
  app.add_flag("--auto-requeue,!--no-auto-requeue", o.auto_requeue,
               "SLURM: on the requeue signal save an HPC checkpoint and requeue the job (default on)");
  app.add_option("--requeue-signal", t.requeue_signal,
                 "SLURM: the requeue signal, " + names_or(kRequeueSignals) + " (with or without SIG, or its number)");
  app.add_flag("--checkpoint-on-sigterm,!--no-checkpoint-on-sigterm", o.checkpoint_on_sigterm,
               "SLURM: save an HPC checkpoint on SIGTERM before stopping (default on)");
  app.add_option("--hpc-checkpoint-dir", o.hpc_checkpoint_dir, "where HPC checkpoints go (default: the root dir)");
  app.add_option("--hpc-checkpoints-to-keep", o.hpc_checkpoints_to_keep, "HPC checkpoints kept")->capture_default_str();
  app.add_option("--snapshot-every-n-steps", o.snapshot_every_n_steps,
                 "save a snapshot every N optimizer steps in the background; a restarted run resumes from the newest");
  app.add_option("--snapshot-every-n-seconds", o.snapshot_every_n_seconds,
                 "also save a snapshot about every T seconds (turned into steps at the pace between snapshots)");
  app.add_option("--snapshots-to-keep", o.snapshots_to_keep, "snapshots kept")->capture_default_str();
  app.add_flag("--snapshot-in-memory,!--no-snapshot-in-memory", o.snapshot_in_memory,
               "also keep the newest snapshot in node-local shared memory, read first by a restart (default on)");
  app.add_flag(
      "--snapshot-peer-copy", o.snapshot_peer_copy,
      "on several nodes, also keep the newest snapshot in the next node's shared memory (survives a lost node)");
  app.add_flag("--skip-snapshot-when-busy", o.skip_snapshot_when_busy,
               "skip a snapshot that comes due while the previous one is still being written (default: wait)");
  app.add_flag("--async-checkpointing", o.async_checkpointing,
               "write ModelCheckpoint's checkpoints in the background too (rank 0, or sharded every process, copies "
               "the state and goes on)");
  app.add_option("--max-restarts", o.max_restarts,
                 "Volt's own launcher: start the processes again after one fails, up to N times (torchrun's name)")
      ->capture_default_str();
  app.option_defaults()->group(previous_group);
  take_last_when_repeated(app, kTrainerGroup);
  describe_trainer_flags(app, o);
}

std::optional<int> parse_command_line(CLI::App& app, int argc, const char* const* argv) {
  take_last_when_repeated(app);
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::ParseError& error) {
    const int code = app.exit(error);
    if (code == 0) return 0;
    std::vector<std::string> known;
    for (const CLI::Option* option : app.get_options()) {
      for (const std::string& name : option->get_lnames()) known.push_back("--" + name);
    }
    // What CLI11 could not place: unknown flags, and the values that followed them.
    for (const std::string& arg : app.remaining()) {
      if (arg.rfind("--", 0) != 0) continue;
      const std::string flag = arg.substr(0, arg.find('='));
      const std::string guess = closest_name(flag, known);
      if (!guess.empty()) std::cerr << "HINT: " << flag << ": did you mean " << guess << "?\n";
    }
    return kExitUsage;
  }
}

void take_last_when_repeated(CLI::App& app, const std::string& group) {
  for (CLI::Option* option : app.get_options()) {
    // Lists (expected_max above 1) keep every value given.
    if ((group.empty() || option->get_group() == group) && option->get_items_expected_max() <= 1)
      option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }
}

void apply_trainer_flags(const TrainerFlagText& t, TrainerOptions& o) {
  if (!t.limit_train_batches.empty())
    o.limit_train_batches = BatchLimit::parse(t.limit_train_batches, "--limit-train-batches");
  if (!t.limit_val_batches.empty()) o.limit_val_batches = BatchLimit::parse(t.limit_val_batches, "--limit-val-batches");
  if (!t.limit_test_batches.empty())
    o.limit_test_batches = BatchLimit::parse(t.limit_test_batches, "--limit-test-batches");
  if (!t.limit_predict_batches.empty())
    o.limit_predict_batches = BatchLimit::parse(t.limit_predict_batches, "--limit-predict-batches");
  if (!t.val_check_interval.empty())
    o.val_check_interval = BatchLimit::parse(t.val_check_interval, "--val-check-interval");
  if (!t.overfit_batches.empty()) o.overfit_batches = BatchLimit::parse(t.overfit_batches, "--overfit-batches");
  if (!t.deterministic.empty()) o.deterministic = Deterministic(t.deterministic);
  if (!t.tune_allocator.empty()) o.tune_allocator = parse_tune_allocator(t.tune_allocator);
  if (!t.accelerator.empty()) o.accelerator = parse_accelerator_request(t.accelerator);
  if (!t.strategy.empty()) o.strategy = parse_strategy_request(t.strategy);
  if (!t.sharding_strategy.empty()) o.sharding_strategy = parse_sharding_strategy(t.sharding_strategy);
  if (!t.state_dict_type.empty()) o.state_dict_type = parse_state_dict_type(t.state_dict_type);
  if (t.fsdp_min_unit_params) o.fsdp_min_unit_params = *t.fsdp_min_unit_params;
  if (!t.profiler.empty()) o.profiler = parse_profiler_kind(t.profiler);
  if (!t.pipeline_balance.empty()) o.pipeline_balance = parse_pipeline_balance(t.pipeline_balance);
  if (!t.precision.empty()) o.precision = parse_precision(t.precision);
  if (!t.amp_level.empty()) o.amp_level = parse_amp_level(t.amp_level);
  if (!t.process_group_backend.empty()) o.process_group_backend = parse_process_group_backend(t.process_group_backend);
  if (!t.requeue_signal.empty()) o.requeue_signal = parse_requeue_signal(t.requeue_signal);
  if (!t.devices.empty()) o.devices = DeviceRequest(t.devices);
  if (!t.gpus.empty()) o.gpus = DeviceRequest(t.gpus);
  if (!t.gradient_clip_algorithm.empty())
    o.gradient_clip_algorithm = parse_gradient_clip_algorithm(t.gradient_clip_algorithm);
  if (!t.mlflow_tracking_uri.empty() || !t.mlflow_experiment_name.empty() || !t.mlflow_log_model.empty()) {
    MLFlowOptions mlflow = o.mlflow.value_or(MLFlowOptions{});
    if (!t.mlflow_tracking_uri.empty()) mlflow.tracking_uri = t.mlflow_tracking_uri;
    if (!t.mlflow_experiment_name.empty()) mlflow.experiment_name = t.mlflow_experiment_name;
    if (!t.mlflow_log_model.empty()) mlflow.log_model = parse_log_model(t.mlflow_log_model);
    o.mlflow = mlflow;
  }
  if (t.max_epochs) o.max_epochs = *t.max_epochs;
  if (t.pipeline_chunks) o.pipeline_chunks = *t.pipeline_chunks;
  if (!t.pipeline_schedule.empty()) o.pipeline_schedule = parse_pipeline_schedule(t.pipeline_schedule);
  if (t.max_steps) o.max_steps = *t.max_steps;
  if (!t.max_time.empty()) o.max_time = parse_duration(t.max_time, "--max-time");
  if (t.num_threads) {
    VOLT_CHECK(*t.num_threads >= 0,
               "--num-threads={} must be >= 1, or 0 for automatic. HINT: leave --num-threads out to use "
               "OMP_NUM_THREADS, SLURM_CPUS_PER_TASK or the cores divided among the node's processes.",
               *t.num_threads);
    // 0 is the flag's old "automatic", still written in configs from earlier --print-config runs.
    o.num_threads = *t.num_threads == 0 ? std::nullopt : t.num_threads;
  }
  if (t.seed) {
    VOLT_CHECK(*t.seed >= 0,
               "--seed={} must be >= 0. HINT: leave --seed out for an unseeded run; -1 does not mean unseeded.",
               *t.seed);
    o.seed = static_cast<uint64_t>(*t.seed);
  }
  if (t.gradient_clip_val) {
    VOLT_CHECK(*t.gradient_clip_val >= 0.0,
               "--gradient-clip-val={} must be >= 0. HINT: leave --gradient-clip-val out (or pass 0) to not clip; -1 "
               "does not mean off.",
               *t.gradient_clip_val);
    o.gradient_clip_val = *t.gradient_clip_val;
  }
}

}  // namespace volt
