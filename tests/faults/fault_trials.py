#!/usr/bin/env python3
"""Fault-injection trials (issue #32, docs/failures.md): each trial runs an example under Volt's own
launcher with --max-restarts 2 and snapshots, and one rank killed with SIGKILL at a random step, at
a random point (a step's end, half-way through writing a snapshot, validation) through
VOLT_INJECT_FAULT; in a quarter of the trials of a strategy with several processes a second rank
dies again in the restart's rendezvous. A trial passes when the run completes by itself, ends with
the parameters of an uninterrupted run bit for bit, leaves every snapshot readable, and leaves no
process behind, no snapshot in shared memory and no temporary file of a killed write; a trial that
runs past its deadline is a hang.

    tests/faults/fault_trials.py --strategy ddp --trials 50 --seed 1
    tests/faults/fault_trials.py --strategy all --trials 2          # what CI runs (ctest -L faults)

Prints one line per trial and a table per strategy: trials bit-identical, hangs, corrupt snapshots,
the median and worst time from the kill to the first step of the restarted run, and the steps lost
per failure (as the restarted run reports it: the step the failed attempt had reached minus the
step it resumed at; at most the interval, a few more only when rank 0 dies while its writer is
still serializing the newest snapshot, before the snapshot reaches shared memory).
Exits 1 when any trial failed.

Needs VOLT_EXAMPLE and VOLT_GPT_EXAMPLE (the example binaries; ctest sets them), Fashion-MNIST
installed (apt-get install dataset-fashion-mnist), and /usr/bin/python3 with torch for reading the
checkpoints.
"""
import argparse
import glob
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from volt_e2e import cluster_free_env, whole_state_dict, write_sentences  # noqa: E402

SNAPSHOT_EVERY = 4
MLP = ["--model", "mlp", "--max-epochs", "1", "--limit-train-batches", "24", "--limit-val-batches", "3",
       "--no-test", "--no-progress-bar", "--seed", "7", "--num-threads", "1"]
GPT = ["--n-layer", "2", "--n-head", "2", "--n-embd", "32", "--block-size", "32", "--lr", "1e-2",
       "--warmup-steps", "2", "--seed", "1", "--num-threads", "1", "--no-progress-bar", "--max-steps", "18",
       "--lr-decay-steps", "18", "--sample-tokens", "0", "--limit-val-batches", "0"]
# name: (binary variable, flags, processes, total steps, where a fault may strike)
STRATEGIES = {
    "ddp": ("VOLT_EXAMPLE", MLP + ["--devices", "2", "--strategy", "ddp"], 2, 24, ["step", "snapshot", "validation"]),
    "gpt": ("VOLT_GPT_EXAMPLE", GPT + ["--devices", "2", "--batch-size", "4", "--strategy", "ddp"], 2, 18,
            ["step", "snapshot"]),
    # Each process writes its shard of a snapshot; the set is committed once all are on disk. The
    # example's ModelCheckpoint (last.ckpt) is written the same way, in the background.
    "full_shard": ("VOLT_GPT_EXAMPLE", GPT + ["--devices", "2", "--batch-size", "4", "--strategy", "fsdp",
                                              "--sharding-strategy", "full_shard", "--state-dict-type", "sharded",
                                              "--async-checkpointing"],
                   2, 18, ["step", "snapshot"]),
    # One process, 3 stages; "auto" balances by measured time, which changes no number.
    "pipeline": ("VOLT_GPT_EXAMPLE", GPT + ["--devices", "3", "--batch-size", "8", "--strategy", "pipeline",
                                            "--pipeline-chunks", "4", "--pipeline-schedule", "1f1b"], 1, 18,
                 ["step", "snapshot"]),
}
# The pipeline's checkpoints add the partition it ran; it is no parameter.
NOT_PARAMETERS = {"transformer.pipe.balance"}
TRIAL_TIMEOUT = 180


def command(name, root, text):
    variable, flags, _, _, _ = STRATEGIES[name]
    binary = os.environ.get(variable)
    if not binary:
        sys.exit(f"fault_trials: {variable} is not set. HINT: point it at the example binary (ctest sets it).")
    extra = ["--text", str(text)] if variable == "VOLT_GPT_EXAMPLE" else []
    return [binary] + flags + extra + ["--default-root-dir", str(root), "--snapshot-every-n-steps",
                                       str(SNAPSHOT_EVERY), "--max-restarts", "2"]


def final_parameters(root):
    versions = sorted((root / "lightning_logs").glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
    if not versions:
        return None
    path = versions[-1] / "checkpoints" / "last.ckpt"
    if not path.exists():
        return None
    state = whole_state_dict(path)
    return {k: v for k, v in state.items() if k not in NOT_PARAMETERS}


def same(a, b):
    import torch

    return a is not None and b is not None and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def processes_under(root):
    """Processes whose command line names `root` (every rank gets --default-root-dir root)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(root) in cmdline and int(pid) != os.getpid():
            found.append(int(pid))
    return found


def run(cmd, env, root):
    """Runs `cmd`, stamping each output line with the time it arrived; returns (rc or None on a
    hang, [(seconds, line)])."""
    proc = subprocess.Popen(cmd, env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)
    start = time.monotonic()
    lines = []

    def read():
        for line in proc.stdout:
            lines.append((time.monotonic() - start, line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=TRIAL_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join(timeout=10)
        return None, lines
    reader.join(timeout=10)
    return proc.returncode, lines


def memory_tiers_of(root):
    """The memory tiers in /dev/shm of runs whose snapshots went to `root`: Volt names them
    volt-snapshots-<uid>-<FNV-1a of the folder>-<token> (src/volt/checkpoint/snapshot_memory.cpp)."""
    digest = 14695981039346656037
    for byte in os.path.normpath(os.path.abspath(root)).encode():
        digest = ((digest ^ byte) * 1099511628211) % (1 << 64)
    return glob.glob(f"/dev/shm/volt-snapshots-{os.getuid()}-{digest:016x}-*")


def trial(name, reference, rng, workdir, text, index):
    _, _, processes, steps, points = STRATEGIES[name]
    at = rng.choice(points)
    rank = 0 if at == "snapshot" else rng.randrange(processes)
    # A snapshot fault needs a snapshot at or after its step; none is taken at the step that ends
    # the fit, so the last one is the last multiple of the interval before it.
    last = steps - 1 if at != "snapshot" else ((steps - 1) // SNAPSHOT_EVERY) * SNAPSHOT_EVERY
    step = rng.randrange(1, last + 1) if at != "validation" else steps
    fault = f"rank={rank},step={step}" + ("" if at == "step" else f",at={at}")
    if processes > 1 and rng.random() < 0.25:
        fault += f";rank={rng.randrange(processes)},at=rendezvous,attempt=1"
    root = workdir / f"{name}-{index}"
    root.mkdir()
    env = cluster_free_env(OMP_NUM_THREADS="1", VOLT_INJECT_FAULT=fault)
    rc, lines = run(command(name, root, text), env, root)
    out = "\n".join(line for _, line in lines)
    result = {"fault": fault, "hang": rc is None, "rc": rc}
    leftover = processes_under(root)
    for pid in leftover:
        os.kill(pid, signal.SIGKILL)
    result["leftover"] = len(leftover)
    corrupt = 0
    # The snapshots, and what ModelCheckpoint saved (complete, or absent).
    for snapshot in root.rglob("*.ckpt"):
        try:
            whole_state_dict(snapshot)
        except Exception:  # noqa: BLE001: any unreadable file counts
            corrupt += 1
    result["corrupt"] = corrupt
    # A write killed half-way leaves its temporary file (<file>.tmp.<pid>); the restarted run
    # removes those of snapshots, HPC checkpoints and their shards before it trains.
    result["temporary_left"] = sorted(str(p.relative_to(root)) for p in root.rglob("*.tmp.*"))
    # A run that completed gives its snapshots' shared memory back (docs/failures.md, the memory tier).
    memory = memory_tiers_of(root)
    result["memory_left"] = len(memory)
    for folder in memory:
        shutil.rmtree(folder, ignore_errors=True)
    result["identical"] = rc == 0 and same(final_parameters(root), reference)
    # The supervisor notices the kill within 100 ms; the restarted rank 0 says where it starts.
    # The supervisor notices a kill within 100 ms; the restarted rank 0 says where it starts. With
    # a second fault in the restart's rendezvous, the attempt that trains again is the third.
    restarts = [t for t, line in lines if re.search(r"Restart \d of 2:", line)]
    restart = restarts[-1] if restarts else None
    started = next((t for t, line in lines if t >= (restart or 0) and
                    ("Restored training state" in line or "found no readable snapshot" in line)), None)
    result["recovery_s"] = started - restart if restart is not None and started is not None else None
    # What the restarted run reports; without a snapshot to resume from, every step up to the kill.
    lost = [int(m.group(1)) for line in out.splitlines() for m in [re.search(r"; (\d+) steps? lost", line)] if m]
    killed_at = -(-step // SNAPSHOT_EVERY) * SNAPSHOT_EVERY if at == "snapshot" else step
    result["steps_lost"] = lost[-1] if lost else killed_at
    result["restarted"] = restart is not None
    if (not result["identical"] or result["hang"] or leftover or corrupt or memory or restart is None
            or result["temporary_left"]):
        result["log"] = out[-4000:]
    shutil.rmtree(root, ignore_errors=True)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategy", default="all", choices=["all"] + list(STRATEGIES))
    parser.add_argument("--trials", type=int, default=2, help="trials per strategy")
    parser.add_argument("--seed", type=int, default=None, help="the random faults' seed (default: from the clock)")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else int(time.time())
    rng = random.Random(seed)
    print(f"fault_trials: seed {seed} (rerun the same faults with --seed {seed})")
    names = list(STRATEGIES) if args.strategy == "all" else [args.strategy]
    failed = False
    with tempfile.TemporaryDirectory(prefix="volt-faults-") as tmp:
        workdir = Path(tmp)
        text = write_sentences(workdir / "text.txt")
        for name in names:
            ref_root = workdir / f"{name}-reference"
            ref_root.mkdir()
            rc, lines = run(command(name, ref_root, text), cluster_free_env(OMP_NUM_THREADS="1"), ref_root)
            reference = final_parameters(ref_root)
            if rc != 0 or reference is None:
                print("\n".join(line for _, line in lines[-60:]))
                sys.exit(f"fault_trials: the uninterrupted {name} run failed (rc {rc})")
            results = []
            for i in range(args.trials):
                r = trial(name, reference, rng, workdir, text, i)
                results.append(r)
                ok = (r["identical"] and r["restarted"] and not r["hang"] and not r["leftover"] and not r["corrupt"]
                      and not r["memory_left"] and not r["temporary_left"])
                failed = failed or not ok
                recovery = f"{r['recovery_s']:.2f} s" if r["recovery_s"] is not None else "-"
                print(f"{name} trial {i}: {r['fault']}: {'ok' if ok else 'FAILED'} (rc {r['rc']}, "
                      f"restarted {r['restarted']}, recovery {recovery}, steps lost {r['steps_lost']})", flush=True)
                if not ok:
                    if r["temporary_left"]:
                        print(f"temporary files left: {', '.join(r['temporary_left'])}")
                    print(r.get("log", ""))
            recoveries = [r["recovery_s"] for r in results if r["recovery_s"] is not None]
            lost = [r["steps_lost"] for r in results]
            print(f"| {name} | {sum(r['identical'] for r in results)}/{len(results)} bit-identical | "
                  f"{sum(r['hang'] for r in results)} hangs | {sum(r['corrupt'] for r in results)} corrupt snapshots | "
                  f"{sum(r['leftover'] for r in results)} processes left | kill to first step: median "
                  f"{statistics.median(recoveries) if recoveries else float('nan'):.2f} s, worst "
                  f"{max(recoveries) if recoveries else float('nan'):.2f} s | steps lost: median "
                  f"{statistics.median(lost)}, worst {max(lost)} (interval {SNAPSHOT_EVERY}) |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
