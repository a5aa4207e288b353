"""The accuracy targets of the main job: 3 full epochs on all of Fashion-MNIST (slow: minutes).

The ddp runs keep the global batch at 64 (ddp: 2 processes x 32; ddp2: 2 nodes x 32, each node's
batch split over its 2 replicas; 2 nodes x 2 processes x 16), so they take the same optimizer
steps as the single-process run and must reach the same targets.
"""
import os
import socket
import subprocess
import sys
import time

import pytest

from volt_e2e import Run, assert_ok, print_plan, run_binary

# (id, model, seed, strategy, its flags, nodes the test starts, target, time limit in s)
TARGETS = [
    ("mlp", "mlp", 1, "single_device", [], 1, 0.87, 900),
    ("cnn", "cnn", 1, "single_device", [], 1, 0.90, 1500),
    # ddp: Volt's launcher re-runs the binary for local rank 1.
    ("mlp-ddp", "mlp", 1, "ddp", ["--devices", "2", "--batch-size", "32"], 1, 0.87, 900),
    # ddp2: one process per node with 2 dp replicas (threads), ddp across the nodes; the test starts
    # both nodes' processes (NODE_RANK 0 and 1), as a cluster's per-node launch would. One intra-op
    # thread each: 2 processes x 2 replicas already fill 2 cores twice.
    ("mlp-ddp2", "mlp", 1, "ddp2", ["--devices", "2", "--num-nodes", "2", "--batch-size", "32", "--num-threads", "1"],
     2, 0.87, 900),
    # Mixed precision on CPU: steps under bfloat16 autocast, float32 weights.
    ("mlp-bf16mixed", "mlp", 1, "single_device", ["--precision", "bf16-mixed"], 1, 0.87, 900),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster_free_env(**extra):
    """This environment without any launcher's variables (SLURM, MPI, torchrun), plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "OMPI_", "PMI_")) and k not in
           ("RANK", "LOCAL_RANK", "GLOBAL_RANK", "NODE_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
            "MASTER_ADDR", "MASTER_PORT")}
    env.update(extra)
    return env


def node_env(node, port):
    """What Volt's launcher needs on each node outside a cluster launcher."""
    return cluster_free_env(NODE_RANK=str(node), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def run_processes(commands, timeout):
    """Starts every (argv, env, root) at once, as the processes of one job, and waits for all of
    them within `timeout` s in total (killing them all past it); returns their Runs, in order."""
    start = time.monotonic()
    started = [(argv, root, subprocess.Popen(argv, env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                             text=True)) for argv, env, root in commands]
    runs = []
    try:
        for argv, root, proc in started:
            out, err = proc.communicate(timeout=max(1.0, start + timeout - time.monotonic()))
            runs.append(Run(argv, root, subprocess.CompletedProcess(argv, proc.returncode, out, err),
                            time.monotonic() - start))
    except subprocess.TimeoutExpired:
        for _, _, proc in started:
            proc.kill()
        outputs = [proc.communicate() for _, _, proc in started]
        pytest.fail(f"{len(started)} processes did not finish within {timeout} s; the first one's stdout:\n"
                    f"{outputs[0][0][-4000:]}\nstderr:\n" + "\n".join(err[-2000:] for _, err in outputs))
    for run in runs:
        assert_ok(run)
    return runs


def run_nodes(binary, args, root, nodes, timeout):
    """One process per node, each with its own root folder; returns node 0's Run (rank 0 prints the
    summary and the test metrics)."""
    port = free_port()
    commands = []
    for node in range(nodes):
        node_root = root / f"node{node}"
        node_root.mkdir(parents=True)
        commands.append(([binary] + args + ["--default-root-dir", str(node_root)], node_env(node, port), node_root))
    return run_processes(commands, timeout)[0]


@pytest.mark.slow
@pytest.mark.parametrize("name,model,seed,strategy,extra,nodes,target,timeout", TARGETS, ids=[t[0] for t in TARGETS])
def test_reaches_target_accuracy(binary, dataset, tmp_path, name, model, seed, strategy, extra, nodes, target,
                                 timeout):
    args = ["--model", model, "--max-epochs", "3", "--seed", str(seed), "--no-progress-bar", "--strategy", strategy]
    args += extra
    # The run is what its id says (a case named ddp2 once ran ddp): ddp2 has one rank per node.
    plan = print_plan(binary, args, env=node_env(0, free_port()) if nodes > 1 else None)
    assert plan["strategy"] == strategy, plan
    if strategy == "ddp2":
        assert plan["devices x nodes"] == f"2 x {nodes} (world size {nodes})", plan
    if nodes == 1:
        run = run_binary(binary, args, tmp_path, timeout=timeout)
        assert_ok(run)
    else:
        run = run_nodes(binary, args, tmp_path, nodes, timeout)
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
    port = str(free_port())
    args = [binary, "--model", "mlp", "--max-epochs", "3", "--seed", "1", "--no-progress-bar", "--devices", "2",
            "--num-nodes", "2", "--batch-size", "16", "--default-root-dir", str(tmp_path)]
    commands = [(args, cluster_free_env(RANK=str(rank), GROUP_RANK=str(rank // 2), LOCAL_RANK=str(rank % 2),
                                        LOCAL_WORLD_SIZE="2", WORLD_SIZE="4", MASTER_ADDR="127.0.0.1",
                                        MASTER_PORT=port, OMP_NUM_THREADS="1"), tmp_path) for rank in range(4)]
    runs = run_processes(commands, 1500)
    accuracy = float(runs[0].test_metrics()["test/acc"])
    print(f"\nmlp 2 nodes x 2 (torchrun variables): test/acc={accuracy:.4f} in {runs[-1].seconds:.0f} s",
          file=sys.stderr)
    assert accuracy >= 0.87
