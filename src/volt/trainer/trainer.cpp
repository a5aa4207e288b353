#include "volt/trainer/trainer.h"

#include <fmt/format.h>

#include <filesystem>

#include "volt/callbacks/model_checkpoint.h"
#include "volt/checkpoint/checkpointer.h"
#include "volt/checkpoint/hpc_checkpoints.h"
#include "volt/checkpoint/snapshot_memory.h"
#include "volt/checkpoint/weight_source.h"
#include "volt/core/console.h"
#include "volt/core/error.h"
#include "volt/distributed/subprocess_launcher.h"
#include "volt/distributed/supervisor.h"
#include "volt/environments/requeue.h"
#include "volt/loops/evaluation_loop.h"
#include "volt/loops/fit_loop.h"
#include "volt/loops/metric_router.h"
#include "volt/loops/prediction_loop.h"
#include "volt/loops/stage_profile.h"
#include "volt/module/result_collection.h"
#include "volt/nn/sync_batch_norm.h"
#include "volt/plan/process_setup.h"
#include "volt/precision/precision_plugin.h"
#include "volt/profiler/profiler.h"
#include "volt/progress/progress_bar.h"
#include "volt/strategies/strategy_factory.h"
#include "volt/trainer/stage_context.h"
#include "volt/trainer/stage_setup.h"

namespace volt {
namespace {

/// The stage's profiler as the plan asks (timing only when it asks for none).
Profiler make_profiler(const RunPlan& plan) {
  return Profiler(plan.profiler, plan.profiler_wait, plan.profiler_warmup, plan.profiler_active);
}

/// Where the trace of `stage` goes in `dir`, one file per process.
std::string trace_path(const RunPlan& plan, const char* stage, const std::string& dir) {
  return stage_profile_path(dir, "trace", stage, plan.topology.global_rank, ".json");
}

/// Rethrows `e` with `message`, keeping its type (and so the exit code run_main maps it to).
[[noreturn]] void rethrow_with_message(const std::exception& e, const std::string& message) {
  if (dynamic_cast<const CheckpointError*>(&e)) throw CheckpointError(message);
  if (dynamic_cast<const Error*>(&e)) throw Error(message);
  if (dynamic_cast<const InternalError*>(&e)) throw InternalError(message);
  throw std::runtime_error(message);
}

/// After a fit that a SLURM requeue signal stopped: rank 0 requeues the job. Every rank has
/// returned from its last collective; the requeue ends this run at once (SIGTERM now, SIGKILL
/// after KillWait), so it is the very last thing rank 0 does. A failed requeue turns `result`
/// into an interruption whose HPC checkpoint is kept.
FitResult requeue_job(FitResult result, const RunPlan& plan, Console& console, internal::StopSignalGuard& signals) {
  // SIGTERM is ignored from here on: SLURM sends it to a process that only has to exit.
  internal::RequeueSignalGuard::clear();
  signals.ignore_sigterm_after();
  if (!plan.is_global_zero()) return result;
  const RequeueOutcome outcome = requeue_slurm_job(plan.requeue.job_id);
  if (outcome.ok) {
    console.info(fmt::format("Requeued SLURM job {} ({}); it resumes from {}", plan.requeue.job_id, outcome.command,
                             result.hpc_checkpoint_path));
    return result;
  }
  console.warn(
      fmt::format("`{}` failed: {}\nThe HPC checkpoint {} is saved; resubmit the job to resume from it. "
                  "HINT: allow requeueing (#SBATCH --requeue), or set auto_requeue=false to stop on the "
                  "signal without requeueing.",
                  outcome.command, outcome.output, result.hpc_checkpoint_path));
  result.reason = StopReason::kInterrupted;
  result.message = "requeue failed: " + outcome.output;
  return result;
}

}  // namespace

Trainer::Trainer(TrainerOptions options) : Trainer(std::move(options), Env::from_process(), MachineInfo::current()) {}

Trainer::Trainer(TrainerOptions options, const Env& env, const MachineInfo& machine)
    : options_(std::move(options)),
      plan_(resolve_run_plan(options_, env, machine)),
      env_(env),
      checkpointer_(std::make_unique<Checkpointer>()),
      precision_(make_precision_plugin(plan_.precision, device_type(plan_.accelerator))),
      console_(make_stdio_console()) {
  // Now, not in fit: SLURM's signal kills a process that does not catch it, and it may come
  // while the program is still loading its data. The guard restores the previous handler when
  // the Trainer goes.
  if (plan_.requeue.enabled) requeue_guard_ = std::make_unique<internal::RequeueSignalGuard>(plan_.requeue.signal);
  // Lightning's seed_everything, so a module built after the Trainer starts from the same
  // weights every run (each stage seeds again before it runs).
  if (plan_.seed) torch::manual_seed(*plan_.seed);
}

Trainer::~Trainer() {
  // Unwinding from a failure: on_failure already stopped the other processes, and the error on
  // its way up is the one to report.
  if (std::uncaught_exceptions() > 0 || torn_down_) return;
  try {
    teardown();
  } catch (const std::exception& e) {
    // Nothing is left to throw to; the program should have called teardown() to see this. Not
    // rank_console(): the failure is this process's own, and no other process reports it.
    console_->warn(fmt::format("the Trainer's teardown failed, and a destructor cannot throw: {}", e.what()));
  }
}

void Trainer::teardown() {
  torn_down_ = true;
  if (strategy_) strategy_->teardown();
}

std::shared_ptr<Console> Trainer::rank_console() const { return only_on_global_zero(console_, plan_.is_global_zero()); }

void Trainer::set_console(std::shared_ptr<Console> console) {
  VOLT_CHECK(console != nullptr, "set_console got a null Console. HINT: pass volt::make_stdio_console() or your own.");
  console_ = std::move(console);
}

Strategy& Trainer::strategy() {
  VOLT_CHECK(
      !plan_.supervises,
      "this process supervises the run's worker processes (max_restarts={}), which ran the whole program "
      "including what follows fit(); it holds no trained model. HINT: return from main when FitResult::supervised "
      "is true.",
      plan_.max_restarts);
  // Made by the first stage that needs it, so a Trainer that never runs one picks no port.
  if (!strategy_) {
    // An injected fault that strikes before this rank joins: the others wait for it in vain.
    if (plan_.fault && plan_.fault->at == FaultPoint::kRendezvous && plan_.fault->rank == plan_.topology.global_rank) {
      rank_console()->warn(
          fmt::format("VOLT_INJECT_FAULT: rank {} kills itself before joining the process group.", plan_.fault->rank));
      die_of_injected_fault();
    }
    strategy_ = make_strategy(plan_, env_, rank_console());
  }
  return *strategy_;
}

void Trainer::set_checkpoint_io(std::shared_ptr<CheckpointIO> io) { checkpointer_->set_io(std::move(io)); }

template <typename Run>
auto Trainer::report_failures(Run&& run) {
  // The console replaced by set_console() is the one the notes go to, so print them here.
  if (!notes_printed_) {
    notes_printed_ = true;
    const std::shared_ptr<Console> out = rank_console();
    for (const auto& note : plan_.notes) out->info("Note: " + note);
  }
  try {
    return run();
  } catch (const std::exception& e) {
    if (plan_.topology.world_size == 1) throw;
    // Name the first failure of the run once, instead of every rank's secondary error.
    rethrow_with_message(e, strategy().on_failure(e.what()));
  }
}

template <typename Body>
auto Trainer::run_stage(LightningModule& module, Stage stage, Body&& body) {
  // Only fit seeds: evaluation does not reseed the program's generator.
  const internal::ProcessSettingsScope settings(plan_, /*seed=*/stage == Stage::kFit);
  Strategy& strategy = this->strategy();
  strategy.setup_environment(module);
  // A fresh fit starts at epoch 0; restore() moves the loop's progress to the checkpoint's.
  if (stage == Stage::kFit) fitted_ = FitProgress{};
  const std::shared_ptr<Console> console = rank_console();
  internal::StageView view(strategy, plan_.root_device(), console, fitted_);
  const RunViewScope viewing(module, &view);
  const std::vector<std::shared_ptr<Callback>> callbacks = internal::with_module_callbacks(options_.callbacks, module);
  internal::StageCallbacks hooks(callbacks, module, fitted_, callback_metrics_, strategy);
  internal::StageContext context{
      .strategy = strategy, .console = console, .view = view, .callbacks = callbacks, .hooks = hooks};
  module.setup(stage);
  return internal::run_then_teardown(
      [&] {
        // The fit loop tells its own callbacks of an error, with the fit's state in their context.
        if (stage == Stage::kFit) return body(context);
        return hooks.run([&] { return body(context); });
      },
      [&] { module.teardown(stage); });
}

template <typename Run>
auto Trainer::with_data_module(LightningModule& module, DataModule& data, Stage stage, Run&& run) {
  report_failures([&] {
    strategy().setup_environment(module);
    if (runs_prepare_data(data, plan_.topology.local_rank, plan_.topology.global_rank)) data.prepare_data();
    // The other processes read what prepare_data wrote: none goes on before it is complete.
    strategy().collectives().barrier();
    data.setup(stage);
  });
  return internal::run_then_teardown(std::forward<Run>(run), [&] { data.teardown(stage); });
}

FitResult Trainer::supervise_fit() {
  const auto start = std::chrono::steady_clock::now();
  // A stop signal ends the wait and is passed on to the workers, which stop at their next batch.
  internal::StopSignalGuard signals;
  SupervisorOptions options{.topology = plan_.topology,
                            .command = own_command_line(),
                            .env = env_,
                            .child_env = plan_.child_env,
                            .max_restarts = plan_.max_restarts,
                            .stop_requested = [] { return internal::StopSignalGuard::received(); },
                            .snapshot_dir = plan_.hpc_checkpoint_dir};
  const SupervisedRun run = supervise_workers(options, *rank_console());
  FitResult result;
  result.supervised = true;
  result.restarts = run.restarts;
  if (run.stopped_by != 0) result.reason = StopReason::kInterrupted;
  result.message = fmt::format("supervised {} worker process{} ({} restart{})", plan_.topology.world_size,
                               plan_.topology.world_size == 1 ? "" : "es", run.restarts, run.restarts == 1 ? "" : "s");
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

FitResult Trainer::fit(LightningModule& module, DataLoader train, DataLoader val, std::string ckpt_path) {
  if (plan_.supervises) return supervise_fit();
  std::vector<DataLoader> vals;
  if (val.defined()) vals.push_back(std::move(val));
  return fit_stage(module, std::move(train), std::move(vals), ckpt_path);
}

EvalResult Trainer::validate(LightningModule& module, DataLoader val, const std::string& ckpt_path) {
  std::vector<DataLoader> loaders;
  if (val.defined()) loaders.push_back(std::move(val));
  return evaluate(module, std::move(loaders), ckpt_path, /*test=*/false);
}

EvalResult Trainer::test(LightningModule& module, DataLoader test, const std::string& ckpt_path) {
  std::vector<DataLoader> loaders;
  if (test.defined()) loaders.push_back(std::move(test));
  return evaluate(module, std::move(loaders), ckpt_path, /*test=*/true);
}

FitResult Trainer::fit(LightningModule& module, DataModule& data, std::string ckpt_path) {
  if (plan_.supervises) return supervise_fit();
  return with_data_module(module, data, Stage::kFit, [&] { return fit_stage(module, {}, {}, ckpt_path, &data); });
}

EvalResult Trainer::validate(LightningModule& module, DataModule& data, const std::string& ckpt_path) {
  return with_data_module(module, data, Stage::kValidate,
                          [&] { return evaluate(module, data.val_dataloaders(), ckpt_path, /*test=*/false); });
}

EvalResult Trainer::test(LightningModule& module, DataModule& data, const std::string& ckpt_path) {
  return with_data_module(module, data, Stage::kTest,
                          [&] { return evaluate(module, data.test_dataloaders(), ckpt_path, /*test=*/true); });
}

std::vector<torch::Tensor> Trainer::predict(LightningModule& module, DataModule& data, const std::string& ckpt_path) {
  return with_data_module(module, data, Stage::kPredict,
                          [&] { return predict(module, data.predict_dataloader(), ckpt_path); });
}

LastCheckpointSearch Trainer::last_search(const std::string& log_dir,
                                          const std::vector<std::shared_ptr<Callback>>& callbacks) const {
  LastCheckpointSearch search;
  search.root_dir = plan_.root_dir;
  if (const ModelCheckpoint* checkpoint = internal::first_model_checkpoint(callbacks)) {
    search.checkpoint_dir = checkpoint->options().dirpath;
  }
  // This run's version folder is new and empty; its siblings hold the earlier runs.
  if (!log_dir.empty()) search.logs_dir = std::filesystem::path(log_dir).parent_path().string();
  search.version = plan_.requeue.job_id;
  return search;
}

void Trainer::load_weights(LightningModule& module, const std::string& ckpt_path) {
  const std::shared_ptr<Console> console_ptr = rank_console();
  Console& console = *console_ptr;
  const std::string path = checkpointer_->resolve(ckpt_path, last_search("", options_.callbacks), console);
  if (!path.empty()) load_module_weights(checkpointer_->load(path), module, path);
}

std::optional<LoadedCheckpoint> Trainer::resume_point(const std::string& ckpt_path, const std::string& log_dir,
                                                      const std::vector<std::shared_ptr<Callback>>& callbacks,
                                                      Collectives& collectives, Console& console) {
  // A run that starts again resumes where it stopped: the newest HPC checkpoint or snapshot wins
  // over ckpt_path, which a job script passes again on every restart (Lightning's order).
  // But not from a finished run's files, unless this is a restart of that run (its program
  // failed after the fit): a new launch in the same folder starts anew. Every process reads the
  // marker; where the folder is not shared, only rank 0's node has resume files to pass over.
  std::optional<LoadedCheckpoint> resume;
  const std::string& hpc_dir = plan_.hpc_checkpoint_dir;
  const std::optional<RunBoundary> boundary = read_run_boundary(hpc_dir);
  const int64_t set_aside = resume_numbers_set_aside(boundary, plan_.restart_attempt);
  if (!plan_.fast_dev_run) {
    const std::string memory_dir =
        plan_.snapshot_memory_root.empty() ? std::string() : memory_snapshot_dir(plan_.snapshot_memory_root, hpc_dir);
    resume = checkpointer_->newest_resume_checkpoint(hpc_dir, memory_dir, collectives, console, set_aside);
  }
  // options.ckpt_path is fit's default only: validate/test/predict never pick it up implicitly.
  const std::string requested = ckpt_path.empty() ? plan_.ckpt_path : ckpt_path;
  if (boundary && boundary->finished && set_aside > 0 && !plan_.fast_dev_run) {
    // Recorded for this run's restarts, which must not take the finished run's files either.
    if (collectives.rank() == 0) set_aside_finished_run(hpc_dir, set_aside);
    std::vector<std::string> files = list_resume_checkpoints(hpc_dir);
    std::erase_if(files,
                  [&](const std::string& path) { return resume_checkpoint_number(path).value_or(0) > set_aside; });
    if (!files.empty()) {
      console.info(fmt::format(
          "Not resuming from {} ({} snapshot and HPC checkpoint file{} in {}): the run that wrote them finished its "
          "fit. This run starts {}. HINT: to continue that run, pass its last checkpoint or one of those files as "
          "ckpt_path.",
          files.front(), files.size(), files.size() == 1 ? "" : "s", hpc_dir,
          resume              ? "from the newer files"
          : requested.empty() ? "from the beginning"
                              : "from ckpt_path"));
    }
  }
  if (resume) {
    const bool snapshot = is_snapshot_path(resume->path);
    const bool after_finish = boundary && boundary->finished && set_aside == 0 && plan_.restart_attempt > 0;
    console.info(fmt::format(
        "Resuming from {} {}{}{}: {}.", snapshot ? "snapshot" : "HPC checkpoint", resume->path,
        resume->source.empty() ? "" : fmt::format(" ({})", resume->source),
        requested.empty() ? "" : fmt::format(" instead of ckpt_path='{}'", requested),
        after_finish ? fmt::format("restart {} of a run that failed after its fit had finished", plan_.restart_attempt)
        : snapshot   ? "the newest snapshot of a run that did not finish"
                     : "the job was stopped by SLURM and restarted"));
    return resume;
  }
  if (plan_.restart_attempt > 0 && !plan_.fast_dev_run) {
    console.warn(
        fmt::format("Restart {} found no readable snapshot or HPC checkpoint in {}; the fit starts{}.",
                    plan_.restart_attempt, plan_.hpc_checkpoint_dir,
                    requested.empty() ? " from the beginning" : fmt::format(" from ckpt_path='{}'", requested)));
  }
  // The stage's callbacks: a ModelCheckpoint from configure_callbacks names the folder too.
  const std::string path = checkpointer_->resolve(requested, last_search(log_dir, callbacks), console);
  if (!path.empty()) resume = LoadedCheckpoint{path, checkpointer_->load(path)};
  return resume;
}

FitResult Trainer::fit_stage(LightningModule& module, DataLoader train, std::vector<DataLoader> val,
                             const std::string& ckpt_path, DataModule* data) {
  return report_failures([&] {
    // Before the processes join: a stop signal while waiting for them ends the wait (the
    // process group's abort check), and the fit loop polls it for a clean stop.
    internal::StopSignalGuard signals;
    // Before any process starts or joins: every rank refuses the same model the same way.
    internal::refuse_plain_batchnorm(plan_, module);
    FitResult result = run_stage(module, Stage::kFit, [&](internal::StageContext& stage) {
      Strategy& strategy = stage.strategy;
      Console& console = *stage.console;
      internal::configure_fit_model(plan_, module);
      // The layers hold the process group's collectives for this fit only (also when it throws).
      SyncBatchNormScope sync_batchnorm(module, plan_.sync_batchnorm ? &strategy.collectives() : nullptr);
      internal::FitLoaders loaders(module, data, std::move(train), std::move(val));
      const auto count_batches = [&] {
        return internal::count_fit_batches(plan_, console, module, loaders.train(), loaders.val());
      };
      const FitLoaderCounts counts = count_batches();
      const FitLoopConfig loop_config = fit_loop_config(plan_);
      // Before configure_optimizers, whose schedules may span the whole run.
      stage.view.set_estimated_stepping_batches(
          estimated_stepping_batches(loop_config, counts.num_train_batches, [&](int64_t epoch) {
            return accumulate_grad_batches(stage.callbacks, plan_.accumulate_grad_batches, epoch);
          }));
      const OptimizerConfig optimization =
          internal::prepare_training(plan_, module, *precision_, stage.callbacks, strategy, console);

      MetricRouter metrics(callback_metrics_, internal::fit_loggers(options_, plan_, stage.console));
      const std::vector<std::shared_ptr<Callback>> callbacks = internal::fit_callbacks(stage.callbacks, plan_, console);
      const FitInfo info =
          internal::fit_info(plan_, strategy.collectives().broadcast_string(metrics.log_dir()), counts, optimization);
      for (const auto& callback : callbacks) callback->setup(info);
      const std::optional<LoadedCheckpoint> resume =
          resume_point(ckpt_path, info.log_dir, stage.callbacks, strategy.collectives(), console);
      if (!resume) {
        if (const std::shared_ptr<WeightSource> source = module.initial_weights()) {
          internal::load_initial_weights(module, strategy.state_sharding(), *source);
        }
      }

      // The profile and trace go beside the logs (Lightning's trainer.log_dir), else to the root.
      const std::string profile_dir = info.log_dir.empty() ? plan_.root_dir : info.log_dir;
      Profiler profiler = make_profiler(plan_);
      profiler.start_stage("fit", trace_path(plan_, "fit", profile_dir));
      FitLoop loop(loop_config,
                   FitLoopParts{.strategy = strategy,
                                .precision = *precision_,
                                .checkpointer = *checkpointer_,
                                .metrics = metrics,
                                .console = console,
                                .callbacks = callbacks,
                                .profiler = profiler,
                                .config = &options_.config},
                   FitData{.module = module,
                           .train = loaders.train(),
                           .val = loaders.val(),
                           .optimization = optimization,
                           .counts = counts,
                           .reload = [&] {
                             loaders.reload();
                             return count_batches();
                           }});
      stage.view.watch(loop.progress());
      // Only now, with the checkpoint found, read and restored, does the run write into its log
      // folder: a run refused for its ckpt_path, or for a checkpoint that does not fit, leaves no
      // empty version_N behind.
      if (resume) loop.restore(*resume);
      for (const auto& logger : metrics.loggers()) logger->log_hyperparams(module.hparams());
      internal::save_run_config(options_.config, info, metrics.loggers());

      FitResult fit_result = internal::run_fit_loop(loop, strategy, module, plan_.detect_anomaly);
      finish_stage_profile(profiler, strategy, console, profile_dir);
      fitted_ = loop.progress();
      checkpointer_->remember(fit_result.best_model_path, fit_result.last_model_path);
      return fit_result;
    });
    if (result.reason != StopReason::kRequeued) return result;
    return requeue_job(std::move(result), plan_, *rank_console(), signals);
  });
}

EvalResult Trainer::evaluate(LightningModule& module, std::vector<DataLoader> loaders, const std::string& ckpt_path,
                             bool test) {
  const char* name = test ? "test" : "validate";
  return report_failures([&] {
    return run_stage(module, test ? Stage::kTest : Stage::kValidate, [&](internal::StageContext& stage) {
      module.configure_model();
      if (loaders.empty()) loaders = test ? module.test_dataloaders() : module.val_dataloaders();
      VOLT_CHECK(!loaders.empty(),
                 "{}() has no data: {}_dataloader() returned none and none was passed. HINT: override "
                 "{}_dataloader() or pass a volt::DataLoader.",
                 name, test ? "test" : "val", test ? "test" : "val");
      load_weights(module, ckpt_path);
      internal::place_module(module, *precision_, plan_.root_device());
      std::vector<std::optional<int64_t>> batches;
      for (DataLoader& loader : loaders) {
        VOLT_CHECK(loader.defined(), "{}() got an undefined loader among {}. HINT: pass only loaders that have data.",
                   name, loaders.size());
        internal::configure_loader(loader, plan_, /*evaluation=*/true);
        loader.set_epoch(0);
        batches.push_back(internal::batches_to_run(loader, test ? plan_.limit_test_batches : plan_.limit_val_batches,
                                                   test ? "limit_test_batches" : "limit_val_batches"));
      }
      const std::unique_ptr<ProgressBar> bar = make_progress_bar(plan_.shows_progress(), *stage.console);
      ResultCollection results(/*training=*/false);
      Profiler profiler = make_profiler(plan_);
      profiler.start_stage(name, trace_path(plan_, name, plan_.root_dir));
      const EvalCounts counts =
          EvaluationLoop(stage.strategy, *precision_, plan_.root_device(), bar.get(), &stage.hooks, &profiler)
              .run(module, loaders, batches, test ? EvalStage::kTest : EvalStage::kValidation, results);
      finish_stage_profile(profiler, stage.strategy, *stage.console, plan_.root_dir);
      EvalResult out;
      out.stage = name;
      out.batches = counts.batches;
      out.examples = counts.examples;
      out.metrics = results.epoch_metrics(MetricTarget::kCallback);
      // Kept for a later stage's callbacks, as fit's values are; evaluate() logs to no logger.
      for (const auto& [metric, value] : out.metrics) callback_metrics_[metric] = value;
      return out;
    });
  });
}

std::vector<torch::Tensor> Trainer::predict(LightningModule& module, DataLoader data, const std::string& ckpt_path) {
  return report_failures([&] {
    // Under ddp every rank predicts a part and rank 0 gathers them: the stage joins the group.
    return run_stage(module, Stage::kPredict, [&](internal::StageContext& stage) {
      module.configure_model();
      if (!data.defined()) data = module.predict_dataloader();
      VOLT_CHECK(data.defined(),
                 "predict() has no data: predict_dataloader() returned none and none was passed. HINT: override "
                 "predict_dataloader() or pass a volt::DataLoader.");
      load_weights(module, ckpt_path);
      internal::place_module(module, *precision_, plan_.root_device());
      internal::configure_loader(data, plan_, /*evaluation=*/true, /*contiguous=*/true);
      data.set_epoch(0);
      const std::optional<int64_t> batches =
          internal::batches_to_run(data, plan_.limit_predict_batches, "limit_predict_batches");
      // Unsharded loaders (use_distributed_sampler=false) give every rank everything already.
      const bool gather = plan_.use_distributed_sampler && plan_.topology.world_size > 1;
      Profiler profiler = make_profiler(plan_);
      profiler.start_stage("predict", trace_path(plan_, "predict", plan_.root_dir));
      std::vector<torch::Tensor> outputs =
          PredictionLoop(stage.strategy, *precision_, plan_.root_device(), &stage.hooks, &profiler)
              .run(module, data, batches, gather);
      finish_stage_profile(profiler, stage.strategy, *stage.console, plan_.root_dir);
      return outputs;
    });
  });
}

}  // namespace volt
