"""A throwaway local SLURM cluster (scripts/slurm/slurm-up.sh: a controller and two slurmd "nodes" on
this machine) shared by the tests of this folder, and helpers to submit jobs and watch them.
Needs root (the daemons, and an /etc/hosts line so node1 resolves); tests skip themselves otherwise
(fail under CI=true: volt_testkit.require).
"""
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # volt_testkit, shared with the other folders

from volt_testkit import require  # noqa: E402


@pytest.fixture(scope="session")
def cluster():
    require(os.geteuid() == 0, "a local SLURM cluster needs root")
    directory = tempfile.mkdtemp(prefix="volt-slurm-")
    env = dict(os.environ, SLURM_LOCAL_PORT=os.environ.get("SLURM_LOCAL_PORT", "16917"))
    up = subprocess.run(["bash", str(ROOT / "scripts/slurm/slurm-up.sh"), directory], env=env, capture_output=True,
                        text=True, timeout=600)
    assert up.returncode == 0, up.stderr
    env["SLURM_CONF"] = f"{directory}/slurm.conf"
    env["OMP_NUM_THREADS"] = "1"
    yield env
    subprocess.run(["bash", str(ROOT / "scripts/slurm/slurm-down.sh"), directory], env=env, capture_output=True,
                   timeout=120)


def write_script(path, header, body):
    """A batch script: #SBATCH lines from `header` (a list), then `body`."""
    lines = ["#!/bin/bash"] + [f"#SBATCH {h}" for h in header] + ["export OMP_NUM_THREADS=1", body]
    path.write_text("\n".join(lines) + "\n")
    return path


def sbatch(cluster, script, *args):
    """Submits without waiting; returns the job id."""
    done = subprocess.run(["sbatch", "--parsable", *args, str(script)], env=cluster, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def job_fields(cluster, job_id):
    """`scontrol show job` as a dict (JobState, Restarts, ...); {} once SLURM forgot the job."""
    shown = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=cluster, capture_output=True, text=True,
                           timeout=30)
    if shown.returncode != 0:
        return {}
    return dict(re.findall(r"(\w+)=(\S*)", shown.stdout))


def wait_for_end(cluster, job_id, timeout):
    """Waits until the job (every task of an array) left the queue; returns its last fields."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        queued = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], env=cluster, capture_output=True,
                                text=True, timeout=30)
        if queued.returncode == 0 and not queued.stdout.strip():
            return job_fields(cluster, job_id)
        time.sleep(0.5)
    subprocess.run(["scancel", job_id], env=cluster, timeout=30)
    pytest.fail(f"job {job_id} did not end within {timeout} s: {job_fields(cluster, job_id)}")


def wait_for_text(path, text, count, timeout):
    """Waits until `text` occurs `count` times in the file at `path`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text(errors="replace").count(text) >= count:
            return
        time.sleep(0.1)
    pytest.fail(f"{text!r} did not appear {count} time(s) in {path} within {timeout} s:\n"
                f"{path.read_text(errors='replace') if path.exists() else '(no file)'}")
