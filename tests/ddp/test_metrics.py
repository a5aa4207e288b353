"""Volt's metrics under ddp on CPU (Gloo): 1, 2 and 3 processes give one process's values.

Each test runs tests/ddp/metric_probe.cpp (path in VOLT_METRIC_PROBE) as N processes placed by
RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, as torchrun places them. Every rank builds the same data
set, updates the built-in metrics on its own contiguous, unpadded shard and writes the synced
values to rank<R>.json. The reference is the same program as one process over all the data.
"""
import json
import os
import subprocess
import time

import pytest

from volt_testkit import free_port, require

PROBE = os.environ.get("VOLT_METRIC_PROBE", "")
require(PROBE, "VOLT_METRIC_PROBE is not set (run through ctest)")


def env_for(rank, world, port):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "OMPI_", "PMI_")) and k not in
           ("RANK", "LOCAL_RANK", "GLOBAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update({"OMP_NUM_THREADS": "1", "RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port)})
    return env


def launch(out, world, args=(), hung=None, timeout=90):
    """Runs `world` probe processes; returns their (returncode, stderr) by rank (None for the rank
    `hung`, killed once the others have ended) and the seconds the others took."""
    port = free_port()
    start = time.monotonic()
    procs = [subprocess.Popen([PROBE, "--out", str(out)] + list(args), env=env_for(r, world, port),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for r in range(world)]
    results = [None] * world
    try:
        for r, p in enumerate(procs):
            if r != hung:
                _, err = p.communicate(timeout=timeout)
                results[r] = (p.returncode, err)
        elapsed = time.monotonic() - start
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return results, elapsed


def values(tmp_path, world, examples, seed=0):
    out = tmp_path / f"w{world}-seed{seed}"
    out.mkdir()
    results, _ = launch(out, world, ["--examples", str(examples), "--seed", str(seed)])
    for rank, (code, err) in enumerate(results):
        assert code == 0, f"rank {rank}: {err}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


# Counts (the confusion matrix) must match exactly; ratios of the same counts do too, but the
# squared errors are summed in another order per process: 1e-6 relative for floats.
@pytest.mark.parametrize("examples", [pytest.param(101, marks=pytest.mark.compat), 2])
def test_every_metric_under_2_and_3_processes_equals_one_process(tmp_path, examples):
    (reference,) = values(tmp_path, 1, examples)
    assert reference["examples"] == examples
    assert len(reference["values"]) == 14
    for world in (2, 3):
        ranks = values(tmp_path, world, examples)
        # Contiguous shards without padding: every example once (with 2 examples and 3
        # processes one process has none, and its empty cat states must still gather).
        assert sum(r["examples"] for r in ranks) == examples
        for r in ranks:
            for name, expected in reference["values"].items():
                got = r["values"][name]
                if isinstance(expected, list):
                    assert got == expected, f"{name} under {world} processes, rank {r['rank']}"
                else:
                    assert got == pytest.approx(expected, rel=1e-6, abs=1e-12), \
                        f"{name} under {world} processes, rank {r['rank']}: {got} != {expected}"


def test_the_values_depend_on_the_data(tmp_path):
    # Guards the equality test against a probe that ignores its data.
    (a,) = values(tmp_path, 1, 101, seed=0)
    (b,) = values(tmp_path, 1, 101, seed=1)
    differ = [name for name in a["values"] if a["values"][name] != b["values"][name]]
    assert len(differ) == len(a["values"]), f"same value for both seeds: {set(a['values']) - set(differ)}"


def test_the_confusion_matrix_counts_every_example_once(tmp_path):
    (r,) = values(tmp_path, 1, 101)
    assert sum(r["values"]["confusion_matrix"]) == 101


# A rank that leaves before compute() must fail the others within the (short) collective timeout,
# naming it; the default timeout (120 s) would be well past the bound.
@pytest.mark.parametrize("mode,world,missing", [pytest.param("exit", 3, 2, marks=pytest.mark.compat), ("exit", 2, 0), ("hang", 3, 1)])
def test_a_rank_that_never_computes_fails_the_others_naming_it(tmp_path, mode, world, missing):
    results, elapsed = launch(tmp_path, world, ["--fail-mode", mode, "--fail-rank", str(missing),
                                                "--timeout-ms", "3000"], hung=missing if mode == "hang" else None)
    for rank, result in enumerate(results):
        if rank == missing:
            continue
        code, err = result
        assert code != 0, f"rank {rank} succeeded without rank {missing}"
        assert f"rank {missing}" in err, f"rank {rank} exited with {code}: {err}"
        assert "compute()" in err, err
    assert elapsed < 45, elapsed
