"""Auto-requeue on a real SLURM cluster (conftest.py starts it): the Fashion-MNIST example and the
ddp probe as sbatch jobs that are signalled with `scancel --signal`, by their own wall time
(`--signal=USR1@60`) and with SIGTERM, then compared with uninterrupted runs.
"""
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import job_fields, sbatch, wait_for_end, wait_for_text, write_script

EXAMPLE = os.environ.get("VOLT_EXAMPLE", "")
PROBE = os.environ.get("VOLT_DDP_PROBE", "")
pytestmark = pytest.mark.skipif(not EXAMPLE or not PROBE, reason="VOLT_EXAMPLE/VOLT_DDP_PROBE not set (run through ctest)")

torch = pytest.importorskip("torch")

# What rank 0 prints once per run, when fit starts (the model summary): the run is past its set-up.
FIT_STARTED = "Total params"


def example_args(tasks, nodes, batch, root, epochs=2):
    return (f"--model mlp --max-epochs {epochs} --seed 1 --num-threads 1 --no-progress-bar --no-test --batch-size {batch} "
            f"--devices {tasks} --num-nodes {nodes} --default-root-dir {root}")


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
    # 4 epochs (about 6 s for 1x1 here, 1.8 ms a step): each signal, 1 s into a (restarted) run,
    # leaves the rest still running when it arrives; with 2 epochs a restart could finish first.
    epochs = 4
    reference = run_reference(cluster, tmp_path, nodes, tasks, batch, epochs)
    root = tmp_path / "requeued"
    root.mkdir()
    log = root / "job.out"
    script = write_script(tmp_path / "requeued.sh",
                          [f"--nodes={nodes}", f"--ntasks-per-node={tasks}", "--time=5", "--requeue",
                           "--open-mode=append", f"--output={log}"],
                          'echo "restart=${SLURM_RESTART_COUNT:-0}"\n'
                          f"srun {EXAMPLE} {example_args(tasks, nodes, batch, root, epochs)}")
    job = sbatch(cluster, script)
    for signalled in (1, 2):
        wait_for_text(log, FIT_STARTED, signalled, 120)
        time.sleep(1.0)  # into the (resumed) epoch's training
        subprocess.run(["scancel", "--signal=USR1", job], env=cluster, check=True, timeout=30)
        wait_for_text(log, "Requeued SLURM job", signalled, 60)
    fields = wait_for_end(cluster, job, 300)
    text = log.read_text()
    assert fields.get("JobState") == "COMPLETED", text
    assert fields.get("Restarts") == "2", fields
    assert "restart=0" in text and "restart=1" in text and "restart=2" in text, text
    assert text.count("Restored training state from") == 2, text

    # Both stops were in the middle of an epoch, and the default keeps the last 2 HPC checkpoints.
    hpc = sorted(root.glob("hpc_ckpt_*.ckpt"))
    assert [p.name for p in hpc] == ["hpc_ckpt_1.ckpt", "hpc_ckpt_2.ckpt"]
    for path in hpc:
        loop = load(path)["loops"]["fit_loop"]
        assert 0 < loop["batches_done"] and not loop["epoch_done"], (path, loop)
    assert load(hpc[1])["global_step"] > load(hpc[0])["global_step"]

    # The three runs logged into one folder named after the job, each continuing the CSV.
    rows = (root / "lightning_logs" / job / "metrics.csv").read_text().splitlines()
    steps = [int(float(r.split(",")[rows[0].split(",").index("step")])) for r in rows[1:]]
    assert steps == sorted(steps) and steps[0] < load(hpc[0])["global_step"] < load(hpc[1])["global_step"] < steps[-1]
    assert list((root / "lightning_logs" / job).glob("events.out.tfevents.*")), "TensorBoard files beside it"

    final, expected = load(newest_last_checkpoint(root)), load(newest_last_checkpoint(reference))
    assert final["global_step"] == expected["global_step"]
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
    time.sleep(1.5)
    started = time.monotonic()
    subprocess.run(["scancel", job], env=cluster, check=True, timeout=30)  # SIGTERM, SIGKILL after KillWait=5 s
    fields = wait_for_end(cluster, job, 60)
    assert fields.get("JobState") == "CANCELLED", fields
    hpc = list(root.glob("hpc_ckpt_*.ckpt"))
    assert len(hpc) == 1, (list(root.iterdir()), log.read_text())
    checkpoint = load(hpc[0])
    assert checkpoint["global_step"] > 0
    assert all(torch.is_tensor(t) for t in checkpoint["state_dict"].values())
    assert not list(root.glob("*.tmp*")), "no temporary file is left behind"
    # Every rank exits by itself; none is left waiting in a collective.
    while time.monotonic() - started < 15:
        if subprocess.run(["pgrep", "-f", str(root)], capture_output=True).returncode != 0:
            break
        time.sleep(0.2)
    left = subprocess.run(["pgrep", "-af", str(root)], capture_output=True, text=True).stdout
    assert not left, left
