"""ddp under a real SLURM cluster: a controller and two slurmd "nodes" on this machine, started by
scripts/slurm/slurm-up.sh (conftest.py). Jobs are submitted with sbatch.
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

from volt_testkit import require

ROOT = Path(__file__).resolve().parents[2]
PROBE = os.environ.get("VOLT_DDP_PROBE", "")
require(PROBE, "VOLT_DDP_PROBE is not set (run through ctest)")


def submit(cluster, tmp_path, body):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=2 --time=3\n"
                      f"#SBATCH --output={tmp_path}/job.out\nexport OMP_NUM_THREADS=1\n{body}\n")
    done = subprocess.run(["sbatch", "--wait", str(script)], env=cluster, capture_output=True, text=True, timeout=300)
    return done.returncode, (tmp_path / "job.out").read_text()


def test_srun_runs_two_nodes_of_two_ranks_that_match_one_process(cluster, tmp_path):
    (tmp_path / "one").mkdir()
    single = subprocess.run([PROBE, "--out", str(tmp_path / "one"), "--batch-size", "32", "--max-steps", "1"],
                            env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=120)
    assert single.returncode == 0, single.stderr
    (tmp_path / "ddp").mkdir()
    code, log = submit(cluster, tmp_path, f"srun {PROBE} --out {tmp_path}/ddp --devices 2 --num-nodes 2 "
                                          "--batch-size 8 --max-steps 1")
    assert code == 0, log
    reference = json.loads((tmp_path / "one" / "rank0.json").read_text())["params"]
    for rank in range(4):
        params = json.loads((tmp_path / "ddp" / f"rank{rank}.json").read_text())["params"]
        for name, values in reference.items():
            assert params[name] == pytest.approx(values, rel=1e-5, abs=1e-6)


def test_a_batch_script_without_srun_is_told_to_use_srun(cluster, tmp_path):
    code, log = submit(cluster, tmp_path, f"{PROBE} --out {tmp_path} --devices 2 --num-nodes 2 --max-steps 1")
    assert code != 0
    assert "start the program with `srun`" in log, log


def test_a_trainer_that_disagrees_with_the_allocation_names_both_sides(cluster, tmp_path):
    code, log = submit(cluster, tmp_path, f"srun {PROBE} --out {tmp_path} --devices 4 --num-nodes 2 --max-steps 1")
    assert code != 0
    assert "--ntasks-per-node=4" in log and "SLURM_NTASKS_PER_NODE=2" in log, log
