"""The example under the real torchrun of PyPI's torch 2.x (scripts/setup.sh installs it into
VOLT_TORCHRUN_PYTHONPATH, a folder of its own; /usr/bin/python3 keeps Debian's torch 1.13).

torchrun 2.x serves a TCPStore on MASTER_PORT itself and tells its workers to use it
(TORCHELASTIC_USE_AGENT_STORE=True). A LibTorch 2.x build of Volt joins that store; the Debian
build (LibTorch 1.13, whose client cannot talk to torch 2.x's libuv store) serves its own beside
it. Either way the README's commands need no extra variables, and every layout ends with the same
parameters as Volt's own launcher: same ranks, same shards, same steps.
"""
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from volt_e2e import (DETERMINISTIC, SHORT, Run, assert_ok, cluster_free_env, load_checkpoint, merge_flags, run_binary,
                      whole_state_dict)
from volt_testkit import free_port, require

TORCHRUN_PYTHONPATH = Path(os.environ.get("VOLT_TORCHRUN_PYTHONPATH", "/opt/volt/python-torchrun"))
CUDA_LIBRARIES = Path("/usr/local/cuda/lib64")


def torchrun_env():
    env = cluster_free_env(OMP_NUM_THREADS="1", PYTHONPATH=str(TORCHRUN_PYTHONPATH))
    if CUDA_LIBRARIES.is_dir():
        env["LD_LIBRARY_PATH"] = ":".join(filter(None, [str(CUDA_LIBRARIES), env.get("LD_LIBRARY_PATH")]))
    return env


@pytest.fixture(scope="module")
def torchrun():
    """The command that starts torchrun 2.x. Missing is a failure (CI must run these tests); a
    machine without the CUDA toolkit, which PyPI's torch wheel loads, is a skip (a failure on CI)."""
    if not (TORCHRUN_PYTHONPATH / "torch").is_dir():
        pytest.fail(f"torch 2.x is not installed in {TORCHRUN_PYTHONPATH}: run scripts/setup.sh "
                    "(or set VOLT_TORCHRUN_PYTHONPATH to a folder holding PyPI's torch)")
    require(CUDA_LIBRARIES.is_dir(),
            f"PyPI's torch wheel needs the CUDA toolkit's libraries ({CUDA_LIBRARIES} is missing)")
    probe = subprocess.run(["/usr/bin/python3", "-c", "import torch, torch.distributed.run; print(torch.__version__)"],
                           capture_output=True, text=True, env=torchrun_env(), timeout=120)
    assert probe.returncode == 0, f"torch 2.x from {TORCHRUN_PYTHONPATH} does not import:\n{probe.stderr}"
    assert probe.stdout.startswith("2."), probe.stdout
    return ["/usr/bin/python3", "-m", "torch.distributed.run"]


STANDALONE_TWO = ["--standalone", "--nnodes=1", "--nproc-per-node=2"]


def train_args(devices, num_nodes=1):
    return ["--model", "mlp", "--max-epochs", "1", "--strategy", "ddp", "--devices", str(devices), "--num-nodes",
            str(num_nodes), "--no-test"] + SHORT + DETERMINISTIC


def start_torchrun(torchrun, binary, launcher_args, args, root, log, env=None):
    command = torchrun + launcher_args + ["--no-python", binary] + args + ["--default-root-dir", str(root)]
    return command, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, cwd=root,
                                     env=env or torchrun_env())


def run_torchrun(torchrun, binary, root, agents, devices, num_nodes=1, timeout=240, extra=(), envs=None):
    """Starts one torchrun per entry of `agents` (its launcher flags), each running the example with
    `devices` x `num_nodes` and the flags `extra`, which replace train_args' own (agent i in
    `envs[i]`, when given), and waits for all of them."""
    root.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    procs = []
    for i, launcher_args in enumerate(agents):
        log = open(root / f"torchrun-{i}-{time.monotonic_ns()}.log", "w")
        procs.append((start_torchrun(torchrun, binary, list(launcher_args),
                                     merge_flags(train_args(devices, num_nodes), list(extra)), root, log,
                                     envs[i] if envs else None), log))
    outcomes = []
    for (command, proc), log in procs:
        try:
            proc.wait(timeout=max(1, timeout - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            for (_, other), _ in procs:
                other.kill()
            pytest.fail(f"{command} did not finish within {timeout} s:\n{Path(log.name).read_text()[-4000:]}")
        log.close()
        outcomes.append(Run(command, root, subprocess.CompletedProcess(command, proc.returncode,
                                                                       Path(log.name).read_text(), ""),
                            time.monotonic() - start))
    return outcomes


@pytest.fixture(scope="module")
def own_launcher(binary, tmp_path_factory):
    """The parameters after Volt's own launcher trained 2 processes on this node."""
    root = tmp_path_factory.mktemp("own")
    run = run_binary(binary, train_args(2), root, env=cluster_free_env(OMP_NUM_THREADS="1"))
    assert_ok(run)
    return load_checkpoint(run.version_dir() / "checkpoints" / "last.ckpt")["state_dict"]


def assert_same_parameters(root, expected):
    assert_same_parameters_at(root / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt", expected)


def assert_same_parameters_at(path, expected):
    import torch

    ours = load_checkpoint(path)["state_dict"]
    assert list(ours) == list(expected)
    different = [name for name in ours if not torch.equal(ours[name], expected[name])]
    assert not different, f"parameters differ from Volt's own launcher: {different}"


def check(runs, root, expected):
    # torchrun exits non-zero when a worker failed. (Its agents may still log a Traceback from
    # their exit barrier when the agent holding the store leaves first: torchrun's, not Volt's.)
    for run in runs:
        assert run.returncode == 0, run
    assert any("stopped: max_epochs after 1 epoch" in run.stdout for run in runs), runs
    assert_same_parameters(root, expected)


@pytest.mark.compat
def test_standalone_one_node_of_two(torchrun, binary, dataset, own_launcher, tmp_path):
    """The README's command: --standalone (a c10d rendezvous with the agent's store)."""
    runs = run_torchrun(torchrun, binary, tmp_path, [STANDALONE_TWO], devices=2)
    check(runs, tmp_path, own_launcher)


def test_two_nodes_static_rendezvous(torchrun, binary, dataset, own_launcher, tmp_path):
    port = str(free_port())
    common = ["--nnodes=2", "--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}"]
    runs = run_torchrun(torchrun, binary, tmp_path, [common + ["--node-rank=0"], common + ["--node-rank=1"]],
                        devices=1, num_nodes=2)
    check(runs, tmp_path, own_launcher)


FSDP_SHARDED = ["--strategy", "fsdp", "--state-dict-type", "sharded"]


@pytest.fixture(scope="module")
def own_launcher_fsdp_sharded(binary, tmp_path_factory):
    """The parameters (joined from the shards) after Volt's own launcher trained 2 processes of
    fsdp full_shard with sharded checkpoints on this node."""
    root = tmp_path_factory.mktemp("own-fsdp")
    run = run_binary(binary, merge_flags(train_args(2), FSDP_SHARDED), root, env=cluster_free_env(OMP_NUM_THREADS="1"))
    assert_ok(run)
    return whole_state_dict(run.version_dir() / "checkpoints" / "last.ckpt")


@pytest.mark.parametrize("layout", ["ddp", "fsdp-sharded"])
def test_a_lost_node_resumes_from_the_copy_of_its_newest_snapshot_on_the_next_node(torchrun, binary, dataset, layout,
                                                                                    request, tmp_path):
    """--snapshot-peer-copy on two nodes (two torchrun agents, each node with shared memory of its
    own). ddp: rank 0 dies half-way through writing step 15's snapshot file, after its writer kept
    the snapshot in its node's memory and node 1's process answered that it holds a copy.
    fsdp-sharded: rank 0 dies half-way through writing its shard file of step 15's snapshot, which
    was committed in memory once every shard and its copy on the other node were there. Node 0 is
    then lost with its memory. The job started again resumes from node 1's copies (rank 0 receives
    the index, and under fsdp its shard, from rank 1), not from step 10's files, and ends with the
    parameters of a run that never failed."""
    import glob

    import torch

    sharded = layout == "fsdp-sharded"
    port = str(free_port())
    agents = [["--nnodes=2", "--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}",
               f"--node-rank={node}"] for node in (0, 1)]
    memory = [tmp_path / f"node{node}-shm" for node in (0, 1)]
    for folder in memory:
        folder.mkdir(parents=True)
    envs = [dict(torchrun_env(), VOLT_SNAPSHOT_MEMORY_DIR=str(folder)) for folder in memory]
    extra = ["--snapshot-every-n-steps", "5", "--snapshot-peer-copy"] + (FSDP_SHARDED if sharded else [])
    failed = run_torchrun(torchrun, binary, tmp_path, agents, devices=1, num_nodes=2, extra=extra,
                          envs=[dict(env, VOLT_INJECT_FAULT="rank=0,step=15,at=snapshot") for env in envs])
    assert all(run.returncode != 0 for run in failed), failed
    written = "snapshot_3.ckpt.*.shard0" if sharded else "snapshot_3.ckpt"
    assert glob.glob(str(tmp_path / f"{written}.tmp.*")), "the half-written file the kill left"
    assert not (tmp_path / "snapshot_3.ckpt").exists(), "never committed in the files"
    copies = [str(memory[1] / "volt-snapshots-*" / name) for name in [written, "snapshot_3.ckpt"]]
    assert all(glob.glob(copy) for copy in copies), ("node 1's copies", list(memory[1].rglob("*")))
    shutil.rmtree(memory[0])  # node 0 is gone, and its shared memory with it
    memory[0].mkdir()

    port = str(free_port())
    for agent in agents:
        agent[3] = f"--master-port={port}"
    resumed = run_torchrun(torchrun, binary, tmp_path, agents, devices=1, num_nodes=2, extra=extra, envs=envs)
    out = "\n".join(run.stdout for run in resumed)
    assert all(run.returncode == 0 for run in resumed), resumed
    assert "snapshot_3.ckpt (received from rank 1)" in out, out[-6000:]
    assert not glob.glob(str(tmp_path / f"{written}.tmp.*")), "the restart removed the half-written file"
    if sharded:
        assert "Rank 0's shard of snapshot_3.ckpt came from the copy in rank 1's node's memory" in out, out[-6000:]
    assert "stopped: max_epochs after 1 epoch" in out, out[-6000:]
    versions = sorted((tmp_path / "lightning_logs").glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
    last = versions[-1] / "checkpoints" / "last.ckpt"
    if sharded:
        expected = request.getfixturevalue("own_launcher_fsdp_sharded")
        ours = whole_state_dict(last)
        assert ours.keys() == expected.keys()
        assert not [name for name in ours if not torch.equal(ours[name], expected[name])]
    else:
        assert_same_parameters_at(last, request.getfixturevalue("own_launcher"))
    assert not list(memory[1].iterdir()), "node 1's processes give their memory back when the fit ends"


@pytest.mark.compat
def test_two_nodes_c10d_rendezvous(torchrun, binary, dataset, own_launcher, tmp_path):
    port = str(free_port())
    # Two agents with the same flags: the rendezvous decides which node is group rank 0.
    agent = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
             "--rdzv-id=volt-e2e"]
    runs = run_torchrun(torchrun, binary, tmp_path, [agent, agent], devices=1, num_nodes=2)
    check(runs, tmp_path, own_launcher)


def test_a_devices_count_that_differs_from_the_processes_per_node_is_refused(torchrun, binary, dataset, tmp_path):
    runs = run_torchrun(torchrun, binary, tmp_path, [STANDALONE_TWO], devices=3, timeout=120)
    assert runs[0].returncode != 0
    assert "devices=3" in runs[0].stdout and "started 2 processes on this node" in runs[0].stdout, runs[0]


@pytest.mark.parametrize("fault", ["rank=1,step=12", "rank=0,step=15,at=snapshot"])
def test_a_killed_rank_restarts_from_the_newest_snapshot_and_ends_bit_identical(torchrun, binary, dataset,
                                                                               own_launcher, tmp_path, fault):
    """torchrun --max-restarts: a rank killed (SIGKILL, VOLT_INJECT_FAULT) at a step's end, or rank 0
    half-way through writing a snapshot's file; torchrun starts the group again, which resumes from
    the newest snapshot by itself (the memory tier's copy in /dev/shm, also of the snapshot whose
    file the kill cut short) and ends with the uninterrupted run's parameters. (A kill in
    validation: the next test; random ones: tests/faults.)"""
    import glob

    tmp_path.mkdir(parents=True, exist_ok=True)
    env = dict(torchrun_env(), VOLT_INJECT_FAULT=fault)
    command = torchrun + STANDALONE_TWO + ["--max-restarts=1", "--no-python", binary] + train_args(2) + [
        "--snapshot-every-n-steps", "5", "--default-root-dir", str(tmp_path)]
    proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                          env=env, timeout=240)
    out = proc.stdout
    assert proc.returncode == 0, out[-6000:]
    # Attempt 0 died; attempt 1 resumed from a snapshot and finished.
    resumed = [line for line in out.splitlines() if "Resuming from snapshot" in line]
    assert resumed, out[-6000:]
    # Step 10's snapshot for the kill at step 12; step 15's for the kill while its file was written:
    # the memory tier had it whole before the file write began.
    resumed_step = 10 if "step=12" in fault else 15
    assert f"snapshot_{resumed_step // 5}.ckpt (node-local shared memory)" in resumed[0], resumed
    # The step the failed attempt had reached: 12 for the kill at a step's end; for the kill inside the
    # writer thread, 15 or a later step (the training thread goes on while the snapshot is written).
    match = re.search(r"Restart 1: the failed attempt had reached step (\d+); (\d+) steps? lost\.", out)
    assert match, out[-6000:]
    reached, lost = int(match.group(1)), int(match.group(2))
    assert (reached == 12) if "step=12" in fault else (15 <= reached <= 20), match.group(0)
    assert lost == reached - resumed_step, match.group(0)
    if "at=snapshot" in fault:
        # The half-written file the kill left, which the restarted attempt removed before it trained.
        removed = r"Removed 1 temporary file \(.*\) that a write killed half-way left in .*snapshot_3\.ckpt\.tmp\.\d+"
        assert re.search(removed, out), out[-6000:]
    assert not glob.glob(str(tmp_path / "*.tmp.*")), glob.glob(str(tmp_path / "*.tmp.*"))
    assert "stopped: max_epochs after 1 epoch" in out, out[-6000:]
    versions = sorted((tmp_path / "lightning_logs").glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
    assert_same_parameters_at(versions[-1] / "checkpoints" / "last.ckpt", own_launcher)


def test_volts_own_launcher_restarts_a_killed_rank_and_ends_bit_identical(binary, dataset, own_launcher, tmp_path):
    """--max-restarts under Volt's own launcher: the process started supervises both ranks; rank 1
    kills itself in the validation after the last step (VOLT_INJECT_FAULT), the supervisor ends rank
    0, names the failure and starts both again, which resume from the snapshot of step 20 (its
    validation still due) and end as a run that never failed."""
    env = cluster_free_env(OMP_NUM_THREADS="1", VOLT_INJECT_FAULT="rank=1,step=20,at=validation")
    run = run_binary(binary, train_args(2) + ["--snapshot-every-n-steps", "5", "--max-restarts", "2"], tmp_path,
                     env=env)
    assert_ok(run)
    out = run.stdout + run.stderr
    assert "Restart 1 of 2: local rank 1 (pid" in out and "was killed by signal 9" in out, out[-6000:]
    assert "snapshot_4.ckpt (node-local shared memory)" in out, out[-6000:]
    assert "Restart 1: the failed attempt had reached step 20; 0 steps lost." in out, out[-6000:]
    versions = sorted((tmp_path / "lightning_logs").glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
    assert_same_parameters_at(versions[-1] / "checkpoints" / "last.ckpt", own_launcher)
