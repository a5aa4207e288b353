"""The example under dp and ddp2 (issue #5): short MLP runs that must train and test like one process."""
import subprocess
import socket

import pytest

from volt_e2e import SHORT, assert_ok, run_binary


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dp_with_two_replicas_trains_and_tests(binary, dataset, tmp_path):
    run = run_binary(binary, ["--model", "mlp", "--max-epochs", "1", "--strategy", "dp", "--devices", "2",
                              "--seed", "1"] + SHORT, tmp_path)
    assert_ok(run)
    acc = float(run.test_metrics()["test/acc"])
    assert acc > 0.5, run  # 20 batches of MLP training: far above chance (0.1)


def test_dp_runs_the_batch_norm_cnn(binary, dataset, tmp_path):
    # BatchNorm updates its buffers in place in every replica's forward pass: the replicas take
    # turns and every replica's graph must still back-propagate.
    run = run_binary(binary, ["--model", "cnn", "--max-epochs", "1", "--strategy", "dp", "--devices", "2",
                              "--seed", "1", "--limit-train-batches", "5", "--limit-val-batches", "2",
                              "--limit-test-batches", "2", "--no-progress-bar"], tmp_path)
    assert_ok(run)


def test_ddp2_two_nodes_of_two_replicas_train_and_test(binary, dataset, tmp_path):
    port = free_port()
    args = [binary, "--model", "mlp", "--max-epochs", "1", "--strategy", "ddp2", "--devices", "2", "--num-nodes",
            "2", "--seed", "1", "--num-threads", "1"] + SHORT
    procs = []
    for node in range(2):
        root = tmp_path / f"node{node}"
        env = {"PATH": "/usr/bin:/bin", "NODE_RANK": str(node), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen(args + ["--default-root-dir", str(root)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err
    assert "ddp2" in outputs[0][0] or "Test metric" in outputs[0][0], outputs[0][0][-2000:]
