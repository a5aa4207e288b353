"""Multi-process tests of volt::SyncBatchNorm on CPU (Gloo): N processes with parts of a batch
train as one process with the whole batch, and a rank that dies fails the others in bounded time.

Each test runs tests/ddp/syncbn_probe.cpp (path in VOLT_SYNCBN_PROBE) in fresh processes and reads
the per-rank JSON files it writes. The reference is one process with torch::nn::BatchNorm2d
(--norm plain): LibTorch's own BatchNorm on the whole batch, not the layer under test.
"""
import json
import os
import subprocess
import time

import pytest

from volt_testkit import free_port, require

PROBE = os.environ.get("VOLT_SYNCBN_PROBE", "")
require(PROBE, "VOLT_SYNCBN_PROBE is not set (run through ctest)")

# Float32 sums taken in another order (per rank, then across ranks) than one process takes them.
TOLERANCE = 1e-5
BATCH = 16
STEPS = 3


def env_for(rank=None, world=None, port=None):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    if world is not None:
        env.update({"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port)})
    return env


def start(out, world, args):
    port = free_port()
    return [subprocess.Popen([PROBE, "--out", str(out)] + args, env=env_for(r, world, port), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for r in range(world)]


def launch(out, world, args, timeout=120):
    procs = start(out, world, args)
    for r, p in enumerate(procs):
        _, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, f"rank {r}: {err}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def one_process(tmp_path, norm):
    out = tmp_path / f"one-{norm}"
    out.mkdir()
    proc = subprocess.run([PROBE, "--out", str(out), "--batch", str(BATCH), "--steps", str(STEPS), "--norm", norm],
                          env=env_for(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads((out / "rank0.json").read_text())


def assert_close(actual, expected, what):
    assert len(actual) == len(expected), what
    worst = max((abs(a - e) / max(1.0, abs(e)) for a, e in zip(actual, expected)), default=0.0)
    assert worst <= TOLERANCE, f"{what}: max relative difference {worst} > {TOLERANCE}"


def assert_matches_whole_batch(results, reference):
    # The first forward: every rank's rows of the output, in rank order, are the whole batch's.
    rows = [v for r in results for v in r["first_output"]]
    assert_close(rows, reference["first_output"], "first forward's outputs")
    for r in results:
        for step, (mine, theirs) in enumerate(zip(r["running"], reference["running"])):
            assert sorted(mine) == sorted(theirs)
            for name in theirs:
                assert_close(mine[name], theirs[name], f"rank {r['rank']} step {step} {name}")
        assert sorted(r["params"]) == sorted(reference["params"])
        for name in reference["params"]:
            assert_close(r["params"][name], reference["params"][name], f"rank {r['rank']} parameter {name}")


def test_one_process_syncbatchnorm_is_batchnorm2d_bit_for_bit(tmp_path):
    assert one_process(tmp_path, "sync") == one_process(tmp_path, "plain")


@pytest.mark.compat
def test_two_processes_with_half_a_batch_each_match_one_process_with_the_whole_batch(tmp_path):
    reference = one_process(tmp_path, "plain")
    results = launch(tmp_path, 2, ["--batch", str(BATCH), "--steps", str(STEPS)])
    assert [r["rows"] for r in results] == [[0, 8], [8, 8]]
    assert_matches_whole_batch(results, reference)


def test_unattached_layers_on_half_batches_do_not_match_so_the_comparison_can_fail(tmp_path):
    reference = one_process(tmp_path, "plain")
    results = launch(tmp_path, 2, ["--batch", str(BATCH), "--steps", str(STEPS), "--detached"])
    with pytest.raises(AssertionError, match="first forward's outputs"):
        assert_matches_whole_batch(results, reference)


def test_beside_ddps_gradient_reducer_two_processes_still_match_one_process(tmp_path):
    # c10d's Reducer all-reduces gradient buckets from autograd hooks while the layers' backward
    # collectives run in the same backward pass: both must keep one order on every rank.
    reference = one_process(tmp_path, "plain")
    results = launch(tmp_path, 2, ["--batch", str(BATCH), "--steps", str(STEPS), "--reducer"])
    assert_matches_whole_batch(results, reference)


def test_three_processes_with_uneven_shares_match_one_process(tmp_path):
    reference = one_process(tmp_path, "plain")
    results = launch(tmp_path, 3, ["--batch", str(BATCH), "--steps", str(STEPS), "--split", "7", "5", "4"])
    assert_matches_whole_batch(results, reference)


@pytest.mark.parametrize("mode", [pytest.param("kill", marks=pytest.mark.compat), "hang"])
def test_a_rank_lost_before_the_forward_collective_fails_the_other_in_bounded_time(tmp_path, mode):
    # A killed peer closes its connections (Gloo fails at once); a hung one is caught by the
    # collective timeout (3 s here, 120 s by default). Either way rank 0 must not hang.
    procs = start(tmp_path, 2, ["--batch", str(BATCH), "--timeout-ms", "3000", "--fail-mode", mode,
                                "--fail-rank", "1"])
    began = time.monotonic()
    _, err = procs[0].communicate(timeout=90)
    elapsed = time.monotonic() - began
    procs[1].kill()
    procs[1].communicate()
    assert procs[0].returncode != 0
    assert elapsed < 45, elapsed
    assert "SyncBatchNorm's all-reduce of the batch statistics (forward) failed while waiting for rank 1" in err, err
    assert "HINT:" in err
