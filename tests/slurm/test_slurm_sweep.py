"""Sweeps on a real SLURM cluster (conftest.py starts it), submitted with the `volt` tool: a 4-trial grid
of the Fashion-MNIST example as one job array, and an array task that requeues itself and only itself.
"""
import json
import os
import subprocess

from conftest import job_fields, wait_for_end, wait_for_text
from volt_testkit import require

EXAMPLE = os.environ.get("VOLT_EXAMPLE", "")
PROBE = os.environ.get("VOLT_DDP_PROBE", "")
TOOL = os.environ.get("VOLT_TOOL", "")
require(EXAMPLE and PROBE and TOOL, "VOLT_EXAMPLE/VOLT_DDP_PROBE/VOLT_TOOL not set (run through ctest)")


def volt(cluster, *args):
    done = subprocess.run([TOOL, *args], env=cluster, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def submit_sweep(cluster, out, params, program):
    args = ["sweep", "submit", "--out", str(out), "--time", "5", "--max-parallel", "2", "--export", "OMP_NUM_THREADS=1"]
    for p in params:
        args += ["--param", p]
    volt(cluster, *args, "--", *program)
    jobs = json.loads((out / "jobs.json").read_text())["jobs"]
    # One array: every trial's job id is "<array job id>_<index>".
    assert [j["job_id"] for j in jobs] == [f"{jobs[0]['job_id'].split('_')[0]}_{j['index']}" for j in jobs], jobs
    return jobs[0]["job_id"].split("_")[0]


def test_a_grid_sweep_runs_as_a_job_array_and_every_trial_keeps_its_own_results(cluster, tmp_path):
    out = tmp_path / "sweep"
    program = [EXAMPLE, "--model", "mlp", "--max-epochs", "1", "--limit-train-batches", "150", "--limit-val-batches",
               "20", "--no-test", "--seed", "1", "--num-threads", "1", "--no-progress-bar"]
    job = submit_sweep(cluster, out, ["lr=choice:0.001,0.003", "hidden=choice:64,128"], program)
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["trials"]) == 4
    wait_for_end(cluster, job, 600)

    status = volt(cluster, "sweep", "status", "--out", str(out))
    finals = set()
    for trial in manifest["trials"]:
        index, values = trial["index"], trial["values"]
        trial_dir = out / f"trial_{index:03d}"
        # The array task ran under its own id and logged into a folder named after it.
        logs = list((trial_dir / "lightning_logs").glob(f"{job}_{index}"))
        assert logs, (list(trial_dir.rglob("*")), status)
        hparams = (logs[0] / "hparams.yaml").read_text()
        assert f"lr: {values['lr']}" in hparams and f"hidden: {values['hidden']}" in hparams, hparams
        rows = (logs[0] / "metrics.csv").read_text().splitlines()
        header = rows[0].split(",")
        val = [r.split(",")[header.index("val/loss")] for r in rows[1:] if r.split(",")[header.index("val/loss")]]
        assert val, rows
        finals.add(val[-1])
        assert list(trial_dir.rglob("last.ckpt")), f"trial {index} saved no checkpoint"
        assert f"{index}" in status
    assert len(finals) == 4, "each trial trained with its own hyperparameters"
    for index in range(4):
        state = job_fields(cluster, f"{job}_{index}").get("JobState")
        assert state in (None, "COMPLETED"), (index, state)


def test_an_array_task_signalled_to_requeue_requeues_only_itself_and_resumes_its_own_trial(cluster, tmp_path):
    out = tmp_path / "sweep"
    args = ["--max-steps", "120", "--batch-size", "8", "--seed", "1", "--enable-model-summary"]
    job = submit_sweep(cluster, out, ["lr=choice:0.1,0.05"], [PROBE, *args, "--step-sleep-ms", "50"])
    task_log = out / "logs" / f"slurm-{job}_1.out"
    # The summary prints when fit starts; the requeue handler is installed before (in the Trainer's
    # constructor) and the signal is acted on after a training step, so signalling at once stops the
    # task after step 1 or later, with the rest of its 120 steps of >= 50 ms still to run, whatever
    # the machine's speed. (A sleep here would only race the task's end.)
    wait_for_text(task_log, "Total params", 1, 120)
    subprocess.run(["scancel", "--signal=USR1", f"{job}_1"], env=cluster, check=True, timeout=30)
    wait_for_text(task_log, f"Requeued SLURM job {job}_1", 1, 60)
    wait_for_end(cluster, job, 300)

    assert job_fields(cluster, f"{job}_1").get("Restarts") == "1"
    assert job_fields(cluster, f"{job}_0").get("Restarts") == "0", "the other trial was not requeued"
    for index, lr in ((0, "0.1"), (1, "0.05")):
        reference = tmp_path / f"reference{index}"
        reference.mkdir()
        straight = subprocess.run([PROBE, "--out", str(reference), *args, "--lr", lr], capture_output=True, text=True,
                                  timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert straight.returncode == 0, straight.stderr
        result = json.loads((out / f"trial_{index:03d}" / "rank0.json").read_text())
        assert result["global_step"] == 120
        assert result["params"] == json.loads((reference / "rank0.json").read_text())["params"], index
