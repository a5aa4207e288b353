"""The example under dp and ddp2 (issue #5): short MLP runs that must train and test like one process.
What shows that the strategy ran: the plan the binary resolves for the same flags and environment
(--print-plan, the Trainer's RunPlan, which the run executes), and, for ddp2, that the two nodes'
processes formed one process group (only rank 0 reports)."""
import subprocess

import pytest

from volt_e2e import SHORT, assert_ok, parse_table, print_plan, run_binary
from volt_testkit import free_port


def assert_dp_plan(binary, args):
    plan = print_plan(binary, args)
    assert plan["strategy"] == "dp", plan
    assert plan["devices x nodes"] == "2 x 1 (world size 1)", plan
    assert plan["replicas per process"].startswith("2 "), plan


def test_dp_with_two_replicas_trains_and_tests(binary, dataset, tmp_path):
    args = ["--model", "mlp", "--max-epochs", "1", "--strategy", "dp", "--devices", "2", "--seed", "1"] + SHORT
    assert_dp_plan(binary, args)
    run = run_binary(binary, args, tmp_path)
    assert_ok(run)
    assert run.summary()[0]["global step"] == "20", run
    acc = float(run.test_metrics()["test/acc"])
    assert acc > 0.5, run  # 20 batches of MLP training: far above chance (0.1)


@pytest.mark.compat
def test_dp_runs_the_batch_norm_cnn(binary, dataset, tmp_path):
    # BatchNorm updates its buffers in place in every replica's forward pass: the replicas take
    # turns and every replica's graph must still back-propagate.
    args = ["--model", "cnn", "--max-epochs", "1", "--strategy", "dp", "--devices", "2", "--seed", "1",
            "--limit-train-batches", "5", "--limit-val-batches", "2", "--limit-test-batches", "2", "--no-progress-bar"]
    assert_dp_plan(binary, args)
    run = run_binary(binary, args, tmp_path)
    assert_ok(run)
    assert run.summary()[0]["global step"] == "5", run


def test_ddp2_two_nodes_of_two_replicas_train_and_test(binary, dataset, tmp_path):
    port = free_port()
    flags = ["--model", "mlp", "--max-epochs", "1", "--strategy", "ddp2", "--devices", "2", "--num-nodes", "2",
             "--seed", "1"] + SHORT
    envs = [{"PATH": "/usr/bin:/bin", "NODE_RANK": str(node), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
            for node in range(2)]
    # ddp2: one process per node (a rank per node, 2 in all) with 2 dp replicas each, not ddp's 2 x 2.
    for node, env in enumerate(envs):
        plan = print_plan(binary, flags, env=env)
        assert plan["strategy"] == "ddp2", plan
        assert plan["devices x nodes"] == "2 x 2 (world size 2)", plan
        assert plan["replicas per process"].startswith("2 "), plan
        assert plan["rank"] == f"global {node} / local 0 / node {node}", plan
    procs = []
    for node, env in enumerate(envs):
        root = tmp_path / f"node{node}"
        procs.append(subprocess.Popen([binary] + flags + ["--num-threads", "1", "--default-root-dir", str(root)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err
    # The nodes joined one group: rank 0 reports the fit and the test, rank 1 (node 1) does not, as
    # it would had it trained on its own.
    rank0, rank1 = outputs[0][0], outputs[1][0]
    assert "Fit summary" in rank0 and "Test metric" in rank0, rank0[-2000:]
    assert "Fit summary" not in rank1 and "Test metric" not in rank1, rank1[-2000:]
    assert float(parse_table(rank0, "Test metric")["test/acc"]) > 0.5, rank0[-2000:]
