"""The accuracy targets of the main job: 3 full epochs on all of Fashion-MNIST (slow: minutes).

The ddp runs keep the global batch at 64 (per-process batch 64 / processes), so they take the
same optimizer steps as the single-process run and must reach the same targets.
"""
import os
import socket
import subprocess
import sys
import time

import pytest

from volt_e2e import assert_ok, run_binary

TARGETS = [
    ("mlp", [], 0.87, 900),
    ("cnn", [], 0.90, 1500),
    ("mlp-ddp2", ["--strategy", "ddp", "--devices", "2", "--batch-size", "32"], 0.87, 900),
    # Mixed precision on CPU: steps under bfloat16 autocast, float32 weights.
    ("mlp-bf16mixed", ["--precision", "bf16-mixed"], 0.87, 900),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,extra,target,timeout", TARGETS, ids=[t[0] for t in TARGETS])
def test_reaches_target_accuracy(binary, dataset, tmp_path, name, extra, target, timeout):
    model = name.split("-")[0]
    run = run_binary(binary, ["--model", model, "--max-epochs", "3", "--seed", "1", "--no-progress-bar"] + extra,
                     tmp_path, timeout=timeout)
    assert_ok(run)
    fields, metrics = run.summary()
    assert fields["epochs completed"] == "3"
    accuracy = float(run.test_metrics()["test/acc"])
    # Shown with -rA / -s, and in CTest's log on failure.
    print(f"\n{name}: test/acc={accuracy:.4f} val/acc={metrics['val/acc']} in {run.seconds:.0f} s wall "
          f"(fit {fields['time']})", file=sys.stderr)
    assert accuracy >= target, f"{name} reached test/acc={accuracy} < {target} in {run.seconds:.0f} s"


@pytest.mark.slow
def test_two_nodes_under_an_external_launcher_reach_the_mlp_target(binary, dataset, tmp_path):
    """4 ranks as torchrun would start them (2 nodes x 2), global batch 4 x 16 = 64."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [binary, "--model", "mlp", "--max-epochs", "3", "--seed", "1", "--no-progress-bar", "--devices", "2",
            "--num-nodes", "2", "--batch-size", "16", "--default-root-dir", str(tmp_path)]
    start = time.monotonic()
    procs = []
    for rank in range(4):
        env = dict(os.environ, RANK=str(rank), GROUP_RANK=str(rank // 2), LOCAL_RANK=str(rank % 2),
                   LOCAL_WORLD_SIZE="2", WORLD_SIZE="4", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=1500) for p in procs]
    for p, (_, err) in zip(procs, outputs):
        assert p.returncode == 0, err
    report = outputs[0][0]
    line = next(l for l in report.splitlines() if l.startswith("test/acc"))
    accuracy = float(line.split()[1])
    print(f"\nmlp 2 nodes x 2 (torchrun variables): test/acc={accuracy:.4f} in {time.monotonic() - start:.0f} s",
          file=sys.stderr)
    assert accuracy >= 0.87
