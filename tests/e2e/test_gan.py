"""examples/fashion_mnist_gan: manual optimization with two optimizers, run the way a user does.
One process and ddp train, each optimizer's step counts a global step, and a run resumed from its
last checkpoint ends bit-identical to one that never stopped."""
import subprocess
import time

import pytest
import torch

from volt_e2e import (DETERMINISTIC, Run, assert_ok, cluster_free_env, example_binary, finite, load_checkpoint,
                      merge_flags, read_metrics_csv, run_binary)
from volt_testkit import free_port

ARGS = ["--no-progress-bar", "--log-every-n-steps", "2"] + DETERMINISTIC


@pytest.fixture(scope="module")
def gan():
    return example_binary("VOLT_GAN_EXAMPLE", "fashion_mnist_gan")


def last_checkpoint(run):
    return run.version_dir(0) / "checkpoints" / "last.ckpt"


BATCH = ["--batch-size", "32"]


@pytest.fixture(scope="module")
def one_process_20_steps(gan, dataset, tmp_path_factory):
    """One process, 20 global steps (10 batches): the first half of the resume test's run and the
    reference of the ddp test, made once. The resume writes its own run beside it (version_1)."""
    run = run_binary(gan, merge_flags(ARGS, ["--max-steps", "20"], BATCH), tmp_path_factory.mktemp("gan_one"))
    assert_ok(run)
    return run


@pytest.mark.compat
def test_the_gan_resumed_from_its_last_checkpoint_ends_bit_identical(gan, dataset, one_process_20_steps, tmp_path):
    straight = run_binary(gan, ARGS + BATCH + ["--max-steps", "40"], tmp_path / "straight")
    assert_ok(straight)
    # Two optimizers stepped per batch: 40 global steps are 20 batches.
    assert int(straight.summary()[0]["global step"]) == 40
    _, rows = read_metrics_csv(straight.version_dir(0) / "metrics.csv")
    logged = [r for r in rows if r.get("train/g_loss_step", "") != ""]
    assert logged and all(finite(r["train/g_loss_step"]) and finite(r["train/d_loss_step"]) for r in logged)

    first = one_process_20_steps
    resumed = run_binary(gan, ARGS + BATCH + ["--max-steps", "40", "--ckpt-path", str(last_checkpoint(first))],
                         first.root)
    assert_ok(resumed)
    expected = load_checkpoint(last_checkpoint(straight))
    got = load_checkpoint(resumed.version_dir(1) / "checkpoints" / "last.ckpt")
    assert got["global_step"] == expected["global_step"] == 40
    assert expected["state_dict"].keys() == got["state_dict"].keys()
    for name, value in expected["state_dict"].items():
        assert torch.equal(value, got["state_dict"][name]), name
    # Both optimizers' states (Adam's moments) resume too.
    assert len(got["optimizer_states"]) == 2


def ddp_job(gan, args, root, seeds, timeout=240):
    """Runs the GAN under ddp as 2 processes started the way torchrun starts them, rank r with
    --seed seeds[r], both writing into `root`; returns rank 0's Run."""
    root.mkdir(parents=True)
    port = str(free_port())
    start = time.monotonic()
    procs = []
    for rank, seed in enumerate(seeds):
        env = cluster_free_env(RANK=str(rank), LOCAL_RANK=str(rank), GROUP_RANK="0", WORLD_SIZE="2",
                               LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS="1")
        argv = [gan] + merge_flags(ARGS, args, ["--strategy", "ddp", "--devices", "2", "--seed", str(seed),
                                                "--default-root-dir", str(root)])
        procs.append((argv, subprocess.Popen(argv, env=env, cwd=root, stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, text=True)))
    runs = []
    try:
        for argv, proc in procs:
            out, err = proc.communicate(timeout=max(1.0, start + timeout - time.monotonic()))
            runs.append(Run(argv, root, subprocess.CompletedProcess(argv, proc.returncode, out, err),
                            time.monotonic() - start))
    finally:
        for _, proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    for run in runs:
        assert_ok(run)
    return runs[0]


def logged_losses(run):
    """{(step, name): value} of the g_loss and d_loss rank 0 logged."""
    _, rows = read_metrics_csv(run.version_dir(0) / "metrics.csv")
    return {(int(row["step"]), name): float(row[name]) for row in rows
            for name in ("train/g_loss_step", "train/d_loss_step") if row.get(name, "") != ""}


def largest_difference(a, b):
    """The largest difference between two state_dicts' values, relative to max(1, |b|)."""
    assert a.keys() == b.keys()
    return max(float(((a[k] - b[k]).abs() / b[k].abs().clamp(min=1.0)).max()) for k in b)


# Gradients averaged over the processes in another order than one process sums them: float rounding.
TOLERANCE = 1e-5


@pytest.mark.compat
def test_the_gan_under_ddp_trains_as_one_process_and_its_ranks_gradients_meet(gan, dataset, one_process_20_steps,
                                                                              tmp_path):
    """Manual optimization under ddp: two optimizers stepping on all-reduced gradients, with each
    one's backward leaving the other's parameters out.

    ddp with 2 processes of batch B cannot give the global batch of one process of batch 2B here:
    the example draws its noise in training_step from the global generator, which every rank seeds
    alike, so both ranks draw the same noise where one process draws twice as much. So: (1) ranks
    that see the same batches (no distributed sampler, the same seed) train exactly as one process
    of batch B, losses and weights; (2) with rank 1 seeded otherwise (other batches and noise),
    rank 0 ends elsewhere, which only rank 1's gradients reaching rank 0's optimizer steps can do
    (rank 0 alone is run 1's one process)."""
    common = ["--max-steps", "20"] + BATCH
    one = one_process_20_steps
    alike = ddp_job(gan, common + ["--no-distributed-sampler"], tmp_path / "alike", seeds=(7, 7))
    assert alike.summary()[0]["global step"] == "20", alike
    # Two optimizers stepped per batch: 20 global steps are 10 batches, losses logged every 2 steps.
    expected, got = logged_losses(one), logged_losses(alike)
    assert len(expected) >= 8 and got.keys() == expected.keys(), (expected, got)
    assert all(finite(str(v)) for v in expected.values()), expected
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=TOLERANCE, abs=TOLERANCE), key
    reference = load_checkpoint(last_checkpoint(one))["state_dict"]
    assert largest_difference(load_checkpoint(last_checkpoint(alike))["state_dict"], reference) <= TOLERANCE

    apart = ddp_job(gan, common + ["--no-distributed-sampler"], tmp_path / "apart", seeds=(7, 8))
    moved = largest_difference(load_checkpoint(last_checkpoint(apart))["state_dict"], reference)
    assert moved > 10 * TOLERANCE, f"rank 0 trained as if alone: weights within {moved} of one process's"
