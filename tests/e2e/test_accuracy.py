"""The accuracy targets of the main job: 3 full epochs on all of Fashion-MNIST (slow: minutes).

The ddp runs keep the global batch at 64 (ddp: 2 processes x 32; ddp2: 2 nodes x 32, each node's
batch split over its 2 replicas; 2 nodes x 2 processes x 16), so they take the same optimizer
steps as the single-process run and must reach the same targets.

Every process runs 1 intra-op thread (--num-threads 1). Its result then does not depend on the
machine's core count (the default, a thread per core, sums in another order), so the margins below
hold on any machine with the same LibTorch; and on a loaded 2-core machine the default 2 OpenMP
threads made the MLP run take 40 to 370 s instead of 6 to 10 s.

Measured (2-core machine, LibTorch 1.13): `build/examples/fashion_mnist --model mlp --max-epochs 3
--seed S --num-threads 1 --no-progress-bar` plus each case's flags; test accuracy in %:

    seed                     1      2      3      4      5
    mlp                    87.40  87.67  87.67  88.20  87.93
    mlp-ddp                87.17  87.80  87.82
    mlp-ddp2               87.31  87.62  87.79
    mlp-bf16mixed          87.15  87.68  87.64
    mlp 2x2 (torchrun)     87.33  87.80
    mlp-fsdp                      87.69
    mlp-fsdp full_shard           88.14
    mlp-pipeline                  87.78
    cnn                    90.77  91.33

Seed 1 is the lowest of the five for the MLP and leaves only 0.15 to 0.4 points over the 87% target;
seeds 2 and 3 are the median. The MLP cases therefore run seed 2 (seed 3 of the plain MLP, which
tested no other mechanism, no longer runs: CI runs each mechanism once),
which clears 87% by 0.6 points or more in every case, more than the seed-to-seed spread around the
median (about 0.3 points), which is also what another summation order (another LibTorch or CPU)
moves a result by. The CNN keeps seed 1: 90.77% against 90%.

CI runs each mechanism's target once: the plain MLP, ddp, the PNG folder and the CNN, and bf16-mixed
for one epoch against 32-true (its 3-epoch run took 125 s of training against 8 s for 32-true here:
LibTorch 1.13's bfloat16 matrix products are slow on a CPU without AVX-512 BF16, such as this AMD
EPYC's AVX2).
The other strategies' runs (ddp2, fsdp, fsdp full_shard, pipeline, 2 nodes x 2 under torchrun's
variables) and bf16-mixed's 3 epochs are marked `long` (`ctest -L long`, e2e_accuracy_strategies): each of those strategies is
proven equal to one process on the same global batch, step by step, by its multi-process test
(tests/ddp: within 1e-5 after k steps), so its 3-epoch run could only fail where the plain MLP's
does; they cost CI some 300 s of CPU on a loaded 2-core machine (stop 38).
"""
import subprocess
import sys
import time
from pathlib import Path

import pytest

from volt_e2e import Run, assert_ok, cluster_free_env, print_plan, run_binary
from volt_testkit import free_port

ONE_THREAD = ["--num-threads", "1"]

# (id, model, seed, strategy, its flags, nodes the test starts, target, time limit in s). The limits
# are 4 to 12 times what each run took on a 2-core machine at load 4 to 9 (mlp 10 s, cnn 200 s, ddp
# 40 s, ddp2 150 s before its replica threads kept one OpenMP thread each, 31 s since, bf16-mixed
# 185 s, 2x2 torchrun 50 s), so a hung run fails before CTest's limit.
TARGETS = [
    ("mlp-seed2", "mlp", 2, "single_device", [], 1, 0.87, 120),
    ("cnn", "cnn", 1, "single_device", [], 1, 0.90, 900),
    # ddp: Volt's launcher re-runs the binary for local rank 1.
    ("mlp-ddp", "mlp", 2, "ddp", ["--devices", "2", "--batch-size", "32"], 1, 0.87, 300),
    # ddp2: one process per node with 2 dp replicas (threads), ddp across the nodes; the test starts
    # both nodes' processes (NODE_RANK 0 and 1), as a cluster's per-node launch would.
    pytest.param("mlp-ddp2", "mlp", 2, "ddp2", ["--devices", "2", "--num-nodes", "2", "--batch-size", "32"], 2, 0.87,
                 600, marks=pytest.mark.long),
    # Mixed precision on CPU: steps under bfloat16 autocast, float32 weights.
    # (long: 125 s of training on a CPU without AVX-512 BF16; CI runs the one-epoch comparison below.)
    pytest.param("mlp-bf16mixed", "mlp", 2, "single_device", ["--precision", "bf16-mixed"], 1, 0.87, 750,
                 marks=pytest.mark.long),
    # fsdp (shard_grad_op): ddp's batches, gradients and Adam's state split over the 2 processes (17 s).
    pytest.param("mlp-fsdp", "mlp", 2, "fsdp", ["--devices", "2", "--batch-size", "32"], 1, 0.87, 300,
                 marks=pytest.mark.long),
    # fsdp full_shard: each Linear a volt::FsdpUnit, its weights gathered for its forward and
    # backward only (32 s beside a build).
    pytest.param("mlp-fsdp-full-shard", "mlp", 2, "fsdp", ["--devices", "2", "--batch-size", "32",
                                                            "--sharding-strategy", "full_shard"], 1, 0.87, 300,
                 marks=pytest.mark.long),
    # pipeline: the MLP's layers in 2 stages on threads, 8 micro-batches of 8 (10 s).
    pytest.param("mlp-pipeline", "mlp", 2, "pipeline", ["--devices", "2"], 1, 0.87, 600, marks=pytest.mark.long),
]


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
@pytest.mark.parametrize("name,model,seed,strategy,extra,nodes,target,timeout", TARGETS,
                         ids=[(t.values if hasattr(t, "values") else t)[0] for t in TARGETS])
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
        run = run_binary(binary, args + ONE_THREAD, tmp_path, timeout=timeout)
        assert_ok(run)
    else:
        run = run_nodes(binary, args + ONE_THREAD, tmp_path, nodes, timeout)
    fields, metrics = run.summary()
    assert fields["epochs completed"] == "3"
    accuracy = float(run.test_metrics()["test/acc"])
    # Shown with -rA / -s, and in CTest's log on failure.
    print(f"\n{name}: test/acc={accuracy:.4f} val/acc={metrics['val/acc']} in {run.seconds:.0f} s wall "
          f"(fit {fields['time']})", file=sys.stderr)
    assert accuracy >= target, f"{name} reached test/acc={accuracy} < {target} in {run.seconds:.0f} s"


@pytest.mark.slow
def test_bf16_mixed_trains_one_epoch_as_well_as_32_true(binary, dataset, tmp_path):
    """bfloat16 autocast over float32 weights learns what float32 learns: one epoch of seed 2 under
    each. Measured (2-core machine, LibTorch 1.13), test accuracy after one epoch, 32-true /
    bf16-mixed: seed 1 84.79 / 85.69%, seed 2 85.11 / 85.17%, seed 3 84.55 / 84.24%; the epoch's
    training loss agrees to 0.001. A bf16 path that lost its float32 master weights or its loss
    precision falls behind by more than a point (rounding every update to 8 bits of mantissa stalls
    Adam's small steps)."""
    runs = {}
    for precision in ("32-true", "bf16-mixed"):
        args = ["--model", "mlp", "--max-epochs", "1", "--seed", "2", "--no-progress-bar", "--precision", precision]
        assert print_plan(binary, args)["precision"].split(" ")[0] == precision
        run = run_binary(binary, args + ONE_THREAD, tmp_path / precision, timeout=400)
        assert_ok(run)
        runs[precision] = run
    accuracy = {p: float(r.test_metrics()["test/acc"]) for p, r in runs.items()}
    loss = {p: float(r.summary()[1]["train/loss_epoch"]) for p, r in runs.items()}
    print(f"\none epoch: test/acc {accuracy}, train/loss_epoch {loss}", file=sys.stderr)
    assert accuracy["bf16-mixed"] >= 0.84, accuracy
    assert accuracy["bf16-mixed"] >= accuracy["32-true"] - 0.01, accuracy
    assert abs(loss["bf16-mixed"] - loss["32-true"]) < 0.01, loss


@pytest.mark.slow
@pytest.mark.long
def test_two_nodes_under_an_external_launcher_reach_the_mlp_target(binary, dataset, tmp_path):
    """4 ranks as torchrun would start them (2 nodes x 2), global batch 4 x 16 = 64."""
    port = str(free_port())
    args = [binary, "--model", "mlp", "--max-epochs", "3", "--seed", "2", "--no-progress-bar", "--devices", "2",
            "--num-nodes", "2", "--batch-size", "16", "--default-root-dir", str(tmp_path)]
    commands = [(args, cluster_free_env(RANK=str(rank), GROUP_RANK=str(rank // 2), LOCAL_RANK=str(rank % 2),
                                        LOCAL_WORLD_SIZE="2", WORLD_SIZE="4", MASTER_ADDR="127.0.0.1",
                                        MASTER_PORT=port, OMP_NUM_THREADS="1"), tmp_path) for rank in range(4)]
    runs = run_processes(commands, 300)
    accuracy = float(runs[0].test_metrics()["test/acc"])
    print(f"\nmlp 2 nodes x 2 (torchrun variables): test/acc={accuracy:.4f} in {runs[-1].seconds:.0f} s",
          file=sys.stderr)
    assert accuracy >= 0.87


@pytest.mark.slow
def test_training_from_the_exported_png_folder_reaches_the_mlp_target(binary, dataset, tmp_path):
    """The same 3 epochs from PNG files (scripts/export-fashion-mnist-images.py), decoded per batch
    by 2 loader threads. The folder lists the images by class, so the split and order differ from
    the IDX runs; test accuracy over seeds 1, 2, 3: 87.89%, 87.63%, 87.95% (13-15 s each on 2
    cores): seed 1, the median, clears 87% by 0.89 points."""
    export = subprocess.run([str(Path(__file__).resolve().parents[2] / "scripts" / "export-fashion-mnist-images.py"),
                             str(tmp_path / "png")], capture_output=True, text=True, timeout=600)
    assert export.returncode == 0, export.stderr
    run = run_binary(binary, ["--model", "mlp", "--max-epochs", "3", "--seed", "1", "--no-progress-bar", "--data-dir",
                              str(tmp_path / "png"), "--num-workers", "2"] + ONE_THREAD, tmp_path / "run", timeout=300)
    assert_ok(run)
    accuracy = float(run.test_metrics()["test/acc"])
    print(f"\nmlp from PNG files: test/acc={accuracy:.4f} in {run.seconds:.0f} s", file=sys.stderr)
    assert accuracy >= 0.87
