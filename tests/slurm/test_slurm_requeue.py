"""Auto-requeue on a real SLURM cluster (conftest.py starts it): the Fashion-MNIST example and the
ddp probe as sbatch jobs that are signalled with `scancel --signal`, by their own wall time
(`--signal=USR1@60`) and with SIGTERM, then compared with uninterrupted runs.

The tests signal a job when its metrics.csv shows that training reached a given step, never after
a fixed sleep: how far a run gets in a second depends on the machine and its load (a loaded 2-core
machine once took a signal sent 1 s after the start at step 45, before the first logged step).
"""
import csv
import io
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import job_fields, sbatch, wait_for_end, wait_for_text, write_script
from volt_testkit import require

EXAMPLE = os.environ.get("VOLT_EXAMPLE", "")
PROBE = os.environ.get("VOLT_DDP_PROBE", "")
GPT = os.environ.get("VOLT_GPT_EXAMPLE", "")
TOOL = os.environ.get("VOLT_TOOL", "")
require(EXAMPLE and PROBE, "VOLT_EXAMPLE/VOLT_DDP_PROBE not set (run through ctest)")

try:
    import torch
except ImportError:
    torch = None
require(torch is not None, "no torch for /usr/bin/python3 (apt-get install python3-torch)")

# What rank 0 prints once per run, when fit starts (the model summary): the run is past its set-up.
FIT_STARTED = "Total params"


def example_args(tasks, nodes, batch, root, epochs=2):
    # Every step logged: the CSV logger then writes metrics.csv every 100 steps and at each epoch's
    # end, which is how the tests see the training progress (logging does not change the training).
    return (f"--model mlp --max-epochs {epochs} --seed 1 --num-threads 1 --no-progress-bar --no-test --batch-size {batch} "
            f"--devices {tasks} --num-nodes {nodes} --log-every-n-steps 1 --default-root-dir {root}")


def read_csv_rows(path):
    """metrics.csv's complete rows as dicts ([] before its first write). The file may be being
    written: a row cut short at the end (too few fields) is left out."""
    if not path.exists():
        return []
    lines = path.read_text(errors="replace").splitlines()
    if not lines:
        return []
    header = next(csv.reader([lines[0]]))
    rows = []
    for fields in csv.reader(io.StringIO("\n".join(lines[1:]))):
        if len(fields) == len(header):
            rows.append(dict(zip(header, fields)))
    return rows


def last_logged_step(path):
    steps = [int(float(r["step"])) for r in read_csv_rows(path) if r.get("step", "")]
    return max(steps, default=-1)


def wait_for_logged_step(path, step, timeout):
    """Waits until metrics.csv logs a step >= `step`: training got that far, whatever the machine's
    speed (under ddp every rank took part in each of those steps, so every rank is training)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if last_logged_step(path) >= step:
            return
        time.sleep(0.05)
    pytest.fail(f"{path} did not reach step {step} within {timeout} s (last logged: {last_logged_step(path)})")


def load(path):
    return torch.load(str(path), map_location="cpu")


def newest_last_checkpoint(root):
    found = sorted(Path(root).rglob("last.ckpt"), key=lambda p: p.stat().st_mtime)
    assert found, f"no last.ckpt under {root}"
    return found[-1]


def assert_same_weights(a, b):
    sa, sb = load(a)["state_dict"], load(b)["state_dict"]
    assert sorted(sa) == sorted(sb)
    for name in sa:
        assert torch.equal(sa[name], sb[name]), f"{name} differs by up to {(sa[name] - sb[name]).abs().max()}"


def run_reference(cluster, tmp_path, nodes, tasks, batch, epochs=2):
    root = tmp_path / "reference"
    root.mkdir()
    script = write_script(tmp_path / "reference.sh",
                          [f"--nodes={nodes}", f"--ntasks-per-node={tasks}", "--time=5", f"--output={root}/job.out"],
                          f"srun {EXAMPLE} {example_args(tasks, nodes, batch, root, epochs)}")
    job = sbatch(cluster, script)
    fields = wait_for_end(cluster, job, 300)
    assert fields.get("JobState") == "COMPLETED", (root / "job.out").read_text()
    return root


@pytest.mark.parametrize("nodes,tasks,batch", [(1, 1, 64), (2, 2, 16)], ids=["1x1", "2x2"])
def test_a_job_requeued_twice_mid_epoch_ends_bit_identical_to_an_uninterrupted_run(cluster, tmp_path, nodes, tasks,
                                                                                    batch):
    # 4 epochs of 860 steps (global batch 64 over 55000 images). The first signal goes when the
    # run has logged step 100 of epoch 0, the second when the restarted run has logged step 100 of
    # epoch 1: each stop lands early in its epoch, on a slow machine as on a fast one (a stop can
    # only come later than the trigger, by the steps taken while scancel reaches the ranks; the
    # epoch's end is 760 steps, over a second at full speed, further on).
    epochs = 4
    reference = run_reference(cluster, tmp_path, nodes, tasks, batch, epochs)
    steps_per_epoch = load(newest_last_checkpoint(reference))["global_step"] // epochs
    assert steps_per_epoch == 860, steps_per_epoch
    root = tmp_path / "requeued"
    root.mkdir()
    log = root / "job.out"
    script = write_script(tmp_path / "requeued.sh",
                          [f"--nodes={nodes}", f"--ntasks-per-node={tasks}", "--time=5", "--requeue",
                           "--open-mode=append", f"--output={log}"],
                          'echo "restart=${SLURM_RESTART_COUNT:-0}"\n'
                          f"srun {EXAMPLE} {example_args(tasks, nodes, batch, root, epochs)}")
    job = sbatch(cluster, script)
    metrics = root / "lightning_logs" / job / "metrics.csv"
    for signalled in (1, 2):
        wait_for_text(log, FIT_STARTED, signalled, 120)
        wait_for_logged_step(metrics, (signalled - 1) * steps_per_epoch + 100, 300)
        subprocess.run(["scancel", "--signal=USR1", job], env=cluster, check=True, timeout=30)
        wait_for_text(log, "Requeued SLURM job", signalled, 60)
    fields = wait_for_end(cluster, job, 300)
    text = log.read_text()
    assert fields.get("JobState") == "COMPLETED", text
    assert fields.get("Restarts") == "2", fields
    assert "restart=0" in text and "restart=1" in text and "restart=2" in text, text
    assert text.count("Restored training state from") == 2, text

    # The stops were in the middle of epochs 0 and 1, at or after the step that triggered them, and
    # the default keeps the last 2 HPC checkpoints.
    hpc = sorted(root.glob("hpc_ckpt_*.ckpt"))
    assert [p.name for p in hpc] == ["hpc_ckpt_1.ckpt", "hpc_ckpt_2.ckpt"]
    stops = []
    for epoch, path in enumerate(hpc):
        checkpoint = load(path)
        loop = checkpoint["loops"]["fit_loop"]
        assert not loop["epoch_done"] and 100 <= loop["batches_done"] < steps_per_epoch, (path, loop)
        assert checkpoint["global_step"] == epoch * steps_per_epoch + loop["batches_done"], (path, loop)
        stops.append(checkpoint["global_step"])

    # The three runs logged into one folder named after the job, each continuing the CSV where the
    # previous one stopped: every step once, in order.
    rows = read_csv_rows(metrics)
    steps = [int(float(r["step"])) for r in rows]
    assert steps == sorted(steps) and steps[-1] == epochs * steps_per_epoch
    step_rows = [int(float(r["step"])) for r in rows if r["train/loss_step"] != ""]
    assert step_rows == list(range(1, epochs * steps_per_epoch + 1)), f"stopped at {stops}; see {metrics}"
    assert list((root / "lightning_logs" / job).glob("events.out.tfevents.*")), "TensorBoard files beside it"

    final, expected = load(newest_last_checkpoint(root)), load(newest_last_checkpoint(reference))
    assert final["global_step"] == expected["global_step"]
    assert_same_weights(newest_last_checkpoint(root), newest_last_checkpoint(reference))


def test_a_two_node_gpt_job_requeued_mid_epoch_ends_bit_identical_to_an_uninterrupted_run(cluster, tmp_path):
    # examples/gpt (issue #31) on 2 nodes x 2 tasks: its AdamW groups, warmup-cosine schedule and
    # byte windows resume like the MLP's state. 256 KB of text in 33-byte windows, 4 per process:
    # 500 steps in the epoch; the signal goes once step 100 is logged.
    require(GPT, "VOLT_GPT_EXAMPLE not set (run through ctest)")
    text = tmp_path / "licenses.txt"
    text.write_bytes(b"".join(p.read_bytes() for p in sorted(Path("/usr/share/common-licenses").iterdir())
                              if p.is_file() and not p.is_symlink()))
    header = ["--nodes=2", "--ntasks-per-node=2", "--time=5"]

    def command(root):
        return (f"srun {GPT} --text {text} --n-layer 2 --n-head 2 --n-embd 32 --block-size 32 --batch-size 4 "
                f"--lr 1e-2 --max-epochs 1 --seed 1 --num-threads 1 --no-progress-bar --sample-tokens 0 "
                f"--limit-val-batches 0 --devices 2 --num-nodes 2 --log-every-n-steps 1 --default-root-dir {root}")

    reference = tmp_path / "reference"
    reference.mkdir()
    job = sbatch(cluster, write_script(tmp_path / "reference.sh", header + [f"--output={reference}/job.out"],
                                       command(reference)))
    assert wait_for_end(cluster, job, 300).get("JobState") == "COMPLETED", (reference / "job.out").read_text()
    steps = load(newest_last_checkpoint(reference))["global_step"]
    assert steps > 300, steps  # the signal at step 100 lands mid-epoch
    root = tmp_path / "requeued"
    root.mkdir()
    log = root / "job.out"
    job = sbatch(cluster, write_script(tmp_path / "requeued.sh",
                                       header + ["--requeue", "--open-mode=append", f"--output={log}"],
                                       command(root)))
    wait_for_text(log, FIT_STARTED, 1, 120)
    wait_for_logged_step(root / "lightning_logs" / job / "metrics.csv", 100, 300)
    subprocess.run(["scancel", "--signal=USR1", job], env=cluster, check=True, timeout=30)
    wait_for_text(log, "Requeued SLURM job", 1, 60)
    fields = wait_for_end(cluster, job, 300)
    assert fields.get("JobState") == "COMPLETED" and fields.get("Restarts") == "1", (fields, log.read_text())
    stopped = load(sorted(root.glob("hpc_ckpt_*.ckpt"))[-1])["loops"]["fit_loop"]
    assert not stopped["epoch_done"] and 100 <= stopped["batches_done"] < steps, stopped
    assert load(newest_last_checkpoint(root))["global_step"] == steps
    assert_same_weights(newest_last_checkpoint(root), newest_last_checkpoint(reference))


def test_a_wall_time_signal_requeues_the_job_by_itself(cluster, tmp_path):
    # 700 steps of 100 ms: ~70 s of training with no CPU load. With --time=2 --signal=USR1@60 SLURM
    # signals between 30 and 60 s after the start (its 30 s tick), i.e. always during training.
    args = "--max-steps 700 --batch-size 8 --seed 1"
    reference = tmp_path / "reference"
    reference.mkdir()
    straight = subprocess.run([PROBE, "--out", str(reference)] + args.split(), capture_output=True, text=True,
                              timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert straight.returncode == 0, straight.stderr

    root = tmp_path / "walltime"
    root.mkdir()
    log = root / "job.out"
    script = write_script(tmp_path / "walltime.sh",
                          ["--ntasks=1", "--time=2", "--signal=USR1@60", "--requeue", "--open-mode=append",
                           f"--output={log}"],
                          f"srun {PROBE} --out {root} {args} --step-sleep-ms 100 --default-root-dir {root}")
    job = sbatch(cluster, script)
    fields = wait_for_end(cluster, job, 420)
    text = log.read_text()
    assert fields.get("JobState") == "COMPLETED", text
    assert int(fields.get("Restarts", "0")) >= 1, fields
    assert "Requeued SLURM job" in text, text
    result = json.loads((root / "rank0.json").read_text())
    assert result["global_step"] == 700
    assert result["params"] == json.loads((reference / "rank0.json").read_text())["params"]


def test_sigterm_leaves_a_valid_checkpoint_and_no_process_behind(cluster, tmp_path):
    root = tmp_path / "terminated"
    root.mkdir()
    log = root / "job.out"
    script = write_script(tmp_path / "terminated.sh",
                          ["--nodes=2", "--ntasks-per-node=2", "--time=5", f"--output={log}"],
                          f"srun {EXAMPLE} {example_args(2, 2, 16, root, epochs=3)}")
    job = sbatch(cluster, script)
    wait_for_text(log, FIT_STARTED, 1, 120)
    wait_for_logged_step(root / "lightning_logs" / job / "metrics.csv", 100, 300)  # every rank is training
    started = time.monotonic()
    subprocess.run(["scancel", job], env=cluster, check=True, timeout=30)  # SIGTERM, SIGKILL after KillWait=5 s
    fields = wait_for_end(cluster, job, 60)
    assert fields.get("JobState") == "CANCELLED", fields
    hpc = list(root.glob("hpc_ckpt_*.ckpt"))
    assert len(hpc) == 1, (list(root.iterdir()), log.read_text())
    checkpoint = load(hpc[0])
    assert checkpoint["global_step"] >= 100
    assert all(torch.is_tensor(t) for t in checkpoint["state_dict"].values())
    assert not list(root.glob("*.tmp*")), "no temporary file is left behind"
    # Every rank exits by itself; none is left waiting in a collective.
    while time.monotonic() - started < 15:
        if subprocess.run(["pgrep", "-f", str(root)], capture_output=True).returncode != 0:
            break
        time.sleep(0.2)
    left = subprocess.run(["pgrep", "-af", str(root)], capture_output=True, text=True).stdout
    assert not left, left


def test_a_killed_task_restarts_the_step_which_resumes_from_the_newest_snapshot(cluster, tmp_path):
    """`volt slurm render --max-restarts 1`: rank 1 kills itself (SIGKILL, VOLT_INJECT_FAULT) at
    step 17 of the first attempt; the step fails, the script runs it again in the same allocation,
    and the new step resumes from the snapshot of step 15 and ends bit-identical to a job that
    never failed."""
    require(TOOL, "VOLT_TOOL not set (run through ctest)")
    args = example_args(2, 1, 16, "ROOT", epochs=1).split() + ["--limit-train-batches", "30",
                                                               "--snapshot-every-n-steps", "5"]
    roots = {}
    for name, fault in (("reference", None), ("restarted", "rank=1,step=17")):
        root = tmp_path / name
        root.mkdir()
        flags = ["slurm", "render", "--no-ranks", "--ntasks-per-node", "2", "--time", "5", "--output",
                 str(root / "job.out"), "--error", str(root / "job.out"), "--export", "OMP_NUM_THREADS=1"]
        if fault:
            flags += ["--max-restarts", "1", "--export", f"VOLT_INJECT_FAULT={fault}"]
        rendered = subprocess.run([TOOL, *flags, "--", EXAMPLE, *[str(root) if a == "ROOT" else a for a in args]],
                                  env=cluster, capture_output=True, text=True, timeout=60)
        assert rendered.returncode == 0, rendered.stderr
        (tmp_path / f"{name}.sh").write_text(rendered.stdout)
        fields = wait_for_end(cluster, sbatch(cluster, tmp_path / f"{name}.sh"), 300)
        text = (root / "job.out").read_text()
        assert fields.get("JobState") == "COMPLETED", text
        roots[name] = (root, text)
    root, text = roots["restarted"]
    assert "starting it again (restart 1 of 1)" in text, text
    # The memory tier's copy: the step ran again on the same node, whose /dev/shm kept it.
    assert "snapshot_3.ckpt (node-local shared memory)" in text, text
    assert "stopped: max_epochs after 1 epoch" in text, text
    assert_same_weights(newest_last_checkpoint(root), newest_last_checkpoint(roots["reference"][0]))
