"""The `volt` command-line tool, run as a user runs it (ctest: volt_tool_cli).

SLURM is faked: `sbatch`, `squeue` and `scontrol` are small scripts put first on PATH, so
submit and status are tested without a cluster (tests/slurm submits to a real one).
"""
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

VOLT = os.environ.get("VOLT_TOOL", "")
pytestmark = pytest.mark.skipif(not VOLT, reason="VOLT_TOOL (the volt binary) is not set; run through ctest")


def run(*args, env=None, cwd=None):
    return subprocess.run([VOLT, *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd, timeout=60)


def fake(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def slurm_path(tmp_path):
    """A PATH whose sbatch, squeue and scontrol are fakes that log their arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    fake(bin_dir, "sbatch", f'echo "sbatch $*" >> {log}\necho "4242;cluster"\n')
    # Trial 0 runs, 2 and 3 wait as one unsplit range; 1 is gone from the queue.
    fake(bin_dir, "squeue", f'echo "squeue $*" >> {log}\nprintf "4242_0 RUNNING\\n4242_[2-3%%2] PENDING\\n"\n')
    fake(bin_dir, "scontrol", f'echo "scontrol $*" >> {log}\necho "slurm_load_jobs error: Invalid job id" >&2\nexit 1\n')
    # Accounting still knows 4242_1, which failed; of others it prints nothing.
    fake(bin_dir, "sacct", f'echo "sacct $*" >> {log}\n[ "$2" = 4242_1 ] && echo FAILED\nexit 0\n')
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    return env, log


def test_help_lists_the_subcommands():
    result = run("--help")
    assert result.returncode == 0
    assert "slurm" in result.stdout and "sweep" in result.stdout
    for sub in (["slurm", "render"], ["slurm", "submit"], ["sweep", "render"], ["sweep", "submit"],
                ["sweep", "run-trial"], ["sweep", "status"]):
        assert run(*sub, "--help").returncode == 0, sub


def test_render_prints_the_script_and_the_detected_ranks():
    result = run("slurm", "render", "--job-name", "mnist", "--nodes", "2", "--ntasks-per-node", "2", "--time",
                 "01:00:00", "--module", "cuda/12", "--export", "NCCL_DEBUG=INFO", "--",
                 "./train", "--devices", "2", "--num-nodes", "2")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("#!/bin/bash\n")
    for line in ("#SBATCH --job-name=mnist", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2",
                 "#SBATCH --time=01:00:00", "#SBATCH --signal=USR1@90", "#SBATCH --requeue", "module load cuda/12",
                 "export NCCL_DEBUG=INFO", "srun ./train --devices 2 --num-nodes 2"):
        assert line + "\n" in out, line
    rows = [line.split()[1:] for line in out.splitlines() if line.startswith("# node")]
    assert len(rows) == 4
    port = 15000 + 12345 % 20000  # slurm_main_port of the placeholder job id
    # host, PROCID, LOCALID, NODEID, detected, global, local, node, world, address:port, job id, devices
    assert [r[0] for r in rows] == ["node1", "node1", "node2", "node2"]
    assert [r[5] for r in rows] == ["0", "1", "2", "3"]
    assert [r[6] for r in rows] == ["0", "1", "0", "1"]
    assert [r[7] for r in rows] == ["0", "0", "1", "1"]
    assert {r[4] for r in rows} == {"slurm"}
    assert {r[8] for r in rows} == {"4"}
    assert {r[9] for r in rows} == {f"node1:{port}"}


def test_render_ranks_follow_job_id_nodelist_and_gpus():
    result = run("slurm", "render", "--nodes", "2", "--ntasks-per-node", "2", "--gpus-per-node", "2", "--time", "10",
                 "--job-id", "777", "--nodelist", "gpu[07-08]", "--", "./train", "--accelerator", "gpu",
                 "--devices", "2", "--num-nodes", "2")
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --gres=gpu:2" in result.stdout
    rows = [line.split()[1:] for line in result.stdout.splitlines() if line.startswith("# gpu")]
    assert [r[0] for r in rows] == ["gpu07", "gpu07", "gpu08", "gpu08"]
    assert {r[9] for r in rows} == {f"gpu07:{15000 + 777}"}
    assert {r[11] for r in rows} == {"0,1"}


def test_a_device_mismatch_exits_1_with_the_hint():
    result = run("slurm", "render", "--nodes", "2", "--ntasks-per-node", "2", "--time", "01:00:00", "--",
                 "./train", "--devices", "4", "--num-nodes", "2")
    assert result.returncode == 1
    assert result.stdout == ""
    assert "--ntasks-per-node=2 but the Trainer runs devices=4" in result.stderr
    assert "HINT:" in result.stderr
    # --no-check renders it anyway.
    assert run("slurm", "render", "--no-check", "--nodes", "2", "--ntasks-per-node", "2", "--time", "01:00:00",
               "--", "./train", "--devices", "4", "--num-nodes", "2").returncode == 0


@pytest.mark.parametrize("args, expected", [
    (["slurm", "render", "--nodes", "two", "--", "./train"], "--nodes='two' is not a whole number"),
    (["slurm", "render", "--time", "1:00:00"], "no program given"),
    (["sweep", "render", "--out", "x", "--param", "lr=0.1", "--", "./train"], "has no KIND:"),
    (["sweep", "render", "--out", "x", "--param", "lr=uniform:0:1", "--", "./train"], "grid"),
    (["slurm", "render", "--time", "1", "--", "./train", "--strategy", "dpp"], "strategy='dpp' is not supported"),
    (["slurm", "render", "--time", "1", "--", "./train", "--devices", "many"], "devices='many' is invalid"),
    (["slurm", "render", "--time", "1", "--", "./train", "--requeue-signal", "TERM"], "already stops the run"),
    (["slurm", "render", "--time", "1", "--", "./train", "--config", "missing.yaml"], "missing.yaml"),
    (["slurm", "render", "--nodes", "2", "--time", "1", "--", "./train", "--strategy", "dp", "--devices", "2",
      "--num-nodes", "2"], "strategy='dp' runs one process on one node"),
])
def test_bad_input_exits_1_naming_it_with_a_hint(tmp_path, args, expected):
    result = run(*args, cwd=tmp_path)
    assert result.returncode == 1, result.stdout
    assert expected in result.stderr
    assert "HINT:" in result.stderr


@pytest.mark.parametrize("args, expected", [
    (["slurm", "render", "--time", "1:00:00", "./train", "--devices", "2"], "not expected: --devices"),
    (["slurm", "render", "--bogus", "--", "./train"], "--bogus"),
    (["slurm"], "A subcommand is required"),
    (["slurm", "render", "--nodes"], "--nodes"),
])
def test_a_command_line_that_does_not_parse_exits_2_as_volt_programs_do(tmp_path, args, expected):
    # volt::run_main's codes: 1 for bad input, 2 for usage (unknown flags, missing subcommands).
    result = run(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stdout
    assert expected in result.stderr
    assert "HINT:" in result.stderr


def render_ranks(*program, job=("--nodes", "2", "--ntasks-per-node", "1")):
    """`volt slurm render` for `program`; the ranks of its rank table, as (global, local, node) rows."""
    result = run("slurm", "render", *job, "--time", "01:00:00", "--", "./train", *program)
    rows = [line.split()[1:] for line in result.stdout.splitlines() if line.startswith("# node")]
    return result, [(r[5], r[6], r[7]) for r in rows]


def test_ddp2_runs_one_task_per_node_as_the_trainer_does():
    # Issue #11: this job was refused with a HINT (2 tasks per node) that the Trainer then rejected.
    result, ranks = render_ranks("--strategy", "ddp2", "--devices", "2", "--num-nodes", "2")
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --ntasks-per-node=1\n" in result.stdout
    assert ranks == [("0", "0", "0"), ("1", "0", "1")]
    refused, _ = render_ranks("--strategy", "ddp2", "--devices", "2", "--num-nodes", "2",
                              job=("--nodes", "2", "--ntasks-per-node", "2"))
    assert refused.returncode == 1
    assert "the Trainer runs 1 process per node (strategy=ddp2)" in refused.stderr
    assert "HINT: set ntasks_per_node=1 (volt slurm: --ntasks-per-node)." in refused.stderr


def test_gpus_strategy_and_config_are_read_as_the_program_reads_them(tmp_path):
    gpus = run("slurm", "render", "--nodes", "1", "--ntasks-per-node", "2", "--time", "10", "--", "./train",
               "--gpus", "2")
    assert gpus.returncode == 1  # the job reserves no GPUs for gpus=2
    assert "the Trainer uses devices=2 GPUs per node" in gpus.stderr
    assert run("slurm", "render", "--nodes", "1", "--ntasks-per-node", "2", "--gpus-per-node", "2", "--time", "10",
               "--", "./train", "--gpus", "2").returncode == 0
    dp, ranks = render_ranks("--strategy", "dp", "--devices", "4", "--lr", "0.1", job=("--ntasks-per-node", "1"))
    assert dp.returncode == 0, dp.stderr
    assert len(ranks) == 1
    config = tmp_path / "run.yaml"
    config.write_text("trainer:\n  devices: 2\n  num_nodes: 2\nmodel:\n  lr: 0.1\nsave_top_k: 3\n")
    fits = run("slurm", "render", "--nodes", "2", "--ntasks-per-node", "2", "--time", "10", "--", "./train",
               "--config", "run.yaml", cwd=tmp_path)
    assert fits.returncode == 0, fits.stderr
    differs = run("slurm", "render", "--nodes", "2", "--ntasks-per-node", "1", "--time", "10", "--", "./train",
                  "--config", "run.yaml", cwd=tmp_path)
    assert differs.returncode == 1
    assert "the Trainer runs devices=2 per node" in differs.stderr


def sweep_args(out, *extra):
    return ["--param", "lr=choice:0.1,0.01", "--param", "layers=int_range:2:4:2", "--max-parallel", "2",
            "--time", "01:00:00", "--job-name", "lr", "--out", out, *extra]


def test_sweep_render_writes_the_manifest_and_one_array_script(tmp_path):
    out = tmp_path / "sweep"
    result = run("sweep", "render", *sweep_args(out), "--", "./train", "--max-epochs", "3")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert [t["values"] for t in manifest["trials"]] == [
        {"lr": "0.1", "layers": "2"}, {"lr": "0.1", "layers": "4"},
        {"lr": "0.01", "layers": "2"}, {"lr": "0.01", "layers": "4"}]
    script = (out / "lr.sbatch").read_text()
    assert "#SBATCH --array=0-3%2\n" in script
    assert f"#SBATCH --output={out}/logs/slurm-%A_%a.out\n" in script
    assert (out / "logs").is_dir()
    assert f"srun {Path(VOLT).resolve()} sweep run-trial --manifest {out}/manifest.json --out {out} -- ./train " \
           "--max-epochs 3\n" in script
    assert script in result.stdout


def test_sweep_render_refuses_a_program_that_sets_a_swept_flag(tmp_path):
    result = run("sweep", "render", *sweep_args(tmp_path / "s"), "--", "./train", "--lr", "0.5")
    assert result.returncode == 1
    assert "--lr, which the sweep sets per trial" in result.stderr and "HINT:" in result.stderr
    assert not (tmp_path / "s" / "manifest.json").exists()


def test_run_trial_runs_the_program_with_the_trial_flags(tmp_path):
    out = tmp_path / "sweep"
    assert run("sweep", "render", *sweep_args(out), "--", "./train").returncode == 0
    program = tmp_path / "train.py"
    program.write_text("import json, sys\n"
                       "root = sys.argv[sys.argv.index('--default-root-dir') + 1]\n"
                       "open(root + '/argv.json', 'w').write(json.dumps(sys.argv[1:]))\n")
    env = dict(os.environ, SLURM_ARRAY_TASK_ID="2")
    result = run("sweep", "run-trial", "--manifest", out / "manifest.json", "--out", out, "--",
                 sys.executable, program, "--max-epochs", "1", env=env)
    assert result.returncode == 0, result.stderr
    argv = json.loads((out / "trial_002" / "argv.json").read_text())
    assert argv == ["--max-epochs", "1", "--lr", "0.01", "--layers", "2", "--default-root-dir", f"{out}/trial_002"]
    # --index wins over the array task id.
    result = run("sweep", "run-trial", "--manifest", out / "manifest.json", "--out", out, "--index", "1", "--",
                 sys.executable, program, env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads((out / "trial_001" / "argv.json").read_text())[:4] == ["--lr", "0.1", "--layers", "4"]


def test_run_trial_without_an_index_or_a_missing_trial_is_an_error(tmp_path):
    out = tmp_path / "sweep"
    assert run("sweep", "render", *sweep_args(out), "--", "./train").returncode == 0
    env = {k: v for k, v in os.environ.items() if k != "SLURM_ARRAY_TASK_ID"}
    result = run("sweep", "run-trial", "--manifest", out / "manifest.json", "--", "/bin/echo", env=env)
    assert result.returncode == 1 and "SLURM_ARRAY_TASK_ID" in result.stderr and "HINT:" in result.stderr
    result = run("sweep", "run-trial", "--manifest", out / "manifest.json", "--index", "9", "--", "/bin/echo")
    assert result.returncode == 1 and "9" in result.stderr
    result = run("sweep", "run-trial", "--manifest", out / "manifest.json", "--index", "0", "--", "/no/such/program")
    assert result.returncode == 1 and "cannot run '/no/such/program'" in result.stderr


def test_slurm_submit_writes_the_script_and_prints_the_job_id(tmp_path, slurm_path):
    env, log = slurm_path
    result = run("slurm", "submit", "--job-name", "mnist", "--time", "01:00:00", "--script-dir", tmp_path / "jobs",
                 "--output", tmp_path / "logs" / "%x-%j.out", "--", "./train", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "4242\n"
    script = tmp_path / "jobs" / "mnist.sbatch"
    assert "srun ./train\n" in script.read_text()
    assert log.read_text() == f"sbatch --parsable {script}\n"
    # sbatch makes no folder for the log; a job that cannot open it dies without one.
    assert (tmp_path / "logs").is_dir()


def test_slurm_submit_shows_sbatch_errors_with_a_hint(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake(bin_dir, "sbatch", 'echo "sbatch: error: invalid partition specified: nope" >&2\nexit 1\n')
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    result = run("slurm", "submit", "--partition", "nope", "--time", "01:00:00", "--script-dir", tmp_path, "--",
                 "./train", env=env)
    assert result.returncode == 1
    assert "invalid partition specified: nope" in result.stderr and "HINT:" in result.stderr


def test_sweep_submit_and_status(tmp_path, slurm_path):
    env, log = slurm_path
    out = tmp_path / "sweep"
    result = run("sweep", "submit", *sweep_args(out), "--", "./train", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "4242\n"
    jobs = json.loads((out / "jobs.json").read_text())["jobs"]
    assert [(j["index"], j["job_id"]) for j in jobs] == [(i, f"4242_{i}") for i in range(4)]
    assert f"sbatch --parsable {out}/lr.sbatch" in log.read_text()
    # Trial 1 left the queue and the controller: accounting says it failed, files or not.
    (out / "trial_001").mkdir()
    (out / "trial_001" / "metrics.csv").write_text("epoch\n0\n")
    result = run("sweep", "status", "--out", out, env=env)
    assert result.returncode == 0, result.stderr
    states = {line.split()[0]: line.split()[1:3] for line in result.stdout.splitlines()[1:]}
    assert states == {"0": ["4242_0", "RUNNING"], "1": ["4242_1", "FAILED"], "2": ["4242_2", "PENDING"],
                      "3": ["4242_3", "PENDING"]}
    assert "squeue -h -r -o %i %T -j 4242" in log.read_text()
    assert "scontrol show job -o 4242_1" in log.read_text()
    assert "sacct -j 4242_1 -n -X -P -o State" in log.read_text()
    # A submitted sweep's directory is not rendered over.
    result = run("sweep", "render", *sweep_args(out), "--", "./train", env=env)
    assert result.returncode == 1 and "already holds a submitted sweep" in result.stderr


def test_sweep_one_job_per_trial(tmp_path, slurm_path):
    env, log = slurm_path
    out = tmp_path / "sweep"
    result = run("sweep", "submit", *sweep_args(out, "--one-job-per-trial"), "--", "./train", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "4242\n" * 4
    script = (out / "lr-trial_003.sbatch").read_text()
    assert "--array" not in script
    assert "--index 3 -- ./train\n" in script
    assert f"#SBATCH --output={out}/logs/trial_003-%j.out\n" in script
    # Every trial's job is 4242 here, and the fake squeue does not list plain 4242.
    result = run("sweep", "status", "--out", out, env=env)
    assert result.returncode == 0, result.stderr
    assert [line.split()[2] for line in result.stdout.splitlines()[1:]] == ["unknown"] * 4


def test_status_before_submit_says_to_submit(tmp_path):
    out = tmp_path / "sweep"
    assert run("sweep", "render", *sweep_args(out), "--", "./train").returncode == 0
    result = run("sweep", "status", "--out", out)
    assert result.returncode == 1 and "submit first" in result.stderr


# ---- volt plot ---------------------------------------------------------------------------------

def write_metrics(path: Path, epochs: int = 3, steps_per_epoch: int = 50) -> None:
    """A metrics.csv as the CSV logger writes it: step rows, then epoch rows with validation."""
    import math
    rows = ["epoch,step,train/loss_epoch,train/loss_step,val/acc,val/loss"]
    for epoch in range(epochs):
        for step in range(epoch * steps_per_epoch + 4, (epoch + 1) * steps_per_epoch, 5):
            rows.append(f"{epoch}.0,{step},,{2.0 * math.exp(-step / 60) + 0.1},,")
        end = (epoch + 1) * steps_per_epoch - 1
        rows.append(f"{epoch}.0,{end},,,{0.6 + 0.1 * epoch},{0.9 - 0.1 * epoch}")
        rows.append(f"{epoch}.0,{end},{1.2 - 0.2 * epoch},,,")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(("\r\n".join(rows) + "\r\n").encode())


def png_size(path: Path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


needs_gnuplot = pytest.mark.skipif(not any((Path(d) / "gnuplot").exists() for d in os.environ["PATH"].split(":")),
                                   reason="gnuplot is not installed (Debian: gnuplot-nox, see scripts/setup.sh)")


@needs_gnuplot
def test_plot_draws_the_newest_version_of_a_root_dir(tmp_path):
    write_metrics(tmp_path / "lightning_logs" / "version_0" / "metrics.csv", epochs=1)
    write_metrics(tmp_path / "lightning_logs" / "version_2" / "metrics.csv")
    result = run("plot", tmp_path)
    assert result.returncode == 0, result.stderr
    png = tmp_path / "lightning_logs" / "version_2" / "metrics.png"
    # Two panels (losses, accuracies) of 350 pixels each, 1000 wide.
    assert png_size(png) == (1000, 700)
    assert "train/loss_epoch, train/loss_step, val/loss, val/acc" in result.stdout
    script = png.with_suffix(".gp").read_text()
    assert "set multiplot layout 2,1" in script and "pngcairo" in script


@needs_gnuplot
def test_plot_out_size_and_chosen_metrics(tmp_path):
    write_metrics(tmp_path / "run" / "metrics.csv")
    out = tmp_path / "curves.png"
    result = run("plot", tmp_path / "run", "--out", out, "--metrics", "val/acc,val/loss", "--width", "640",
                 "--height", "480")
    assert result.returncode == 0, result.stderr
    assert png_size(out) == (640, 480)
    script = out.with_suffix(".gp").read_text()
    assert "title 'val/acc'" in script and "title 'val/loss'" in script
    assert "title 'train/loss_step'" not in script


def test_plot_errors_say_what_to_do(tmp_path):
    result = run("plot", tmp_path)
    assert result.returncode == 1
    assert "no metrics.csv in" in result.stderr and "HINT" in result.stderr
    (tmp_path / "metrics.csv").write_text("epoch,step,note\n0,1,x\n")
    result = run("plot", tmp_path)
    assert result.returncode == 1
    assert "no loss or accuracy column" in result.stderr and "HINT" in result.stderr
    write_metrics(tmp_path / "metrics.csv")
    result = run("plot", tmp_path, "--metrics", "val/f1")
    assert result.returncode == 1
    assert "'val/f1'" in result.stderr and "HINT: choose from: epoch, train/loss_epoch" in result.stderr
    result = run("plot", tmp_path, "--gnuplot", "/nonexistent/gnuplot")
    assert result.returncode == 1 and "gnuplot-nox" in result.stderr


# ---- volt new ------------------------------------------------------------------------------------
# (tests/install builds and trains a new project against the installed package.)

def test_new_writes_a_project_and_refuses_to_overwrite(tmp_path):
    project = tmp_path / "my-model"
    result = run("new", project)
    assert result.returncode == 0, result.stderr
    assert "created the project my_model" in result.stdout
    for name in ("CMakeLists.txt", "src/main.cpp", "src/classifier.h", "config.yaml", "README.md", ".gitignore"):
        assert (project / name).is_file(), name
    cmake = (project / "CMakeLists.txt").read_text()
    assert "find_package(volt CONFIG" in cmake and "target_link_libraries(my_model PRIVATE volt::volt volt::cli)" in cmake
    result = run("new", project)
    assert result.returncode == 1 and "not an empty directory" in result.stderr and "HINT" in result.stderr
    result = run("new", tmp_path / "other", "--name", "bad-name")
    assert result.returncode == 1 and "--name=bad-name" in result.stderr
