"""The example under the real mpirun (Open MPI from Debian, scripts/setup.sh installs it).

mpirun tells its ranks nothing about where to meet: Volt derives the port from Open MPI's job id and
uses the loopback address when every rank runs on this node, so the README's command needs no
variables. Two "nodes" cannot be shown on one machine: Open MPI counts every name of this host as
one node and would need ssh to start a second.
"""
import os
import shutil
import subprocess
import time

import pytest

from volt_e2e import DETERMINISTIC, SHORT, Run, assert_ok, cluster_free_env, run_binary
from volt_testkit import require

MPIRUN = shutil.which("mpirun")
require(MPIRUN is not None, "no mpirun on PATH (apt-get install openmpi-bin)")



def ddp_args(devices):
    return ["--model", "mlp", "--max-epochs", "1", "--strategy", "ddp", "--devices", str(devices)] + SHORT + \
        DETERMINISTIC


def mpirun(binary, args, root, np=2, timeout=300):
    root.mkdir(parents=True, exist_ok=True)
    command = [MPIRUN, "-np", str(np), "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")
    command += [binary] + args + ["--default-root-dir", str(root)]
    start = time.monotonic()
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=root,
                              env=cluster_free_env(OMP_NUM_THREADS="1"))
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{command} did not finish within {timeout} s:\n{e.stdout}\n{e.stderr}")
    return Run(command, root, proc, time.monotonic() - start)


@pytest.mark.compat
def test_one_node_of_two_ranks_needs_no_variables_and_matches_volts_launcher(binary, dataset, tmp_path):
    under_mpirun = mpirun(binary, ddp_args(2), tmp_path / "mpirun")
    assert_ok(under_mpirun)
    own = run_binary(binary, ddp_args(2), tmp_path / "own", env=cluster_free_env(OMP_NUM_THREADS="1"))
    assert_ok(own)
    # The same ranks, shards and steps: the same model, so the same test metrics to the last digit.
    assert under_mpirun.test_metrics() == own.test_metrics(), (under_mpirun, own)
    assert under_mpirun.summary()[0]["epochs completed"] == own.summary()[0]["epochs completed"] == "1"


def test_a_devices_count_that_differs_from_the_ranks_per_node_is_refused(binary, dataset, tmp_path):
    run = mpirun(binary, ddp_args(3), tmp_path / "bad", timeout=120)
    assert run.returncode != 0
    assert "devices=3" in run.stderr and "started 2 processes on this node" in run.stderr, run
