#include "cli.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <set>
#include <sstream>

#include "job_flags.h"
#include "param_spec.h"
#include "plot.h"
#include "process.h"
#include "project_template.h"
#include "rank_table.h"
#include "sweep_jobs.h"
#include "sweep_status.h"
#include "trainer_shape.h"
#include "volt/core/env.h"
#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/options/run_main.h"
#include "volt/slurm/job_spec.h"
#include "volt/slurm/sweep.h"

namespace volt::tool {
namespace {

namespace fs = std::filesystem;
using Strings = std::vector<std::string>;

/// The flags every job-making subcommand shares besides the job flags.
struct CheckFlags {
  /// Skips check_job (validate still runs when the script is rendered).
  bool no_check = false;
  /// The training program and its arguments, after `--`.
  Strings program;
};

/// The sweep flags of `volt sweep render|submit`.
struct SweepFlags {
  Strings params;
  std::string params_file;
  std::string search = "grid";
  int64_t nb_trials = 0;
  uint64_t seed = 0;
  int64_t max_parallel = 0;
  std::string out;
  bool one_job_per_trial = false;
};

void add_check_flags(CLI::App& app, CheckFlags& flags) {
  app.add_flag("--no-check", flags.no_check,
               "skip the checks of the job against the program's Trainer flags (read with the program's own flag "
               "definitions: --devices, --gpus, --num-nodes, --strategy, --accelerator, --auto-requeue, "
               "--requeue-signal, --config ...)");
  app.add_option("program", flags.program, "the training program and its arguments, after --");
}

std::string read_text(const std::string& path, const std::string& what, const std::string& hint) {
  std::ifstream in(path);
  VOLT_CHECK(in.good(), "{} '{}' cannot be read. HINT: {}", what, path, hint);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  VOLT_CHECK(out.good(), "cannot write '{}'. HINT: check that its directory is writable.", path);
}

void make_dirs(const std::string& path) {
  std::error_code error;
  fs::create_directories(path, error);
  VOLT_CHECK(!error, "cannot create the directory '{}': {}. HINT: check the path and its permissions.", path,
             error.message());
}

void require_program(const Strings& program, const std::string& usage) {
  VOLT_CHECK(!program.empty(),
             "no program given; expected `{} -- <program> <args...>`. HINT: put the training "
             "command after '--', e.g. -- ./train --devices 2 --num-nodes 2.",
             usage);
}

/// Throws one volt::Error listing every problem check_job finds, unless checks are off.
void check_or_throw(const slurm::JobSpec& spec, const Strings& program, bool no_check) {
  if (no_check) return;
  const Strings problems = check_job(spec, program);
  if (problems.empty()) return;
  std::string message = fmt::format("the job '{}' does not fit its program ({} problem{}):", spec.job_name,
                                    problems.size(), problems.size() == 1 ? "" : "s");
  for (const auto& problem : problems) message += "\n  - " + problem;
  message += "\n(pass --no-check to render it anyway)";
  throw Error(message);
}

/// Runs `sbatch --parsable <script>` and returns the job id.
std::string submit_script(const std::string& sbatch, const std::string& script) {
  const ProcessResult result = run_process({sbatch, "--parsable", script});
  VOLT_CHECK(result.exit_code == 0,
             "sbatch rejected '{}' (exit code {}): {}\nHINT: read sbatch's message above; "
             "'volt slurm render' with the same flags shows the script, and --partition, --account or --qos may be "
             "needed on this cluster.",
             script, result.exit_code, trim(result.err + result.out));
  return parse_sbatch_job_id(result.out);
}

// ---- volt slurm render | submit -------------------------------------------------------------

struct SlurmFlags {
  JobFlags job;
  CheckFlags check;
  bool no_ranks = false;
  RankTableOptions ranks;
  std::string script_dir = ".";
  std::string sbatch_command = "sbatch";
};

slurm::JobSpec slurm_job(const SlurmFlags& flags, const std::string& usage) {
  require_program(flags.check.program, usage);
  slurm::JobSpec spec = flags.job.resolve();
  spec.command = flags.check.program;
  check_or_throw(spec, flags.check.program, flags.check.no_check);
  return spec;
}

int slurm_render(const SlurmFlags& flags) {
  const slurm::JobSpec spec = slurm_job(flags, "volt slurm render [job flags]");
  const std::string script = slurm::render_sbatch_script(spec);
  std::string table;
  if (!flags.no_ranks) {
    const auto rows = build_rank_table(spec, flags.ranks);
    table = fmt::format(
        "\n# Ranks srun would start, as volt::detect_cluster reads each task's SLURM variables\n"
        "# (dry run: job id {}, nodes {}; --job-id and --nodelist change them):\n{}",
        flags.ranks.job_id, rows.empty() ? "" : rows.front().env.get_or("SLURM_JOB_NODELIST", ""),
        render_rank_table(rows));
  }
  std::cout << script << table;
  return 0;
}

int slurm_submit(const SlurmFlags& flags) {
  const slurm::JobSpec spec = slurm_job(flags, "volt slurm submit [job flags]");
  const std::string script = slurm::render_sbatch_script(spec);
  make_dirs(flags.script_dir);
  // sbatch does not make the folders of --output and --error, and a job whose log cannot be opened
  // dies at launch without one. Made here, relative to where sbatch runs, unless SLURM expands a
  // pattern in the folder's name.
  for (const std::string& log : {spec.output, spec.error}) {
    const std::string folder = fs::path(log).parent_path().string();
    if (!folder.empty() && folder.find('%') == std::string::npos) make_dirs(folder);
  }
  const std::string path = (fs::path(flags.script_dir) / (spec.job_name + ".sbatch")).string();
  write_text(path, script);
  const std::string job_id = submit_script(flags.sbatch_command, path);
  std::cerr << fmt::format("volt: submitted {} as job {}\n", path, job_id);
  std::cout << job_id << "\n";
  return 0;
}

/// Adds `slurm render` (bound to `render_flags`) and `slurm submit` (to `submit_flags`): each
/// subcommand needs its own JobFlags, which remembers its CLI11 options.
void add_slurm_commands(CLI::App& app, SlurmFlags& render_flags, SlurmFlags& submit_flags,
                        std::function<int()>& action) {
  CLI::App* slurm = app.add_subcommand("slurm", "sbatch job scripts for a Volt Trainer program");
  slurm->require_subcommand(1);

  CLI::App* render = slurm->add_subcommand(
      "render",
      "Print the sbatch script for a program (a dry run: nothing is submitted), checked against the program's "
      "Trainer flags, followed by the table of ranks srun would start (as '#' comment lines, so the output stays a "
      "valid script; --no-ranks leaves them out).");
  render->footer(
      "Example:\n  volt slurm render --nodes 2 --ntasks-per-node 2 --gpus-per-node 2 --time 02:00:00 \\\n"
      "      -- ./train --accelerator gpu --devices 2 --num-nodes 2");
  render_flags.job.add_to(*render);
  add_check_flags(*render, render_flags.check);
  render->add_flag("--no-ranks", render_flags.no_ranks, "leave out the rank table");
  render->add_option("--job-id", render_flags.ranks.job_id, "SLURM_JOB_ID in the rank table")->capture_default_str();
  render->add_option("--nodelist", render_flags.ranks.nodelist,
                     "SLURM_JOB_NODELIST in the rank table, one host per node (default node[1-N])");
  render->callback([&] { action = [&] { return slurm_render(render_flags); }; });

  CLI::App* submit =
      slurm->add_subcommand("submit",
                            "Check and write the sbatch script to <script-dir>/<job-name>.sbatch, submit it with "
                            "'sbatch --parsable' and print the job id.");
  submit->footer(
      "Example:\n  volt slurm submit --nodes 2 --ntasks-per-node 2 --time 02:00:00 --partition gpu \\\n"
      "      -- ./train --devices 2 --num-nodes 2");
  submit_flags.job.add_to(*submit);
  add_check_flags(*submit, submit_flags.check);
  submit->add_option("--script-dir", submit_flags.script_dir, "where the script is written")->capture_default_str();
  submit->add_option("--sbatch-command", submit_flags.sbatch_command, "the sbatch to run")->capture_default_str();
  submit->callback([&] { action = [&] { return slurm_submit(submit_flags); }; });
}

// ---- volt sweep render | submit ---------------------------------------------------------------

struct SweepCommandFlags {
  JobFlags job;
  CheckFlags check;
  SweepFlags sweep;
  std::string sbatch_command = "sbatch";
  std::string volt_executable;
};

/// A rendered sweep: its trials and the script file of each job.
struct RenderedSweep {
  SweepLayout layout;
  std::vector<slurm::Trial> trials;
  /// (script path, trials it runs) per job: one entry for an array, one per trial otherwise.
  std::vector<std::pair<std::string, std::vector<int64_t>>> scripts;
  bool array = true;
};

std::vector<slurm::SweepParameter> sweep_parameters(const SweepFlags& flags) {
  Strings specs = flags.params;
  if (!flags.params_file.empty()) {
    const Strings from_file = param_specs_from_text(
        read_text(flags.params_file, "--params-file", "give a file with one --param spec per line."));
    specs.insert(specs.begin(), from_file.begin(), from_file.end());
  }
  VOLT_CHECK(!specs.empty(),
             "the sweep has no parameters; expected at least one --param NAME=KIND:ARGS, e.g. --param "
             "lr=choice:0.1,0.01. HINT: add --param (repeatable) or --params-file.");
  std::vector<slurm::SweepParameter> parameters;
  for (const auto& spec : specs) parameters.push_back(parse_param_spec(spec));
  return parameters;
}

RenderedSweep render_sweep(const SweepCommandFlags& flags, const std::string& usage) {
  const SweepFlags& sweep = flags.sweep;
  require_program(flags.check.program, usage);
  VOLT_CHECK(!sweep.out.empty(), "no --out; expected the sweep's directory. HINT: add --out sweeps/<name>.");
  const auto parameters = sweep_parameters(sweep);
  const slurm::SearchKind kind = slurm::parse_search_kind(sweep.search);
  RenderedSweep rendered;
  rendered.trials = slurm::expand_sweep(parameters, kind, sweep.nb_trials, sweep.seed);
  const Strings program_problems = check_program_for_sweep(flags.check.program, parameters);
  VOLT_CHECK(program_problems.empty(), "{}", join(program_problems, "\n"));

  rendered.layout.root = fs::absolute(sweep.out).lexically_normal().string();
  while (rendered.layout.root.size() > 1 && rendered.layout.root.back() == '/') rendered.layout.root.pop_back();
  VOLT_CHECK(!fs::exists(rendered.layout.jobs_file()),
             "--out '{}' already holds a submitted sweep ({} exists); rewriting its manifest would change the trials "
             "of jobs that may still run. HINT: choose a new --out, or delete the directory when its jobs are done.",
             sweep.out, rendered.layout.jobs_file());
  SweepJobOptions options{flags.volt_executable, rendered.layout, sweep.max_parallel, flags.check.program};
  const slurm::JobSpec base = flags.job.resolve();

  // Every job is checked before any file is written, so a refused sweep leaves nothing behind.
  std::vector<std::pair<std::string, slurm::JobSpec>> jobs;
  rendered.array = !sweep.one_job_per_trial;
  if (rendered.array) {
    jobs.emplace_back(rendered.layout.root + "/" + base.job_name + ".sbatch",
                      sweep_array_job(base, options, static_cast<int64_t>(rendered.trials.size())));
    std::vector<int64_t> all;
    for (const auto& trial : rendered.trials) all.push_back(trial.index);
    rendered.scripts.emplace_back(jobs.back().first, all);
  } else {
    for (const auto& trial : rendered.trials) {
      slurm::JobSpec spec = trial_job(base, options, trial);
      jobs.emplace_back(rendered.layout.root + "/" + spec.job_name + ".sbatch", spec);
      rendered.scripts.push_back({jobs.back().first, {trial.index}});
    }
  }
  Strings scripts;
  for (const auto& [path, spec] : jobs) {
    check_or_throw(spec, flags.check.program, flags.check.no_check);
    scripts.push_back(slurm::render_sbatch_script(spec));
  }

  make_dirs(rendered.layout.logs_dir());
  write_text(rendered.layout.manifest(), slurm::render_manifest(rendered.trials));
  for (std::size_t i = 0; i < jobs.size(); ++i) write_text(jobs[i].first, scripts[i]);
  return rendered;
}

std::vector<TrialStatus> statuses_of(const std::vector<slurm::Trial>& trials, const std::string& state) {
  std::vector<TrialStatus> out;
  for (const auto& trial : trials) out.push_back({trial, "-", state});
  return out;
}

int sweep_render(const SweepCommandFlags& flags) {
  const RenderedSweep sweep = render_sweep(flags, "volt sweep render [sweep flags] [job flags]");
  for (const auto& [path, indices] : sweep.scripts) {
    std::cout << fmt::format("# ==> {} <==\n", path) << read_text(path, "the script", "") << "\n";
  }
  std::cout << fmt::format("# {} trial(s) in {} ({}; each writes to {}/trial_XXX):\n", sweep.trials.size(),
                           sweep.layout.manifest(), sweep.array ? "one job array" : "one job per trial",
                           sweep.layout.root);
  std::istringstream table(render_status(statuses_of(sweep.trials, "rendered")));
  for (std::string line; std::getline(table, line);) std::cout << "# " << line << "\n";
  return 0;
}

int sweep_submit(const SweepCommandFlags& flags) {
  const RenderedSweep sweep = render_sweep(flags, "volt sweep submit [sweep flags] [job flags]");
  std::vector<JobRecord> records;
  try {
    for (const auto& [path, indices] : sweep.scripts) {
      const std::string job_id = submit_script(flags.sbatch_command, path);
      std::cout << job_id << "\n";
      for (const int64_t index : indices)
        records.push_back({index, sweep.array ? job_id + "_" + std::to_string(index) : job_id});
    }
  } catch (const Error&) {
    // Jobs already submitted must stay findable by `volt sweep status`.
    if (!records.empty()) write_text(sweep.layout.jobs_file(), render_jobs_file(records));
    throw;
  }
  write_text(sweep.layout.jobs_file(), render_jobs_file(records));
  std::cerr << fmt::format("volt: submitted {} trial(s) of {}; see `volt sweep status --out {}`\n", records.size(),
                           sweep.layout.root, sweep.layout.root);
  return 0;
}

/// Adds `sweep render` and `sweep submit`, each bound to its own flags (see add_slurm_commands).
void add_sweep_job_commands(CLI::App& sweep, SweepCommandFlags& render_flags, SweepCommandFlags& submit_flags,
                            std::function<int()>& action) {
  const auto add_sweep_flags = [](CLI::App& app, SweepCommandFlags& flags) {
    SweepFlags& s = flags.sweep;
    const char* group = "Sweep flags";
    app.add_option("--param", s.params,
                   "a swept program flag, repeatable: NAME=choice:A,B | NAME=int_range:LOW:HIGH[:STEP] | "
                   "NAME=float_range:LOW:HIGH:STEP | NAME=uniform:LOW:HIGH | NAME=log_uniform:LOW:HIGH")
        ->expected(1)
        ->allow_extra_args(false)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
        ->type_name("SPEC")
        ->group(group);
    app.add_option("--params-file", s.params_file, "a file of --param specs, one per line ('#' comments)")
        ->group(group);
    app.add_option("--search", s.search, "grid (every combination) or random")->capture_default_str()->group(group);
    app.add_option("--nb-trials", s.nb_trials, "trials of a random search; a grid keeps its first N (0: all)")
        ->capture_default_str()
        ->group(group);
    app.add_option("--seed", s.seed, "the random search's seed")->capture_default_str()->group(group);
    app.add_option("--max-parallel", s.max_parallel, "array tasks running at once, --array=0-N%K (0: no limit)")
        ->capture_default_str()
        ->group(group);
    app.add_option("--out", s.out, "the sweep's directory: manifest.json, scripts, logs/, trial_XXX/, jobs.json")
        ->group(group);
    app.add_flag("--one-job-per-trial", s.one_job_per_trial, "one job per trial instead of one job array")
        ->group(group);
  };

  CLI::App* render = sweep.add_subcommand(
      "render",
      "Expand the trials, write <out>/manifest.json and the job array script (nothing is submitted) and "
      "print the script and the trials. Each array task runs `volt sweep run-trial`.");
  render->footer(
      "Example:\n  volt sweep render --param lr=choice:0.1,0.01 --param layers=int_range:2:4:2 \\\n"
      "      --max-parallel 2 --time 01:00:00 --out sweeps/lr -- ./train --max-epochs 3");
  add_sweep_flags(*render, render_flags);
  render_flags.job.add_to(*render);
  add_check_flags(*render, render_flags.check);
  render->callback([&] { action = [&] { return sweep_render(render_flags); }; });

  CLI::App* submit = sweep.add_subcommand(
      "submit",
      "Render the sweep as `volt sweep render` does, submit its job(s) with 'sbatch --parsable', print the "
      "job id(s) and record each trial's job id in <out>/jobs.json.");
  submit->footer(
      "Example:\n  volt sweep submit --param lr=log_uniform:1e-4:1e-1 --search random --nb-trials 8 \\\n"
      "      --max-parallel 4 --time 01:00:00 --out sweeps/lr -- ./train --max-epochs 3");
  add_sweep_flags(*submit, submit_flags);
  submit_flags.job.add_to(*submit);
  add_check_flags(*submit, submit_flags.check);
  submit->add_option("--sbatch-command", submit_flags.sbatch_command, "the sbatch to run")->capture_default_str();
  submit->callback([&] { action = [&] { return sweep_submit(submit_flags); }; });
}

// ---- volt sweep run-trial | status ------------------------------------------------------------

struct RunTrialFlags {
  std::string manifest;
  std::string out;
  int64_t index = -1;
  CLI::Option* index_option = nullptr;
  Strings program;
};

int sweep_run_trial(const RunTrialFlags& flags) {
  require_program(flags.program, "volt sweep run-trial --manifest M --out DIR");
  const std::string manifest =
      read_text(flags.manifest, "--manifest", "pass the manifest.json that `volt sweep render|submit` wrote.");
  const std::optional<int64_t> given =
      flags.index_option->count() > 0 ? std::optional<int64_t>(flags.index) : std::nullopt;
  const int64_t index = resolve_trial_index(given, Env::from_process());
  const slurm::Trial trial = slurm::trial_from_manifest(manifest, index);
  const std::string root = flags.out.empty() ? fs::absolute(flags.manifest).parent_path().string() : flags.out;
  make_dirs(trial.output_dir(root));
  const Strings argv = run_trial_argv(flags.program, trial, root);
  // The job log shows which trial a task ran and how, before the program's own output.
  std::cerr << fmt::format("volt sweep run-trial: trial {}: {}\n", index, join(argv, " ")) << std::flush;
  exec_process(argv);
}

bool has_files(const std::string& dir) {
  std::error_code error;
  if (!fs::is_directory(dir, error)) return false;
  return fs::directory_iterator(dir, error) != fs::directory_iterator();
}

struct StatusFlags {
  std::string out;
  std::string squeue_command = "squeue";
  std::string scontrol_command = "scontrol";
  std::string sacct_command = "sacct";
};

int sweep_status(const StatusFlags& flags) {
  const SweepLayout layout{flags.out};
  const auto trials = slurm::parse_manifest(
      read_text(layout.manifest(), "the sweep's manifest", "pass the --out that `volt sweep render|submit` wrote."));
  const auto jobs = parse_jobs_file(
      read_text(layout.jobs_file(), "the sweep's jobs file", "it is written by `volt sweep submit`; submit first."),
      layout.jobs_file());
  std::map<int64_t, std::string> job_of;
  std::set<std::string> queried;
  for (const auto& job : jobs) {
    job_of[job.index] = job.job_id;
    queried.insert(split(job.job_id, '_').front());
  }
  std::map<std::string, std::string> queue;
  if (!queried.empty()) {
    try {
      const ProcessResult result = run_process(
          {flags.squeue_command, "-h", "-r", "-o", "%i %T", "-j", join(Strings(queried.begin(), queried.end()), ",")});
      // squeue exits 1 with "Invalid job id" when none of the jobs is known any more.
      if (result.exit_code == 0) queue = parse_squeue(result.out);
    } catch (const Error& e) {
      std::cerr << "volt: " << e.what() << " (states come from scontrol and the trial directories)\n";
    }
  }
  std::vector<TrialStatus> statuses;
  for (const auto& trial : trials) {
    const auto job = job_of.find(trial.index);
    if (job == job_of.end()) {
      statuses.push_back({trial, "-", "not submitted"});
      continue;
    }
    std::optional<std::string> queued;
    if (const auto it = queue.find(job->second); it != queue.end()) queued = it->second;
    std::optional<std::string> known;
    if (!queued) {
      try {
        const ProcessResult result = run_process({flags.scontrol_command, "show", "job", "-o", job->second});
        if (result.exit_code == 0) known = parse_scontrol_state(result.out);
      } catch (const Error&) {
        // No scontrol here: accounting or the trial directory decides.
      }
    }
    // Forgotten by the controller (MinJobAge): accounting, where the cluster keeps it, still
    // knows whether the job COMPLETED or FAILED.
    std::optional<std::string> accounted;
    if (!queued && !known) {
      try {
        const ProcessResult result =
            run_process({flags.sacct_command, "-j", job->second, "-n", "-X", "-P", "-o", "State"});
        if (result.exit_code == 0) accounted = parse_sacct_state(result.out);
      } catch (const Error&) {
        // No sacct here.
      }
    }
    statuses.push_back(
        {trial, job->second, trial_state(queued, known, has_files(trial.output_dir(layout.root)), accounted)});
  }
  std::cout << render_status(statuses);
  return 0;
}

void add_sweep_commands(CLI::App& app, SweepCommandFlags& render_flags, SweepCommandFlags& submit_flags,
                        RunTrialFlags& run_flags, StatusFlags& status_flags, std::function<int()>& action) {
  CLI::App* sweep = app.add_subcommand("sweep", "hyperparameter sweeps as SLURM job arrays (after test_tube)");
  sweep->require_subcommand(1);
  add_sweep_job_commands(*sweep, render_flags, submit_flags, action);

  CLI::App* run = sweep->add_subcommand(
      "run-trial",
      "Run one trial (what each array task runs): read trial --index (default $SLURM_ARRAY_TASK_ID) "
      "from the manifest, create <out>/trial_XXX and exec `<program> <args> <trial flags> "
      "--default-root-dir <out>/trial_XXX`. A requeued task runs the same trial in the same directory, "
      "so it resumes there.");
  run->add_option("--manifest", run_flags.manifest, "the sweep's manifest.json")->required();
  run->add_option("--out", run_flags.out, "the sweep's directory (default: the manifest's)");
  run_flags.index_option = run->add_option("--index", run_flags.index, "the trial (default: $SLURM_ARRAY_TASK_ID)");
  run->add_option("program", run_flags.program, "the training program and its arguments, after --");
  run->callback([&] { action = [&] { return sweep_run_trial(run_flags); }; });

  CLI::App* status =
      sweep->add_subcommand("status",
                            "Print each trial with its job id and SLURM state (squeue, then scontrol, then sacct; a "
                            "job none of them knows is 'ended?' when its trial directory has files, else 'unknown').");
  status->add_option("--out", status_flags.out, "the sweep's directory")->required();
  status->add_option("--squeue-command", status_flags.squeue_command, "the squeue to run")->capture_default_str();
  status->add_option("--sacct-command", status_flags.sacct_command, "the sacct to run")->capture_default_str();
  status->add_option("--scontrol-command", status_flags.scontrol_command, "the scontrol to run")->capture_default_str();
  status->callback([&] { action = [&] { return sweep_status(status_flags); }; });
}

// ---- volt new | plot ----------------------------------------------------------------------------

struct NewFlags {
  std::string dir;
  std::string name;
};

int new_project(const NewFlags& flags, const std::string& self) {
  const std::string name = flags.name.empty() ? project_name_from_dir(flags.dir) : flags.name;
  VOLT_CHECK(project_name_from_dir(name) == name,
             "--name={} is not a usable project name; expected letters, digits and '_', not starting with a digit. "
             "HINT: try --name {}.",
             name, project_name_from_dir(name));
  std::error_code error;
  VOLT_CHECK(!fs::exists(flags.dir, error) || (fs::is_directory(flags.dir, error) && fs::is_empty(flags.dir, error)),
             "'{}' already exists and is not an empty directory; volt new does not overwrite files. HINT: choose a "
             "new directory.",
             flags.dir);
  const std::string prefix = installed_prefix_of(self);
  for (const ProjectFile& file : render_project(name, prefix)) {
    const fs::path path = fs::path(flags.dir) / file.path;
    make_dirs(path.parent_path().string());
    write_text(path.string(), file.text);
  }
  std::cout << fmt::format(
      "volt: created the project {} in {}{}. Build and train it:\n"
      "  cd {}\n"
      "  cmake -S . -B build{}\n"
      "  cmake --build build -j\n"
      "  ./build/{} --config config.yaml\n",
      name, flags.dir, prefix.empty() ? "" : fmt::format(" (finding Volt in {})", prefix), flags.dir,
      prefix.empty() ? "   # add -DCMAKE_PREFIX_PATH=<where Volt is installed> unless it is in /usr or /usr/local" : "",
      name);
  return 0;
}

int plot(const PlotOptions& options) {
  const PlotResult result = plot_metrics(options);
  Strings drawn;
  for (const auto& panel : result.panels) {
    for (const auto& series : panel.series) drawn.push_back(series.name);
  }
  std::cout << fmt::format("volt: wrote {} ({}); redraw it with `gnuplot {}`\n", result.png, join(drawn, ", "),
                           result.script);
  return 0;
}

void add_new_and_plot_commands(CLI::App& app, NewFlags& new_flags, PlotOptions& plot_options, const std::string& self,
                               std::function<int()>& action) {
  CLI::App* create = app.add_subcommand(
      "new",
      "Create a training project in <dir>: a LightningModule (an MLP on Fashion-MNIST, or synthetic data when the "
      "data set is not installed), CMakeLists.txt using find_package(volt), config.yaml and a README.");
  create->footer(
      "Example:\n  volt new my_model && cd my_model && cmake -S . -B build && cmake --build build -j\n"
      "  ./build/my_model --config config.yaml");
  create->add_option("dir", new_flags.dir, "the project's directory (new or empty)")->required();
  create->add_option("--name", new_flags.name, "the program's name (default: the directory's name)");
  create->callback([&] { action = [&] { return new_project(new_flags, self); }; });

  CLI::App* draw = app.add_subcommand(
      "plot",
      "Draw a run's metrics.csv as a PNG with gnuplot: losses and accuracies in separate panels against the "
      "step. Writes the gnuplot script (data inline) beside the PNG.");
  draw->footer(
      "Examples:\n  volt plot lightning_logs/version_0 --out curves.png --metrics train/loss_step,val/acc\n"
      "  volt plot lr_find.csv --x lr --logx --metrics loss --vline 0.003 --out lr_find.png");
  draw->add_option("log_dir", plot_options.log_dir,
                   "a run's log folder (lightning_logs/version_N), a folder holding lightning_logs/, or a CSV file")
      ->required();
  draw->add_option("--out", plot_options.out, "the PNG to write (default: metrics.png beside metrics.csv)");
  draw->add_option("--metrics", plot_options.metrics, "columns to draw, comma-separated (default: every loss and acc)")
      ->delimiter(',');
  draw->add_option("--width", plot_options.width, "the image's width in pixels")->capture_default_str();
  draw->add_option("--height", plot_options.height, "the image's height in pixels (0: 350 per panel)")
      ->capture_default_str();
  draw->add_option("--gnuplot", plot_options.gnuplot, "the gnuplot to run")->capture_default_str();
  draw->add_option("--x", plot_options.x, "the column on the x axis (lr_find.csv: lr)")->capture_default_str();
  draw->add_flag("--logx", plot_options.logx, "a logarithmic x axis");
  draw->add_option("--vline", plot_options.vline, "a dashed vertical line at this x (lr_find's suggestion)");
  draw->callback([&] { action = [&] { return plot(plot_options); }; });
}

// ---- volt checkpoint ... ---------------------------------------------------------------------

/// Runs `volt-checkpoint` from this binary's folder with `args`: reading checkpoints needs
/// LibTorch, which this tool does not link.
[[noreturn]] void run_checkpoint_tool(const Strings& args, const std::string& self) {
  const fs::path tool = fs::path(self).parent_path() / "volt-checkpoint";
  VOLT_CHECK(fs::exists(tool),
             "`volt checkpoint` runs {}, which is missing. HINT: build it (cmake --build build --target "
             "volt-checkpoint) or install Volt (it installs beside volt).",
             tool.string());
  Strings argv{tool.string()};
  argv.insert(argv.end(), args.begin(), args.end());
  exec_process(argv);
}

void add_checkpoint_command(CLI::App& app, Strings& args, const std::string& self, std::function<int()>& action) {
  CLI::App* checkpoint = app.add_subcommand(
      "checkpoint",
      "Convert checkpoints: `volt checkpoint to-safetensors CKPT OUT.safetensors` writes a checkpoint's state_dict "
      "(the model's weights, named as stored) as safetensors; `volt checkpoint to-dcp CKPT DIR` writes it with the "
      "optimizers' state as PyTorch 2.x's distributed checkpoint (dcp.load) reads it. `volt checkpoint --help` lists "
      "the commands.");
  // Everything after `checkpoint`, --help included, is volt-checkpoint's.
  checkpoint->prefix_command();
  checkpoint->set_help_flag();
  checkpoint->callback([&, checkpoint] {
    args = checkpoint->remaining();
    action = [&]() -> int { run_checkpoint_tool(args, self); };
  });
}

/// "volt slurm render": the subcommands CLI11 got, for the HINT after a parse error.
std::string command_path(const CLI::App& app) {
  std::string path = app.get_name();
  const CLI::App* at = &app;
  for (bool deeper = true; deeper;) {
    deeper = false;
    for (const CLI::App* sub : at->get_subcommands()) {
      path += " " + sub->get_name();
      at = sub;
      deeper = true;
      break;
    }
  }
  return path;
}

}  // namespace

int run_volt_tool(int argc, const char* const* argv) {
  CLI::App app(
      "volt: SLURM job scripts and hyperparameter sweeps for Volt Trainer programs, new projects and plots of "
      "their metrics.\n"
      "Job flags map to sbatch options; the program after '--' is checked against them.",
      "volt");
  app.require_subcommand(1);
  app.footer("Run `volt <command> <subcommand> --help` for the flags of each, e.g. `volt slurm render --help`.");
  std::function<int()> action;
  SlurmFlags slurm_render_flags, slurm_submit_flags;
  SweepCommandFlags sweep_render_flags, sweep_submit_flags;
  RunTrialFlags run_flags;
  StatusFlags status_flags;
  NewFlags new_flags;
  PlotOptions plot_options;
  const std::string self = self_executable(argc > 0 ? argv[0] : "volt");
  sweep_render_flags.volt_executable = self;
  sweep_submit_flags.volt_executable = self;
  add_slurm_commands(app, slurm_render_flags, slurm_submit_flags, action);
  add_sweep_commands(app, sweep_render_flags, sweep_submit_flags, run_flags, status_flags, action);
  add_new_and_plot_commands(app, new_flags, plot_options, self, action);
  Strings checkpoint_args;
  add_checkpoint_command(app, checkpoint_args, self, action);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << fmt::format(
        "error: {}\nHINT: run `{} --help` for the flags; put the program and its arguments after "
        "'--'.\n",
        e.what(), command_path(app));
    return kExitUsage;
  }
  // The exit codes of every Volt program: 1 for bad input, 70 for a bug.
  return run_main([&] { return action ? action() : kExitUsage; }, {});
}

}  // namespace volt::tool
