"""Multi-process tests of strategy='pipeline' over several nodes (pipeline x ddp) on CPU (Gloo):
each node's process runs the whole pipeline over its stage threads and is one data-parallel
replica. Runs tests/ddp/ddp_probe.cpp (VOLT_DDP_PROBE) with its layers in a volt::Pipe (--pipe),
the nodes started as a launcher would (NODE_RANK, MASTER_ADDR, MASTER_PORT).
"""
import subprocess
import time

import pytest

from test_ddp import PROBE, TOLERANCE, assert_close, clean_env, flat_params, ranks, run
from volt_testkit import free_port

ADAM = ["--optimizer", "adam", "--step-lr-gamma", "0.7", "--examples", "192", "--width", "16", "--pipe"]


def nodes(args, out, count=2, timeout=120):
    """Starts `count` nodes of one process each; returns their (returncode, stderr, seconds)."""
    out.mkdir(exist_ok=True)
    port = free_port()
    start = time.monotonic()
    procs = [subprocess.Popen([PROBE, "--out", str(out)] + args + ["--num-nodes", str(count)],
                              env=clean_env({"NODE_RANK": str(n), "MASTER_ADDR": "127.0.0.1",
                                             "MASTER_PORT": str(port)}),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for n in range(count)]
    results = []
    for p in procs:
        _, err = p.communicate(timeout=timeout)
        results.append((p.returncode, err, time.monotonic() - start))
    return results


@pytest.mark.parametrize("stages,chunks,schedule", [(2, 1, []), pytest.param(2, 4, [], marks=pytest.mark.compat), (3, 8, []),
                                                    (2, 4, ["--pipeline-schedule", "1f1b", "--micro-batch-loss"]),
                                                    (3, 8, ["--pipeline-schedule", "1f1b", "--micro-batch-loss"])],
                         ids=["2x1", "2x4", "3x8", "2x4-1f1b", "3x8-1f1b"])
def test_two_pipeline_replicas_match_ddp_and_one_process_on_the_global_batch(tmp_path, stages, chunks, schedule):
    steps = 4
    one = tmp_path / "one"
    one.mkdir()
    proc = run(ADAM + ["--batch-size", "16", "--max-steps", str(steps)], one)
    assert proc.returncode == 0, proc.stderr
    reference = ranks(one, 1)[0]
    ddp = tmp_path / "ddp"
    ddp.mkdir()
    proc = run(ADAM + ["--strategy", "ddp", "--devices", "2", "--batch-size", "8", "--max-steps", str(steps)], ddp)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "pipeline"
    for code, err, _ in nodes(ADAM + schedule + ["--strategy", "pipeline", "--devices", str(stages),
                                                 "--pipeline-chunks", str(chunks), "--batch-size", "8", "--max-steps",
                                                 str(steps)], out):
        assert code == 0, err
    results = ranks(out, 2)  # one process per node: ranks are nodes
    assert not set(results[0]["seen"]) & set(results[1]["seen"])  # the sampler shards by replica
    for r in results:
        assert r["global_step"] == steps
        assert_close(flat_params(r), flat_params(reference), TOLERANCE)
        assert_close(flat_params(r), flat_params(ranks(ddp, 2)[0]), TOLERANCE)
    # The all-reduced gradients keep the replicas equal to the bit.
    assert flat_params(results[0]) == flat_params(results[1])


@pytest.mark.compat
def test_a_resumed_pipeline_x_ddp_run_ends_bit_identical(tmp_path):
    common = ADAM + ["--strategy", "pipeline", "--devices", "2", "--pipeline-chunks", "4", "--batch-size", "8",
                     "--max-epochs", "2"]
    for code, err, _ in nodes(common, tmp_path / "straight"):
        assert code == 0, err
    root = tmp_path / "first_root"
    for code, err, _ in nodes(common + ["--max-steps", "5", "--enable-checkpointing", "--default-root-dir", str(root)],
                              tmp_path / "first"):
        assert code == 0, err
    checkpoint = next((root / "checkpoints").glob("*.ckpt"))
    for code, err, _ in nodes(common + ["--ckpt-path", str(checkpoint), "--default-root-dir", str(tmp_path / "root2")],
                              tmp_path / "second"):
        assert code == 0, err
    for whole, resumed in zip(ranks(tmp_path / "straight", 2), ranks(tmp_path / "second", 2)):
        assert resumed["global_step"] == whole["global_step"] == 24
        assert flat_params(resumed) == flat_params(whole)


def test_a_killed_pipeline_replica_stops_the_other_in_bounded_time(tmp_path):
    results = nodes(ADAM + ["--strategy", "pipeline", "--devices", "2", "--batch-size", "8", "--max-steps", "20",
                            "--fail-mode", "kill", "--fail-rank", "1", "--fail-step", "3", "--process-group-timeout",
                            "10"], tmp_path / "out")
    assert all(code != 0 for code, _, _ in results), results
    assert all(seconds < 60 for _, _, seconds in results), results
    # Any early crash would pass the lines above: node 1 must be the one that died (SIGKILL), and
    # node 0 must name it.
    (_, err0, _), (code1, _, _) = results
    assert code1 == -9, results
    assert "rank 1 never reached the failed collective" in err0, err0
