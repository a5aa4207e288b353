"""Multi-process tests of strategy='fsdp' on CPU (Gloo): shard_grad_op against ddp and one process,
the optimizer state each process holds, checkpoints that move between strategies, exact resume,
failures and refusals. Runs tests/ddp/ddp_probe.cpp (VOLT_DDP_PROBE) like test_ddp.py.
"""
import signal
import subprocess
import time

import pytest

from test_ddp import PROBE, TOLERANCE, assert_close, external_env, flat_params, free_port, ranks, run

pytestmark = pytest.mark.skipif(not PROBE, reason="VOLT_DDP_PROBE is not set (run through ctest)")

# Adam with a per-step StepLR, clipping by a norm the gradients exceed (so the norm over all
# shards decides), 192 examples: 12 steps of 8 x 2 processes per epoch. The hidden layer is 16
# wide (161 parameters), so every process owns pieces of several tensors.
ADAM = ["--optimizer", "adam", "--step-lr-gamma", "0.7", "--gradient-clip-val", "0.05", "--examples", "192",
        "--width", "16"]


def fit(tmp_path, name, args):
    out = tmp_path / name
    out.mkdir()
    proc = run(args, out)
    assert proc.returncode == 0, proc.stderr
    return out, proc


@pytest.mark.parametrize("processes", [2, 3, 4])
def test_shard_grad_op_matches_ddp_and_one_process_with_adam_a_scheduler_and_clipping(tmp_path, processes):
    steps = 3
    one, _ = fit(tmp_path, "one", ADAM + ["--batch-size", str(8 * processes), "--max-steps", str(steps)])
    common = ADAM + ["--devices", str(processes), "--batch-size", "8", "--max-steps", str(steps)]
    ddp, _ = fit(tmp_path, "ddp", common + ["--strategy", "ddp"])
    fsdp, _ = fit(tmp_path, "fsdp", common + ["--strategy", "fsdp"])
    reference = ranks(one, 1)[0]
    ddp_results = ranks(ddp, processes)
    results = ranks(fsdp, processes)
    for r in results:
        assert r["global_step"] == steps
        assert_close(flat_params(r), flat_params(reference), TOLERANCE)
        assert_close(flat_params(r), flat_params(ddp_results[0]), TOLERANCE)
        # The all-gather gives every process the same model, to the bit.
        assert flat_params(r) == flat_params(results[0])
    # Adam keeps exp_avg and exp_avg_sq per parameter element: ddp holds all of them on every
    # process, fsdp each process its chunk (161 values padded to a multiple of N).
    whole = ddp_results[0]["optimizer_state_numel"]
    assert whole == 2 * 161
    held = [r["optimizer_state_numel"] for r in results]
    assert sum(held) == whole
    assert max(held) <= 2 * -(-161 // processes)


def test_shard_grad_op_with_accumulation_matches_ddp(tmp_path):
    common = ADAM + ["--devices", "2", "--batch-size", "8", "--max-steps", "3", "--accumulate-grad-batches", "2"]
    ddp, _ = fit(tmp_path, "ddp", common + ["--strategy", "ddp"])
    fsdp, _ = fit(tmp_path, "fsdp", common + ["--strategy", "fsdp"])
    for a, b in zip(ranks(fsdp, 2), ranks(ddp, 2)):
        assert a["global_step"] == 3
        assert_close(flat_params(a), flat_params(b), TOLERANCE)


def test_shard_grad_op_under_bf16_mixed_matches_ddp(tmp_path):
    # bfloat16 compute under autocast on float32 parameters: the pieces are the float32 master shard.
    common = ADAM + ["--devices", "2", "--batch-size", "8", "--max-steps", "3", "--precision", "bf16-mixed"]
    ddp, _ = fit(tmp_path, "ddp", common + ["--strategy", "ddp"])
    fsdp, _ = fit(tmp_path, "fsdp", common + ["--strategy", "fsdp"])
    for a, b in zip(ranks(fsdp, 2), ranks(ddp, 2)):
        assert_close(flat_params(a), flat_params(b), TOLERANCE)


def test_no_shard_is_ddp_to_the_bit(tmp_path):
    common = ADAM + ["--devices", "2", "--batch-size", "8", "--max-steps", "4"]
    ddp, _ = fit(tmp_path, "ddp", common + ["--strategy", "ddp"])
    fsdp, _ = fit(tmp_path, "fsdp", common + ["--strategy", "fsdp", "--sharding-strategy", "no_shard"])
    for a, b in zip(ranks(fsdp, 2), ranks(ddp, 2)):
        assert flat_params(a) == flat_params(b)
        assert a["optimizer_state_numel"] == b["optimizer_state_numel"] == 2 * 161


def checkpoint_after(tmp_path, name, args, steps):
    root = tmp_path / (name + "_root")
    out, _ = fit(tmp_path, name, args + ["--max-steps", str(steps), "--enable-checkpointing", "--default-root-dir",
                                         str(root)])
    checkpoints = sorted((root / "checkpoints").glob("*.ckpt"))
    assert len(checkpoints) == 1, checkpoints
    return checkpoints[0]


def test_a_resumed_shard_grad_op_run_ends_bit_identical_to_an_uninterrupted_one(tmp_path):
    common = ADAM + ["--strategy", "fsdp", "--devices", "2", "--batch-size", "8", "--max-epochs", "2"]
    straight, _ = fit(tmp_path, "straight", common)
    checkpoint = checkpoint_after(tmp_path, "first", common, 5)  # inside epoch 0 (12 steps)
    second, _ = fit(tmp_path, "second", common + ["--ckpt-path", str(checkpoint), "--default-root-dir",
                                                   str(tmp_path / "root2")])
    for whole, resumed in zip(ranks(straight, 2), ranks(second, 2)):
        assert resumed["global_step"] == whole["global_step"] == 24
        assert flat_params(resumed) == flat_params(whole)


@pytest.mark.parametrize("first,second", [
    (["--strategy", "fsdp", "--devices", "2", "--batch-size", "8"], ["--batch-size", "16"]),
    (["--strategy", "ddp", "--devices", "2", "--batch-size", "8"],
     ["--strategy", "fsdp", "--devices", "2", "--batch-size", "8"]),
    (["--strategy", "fsdp", "--devices", "2", "--batch-size", "8"],
     ["--strategy", "ddp", "--devices", "2", "--batch-size", "8"]),
], ids=["fsdp-to-one-process", "ddp-to-fsdp", "fsdp-to-ddp"])
def test_a_checkpoint_moves_between_fsdp_ddp_and_one_process(tmp_path, first, second):
    """The checkpoint holds the whole optimizer state (gathered on rank 0), so another strategy
    resumes it and ends where an uninterrupted run of the first strategy ends."""
    common = ADAM + ["--max-epochs", "1"]
    straight, _ = fit(tmp_path, "straight", common + first)
    checkpoint = checkpoint_after(tmp_path, "first", common + first, 3)
    resumed, _ = fit(tmp_path, "second", common + second + ["--ckpt-path", str(checkpoint), "--default-root-dir",
                                                             str(tmp_path / "root2")])
    whole = ranks(straight, 1)[0]
    after = ranks(resumed, 1)[0]
    assert after["global_step"] == whole["global_step"] == 12
    assert_close(flat_params(after), flat_params(whole), TOLERANCE)


def slurm_job(args, out, root, stop=False):
    """Runs the probe as the 2 tasks of a SLURM job step (the job's variables, as srun sets them)
    that writes into `root`; with `stop`, sends both tasks SIGTERM once epoch 0's metrics exist, as
    SLURM does when the time is up. Returns the tasks' rank files."""
    out.mkdir()
    port = free_port()
    argv = [PROBE, "--out", str(out)] + args + ["--default-root-dir", str(root)]
    procs = [subprocess.Popen(argv, env=external_env("slurm", r, 2, 2, port), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    if stop:
        # Once epoch 0's metrics are written both ranks train; 19 epochs of sleeping steps remain.
        # (A SLURM job's log version is its job id.)
        def written():
            return any(root.glob("lightning_logs/*/metrics.csv"))
        deadline = time.monotonic() + 120
        while not written() and all(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert written(), [p.communicate()[1] for p in procs]
        for p in procs:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    return ranks(out, 2)


def test_sigterm_saves_an_hpc_checkpoint_that_the_restarted_job_resumes_bit_identical(tmp_path):
    """What a SLURM job does when its time is up: SIGTERM, every rank stops at the same step and they
    save an HPC checkpoint with the gathered optimizer state; the restarted job resumes from it on
    its own and ends where a job that was never stopped ends."""
    common = ADAM + ["--strategy", "fsdp", "--devices", "2", "--batch-size", "8", "--max-epochs", "20",
                     "--step-sleep-ms", "25", "--no-auto-requeue", "--checkpoint-on-sigterm", "--logger",
                     "--log-every-n-steps", "1"]
    straight = slurm_job(common, tmp_path / "straight", tmp_path / "straight_root")
    root = tmp_path / "root"
    stopped = slurm_job(common, tmp_path / "stopped", root, stop=True)
    assert 0 < stopped[0]["global_step"] == stopped[1]["global_step"] < 240
    assert len(list(root.glob("hpc_ckpt_*.ckpt"))) == 1
    resumed = slurm_job(common, tmp_path / "resumed", root)
    for whole, again in zip(straight, resumed):
        assert again["global_step"] == whole["global_step"] == 240
        assert flat_params(again) == flat_params(whole)


def test_a_rank_killed_under_fsdp_stops_every_process(tmp_path):
    proc = run(ADAM + ["--strategy", "fsdp", "--devices", "2", "--max-steps", "20", "--fail-mode", "kill",
                       "--fail-rank", "1", "--fail-step", "3"], tmp_path, timeout=110)
    assert proc.returncode != 0
    assert proc.elapsed < 60
    assert "local rank 1" in proc.stderr and "signal 9" in proc.stderr, proc.stderr


def test_a_hung_rank_under_fsdp_fails_the_others_at_the_collective_timeout(tmp_path):
    proc = run(ADAM + ["--strategy", "fsdp", "--devices", "2", "--max-steps", "20", "--fail-mode", "hang",
                       "--fail-rank", "1", "--fail-step", "2", "--process-group-timeout", "5"], tmp_path, timeout=110)
    assert proc.returncode != 0
    assert proc.elapsed < 60, proc.stderr


@pytest.mark.parametrize("args,expected", [
    (["--strategy", "fsdp", "--sharding-strategy", "full_shard"], "not built yet"),
    (["--strategy", "ddp", "--sharding-strategy", "no_shard"], "an option of strategy='fsdp'"),
    (["--strategy", "fsdp", "--sharding-strategy", "zero3"], "sharding_strategy='zero3' is not supported"),
    (["--strategy", "fsdp", "--unfreeze-hidden-at", "1", "--max-epochs", "2"], "laid out the"),
], ids=["full-shard", "not-fsdp", "unknown", "unfreeze"])
def test_what_fsdp_cannot_run_is_refused_with_a_hint(tmp_path, args, expected):
    proc = run(["--devices", "2", "--max-steps", "8"] + args, tmp_path, timeout=110)
    assert proc.returncode != 0
    assert expected in proc.stderr, proc.stderr
    assert "HINT" in proc.stderr
