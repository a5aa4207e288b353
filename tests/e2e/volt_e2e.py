"""Helpers for the end-to-end tests of examples/fashion_mnist: running it, parsing what it prints.

The binary comes from $VOLT_EXAMPLE (set by CTest to $<TARGET_FILE:fashion_mnist>). Every run
gets its own directory as --default-root-dir and a wall-clock timeout, so a hung binary fails the
test instead of hanging CTest.
"""
import csv
import math
import os
import re
import subprocess
from pathlib import Path

import pytest

DATA_DIR = Path("/usr/share/datasets/fashion-mnist")

# Short runs: a few seconds each on 2 cores with the MLP.
SHORT = [
    "--limit-train-batches", "20",
    "--limit-val-batches", "3",
    "--limit-test-batches", "3",
    "--no-progress-bar",
]
# Deterministic runs (resume must reproduce a fresh run bit for bit).
DETERMINISTIC = ["--seed", "7", "--num-threads", "1"]

# What must never appear on a user's terminal, whatever the input.
CRASH_MARKERS = [
    "Exception raised from",  # c10::Error's backtrace
    "frame #",                # a LibTorch backtrace frame
    "internal error",
    "terminate called",
    "Segmentation fault",
    "Aborted",
    "core dumped",
]


def example_binary(variable, target):
    """The example binary CTest passes in $`variable` ($<TARGET_FILE:`target`>); fails the test when it
    is not set or not executable."""
    path = os.environ.get(variable)
    if not path:
        pytest.fail(f"{variable} is not set; run through CTest, or export {variable}=/path/to/build/examples/{target}")
    if not os.access(path, os.X_OK):
        pytest.fail(f"{variable}={path} is not an executable file")
    return path


class Run:
    """The outcome of one run of the binary."""

    def __init__(self, args, root, proc, seconds):
        self.args = args
        self.root = Path(root) if root is not None else None
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.seconds = seconds

    def __repr__(self):
        return (f"Run(args={self.args}, rc={self.returncode}, {self.seconds:.1f} s)\n"
                f"--- stdout ---\n{self.stdout[-4000:]}\n--- stderr ---\n{self.stderr[-4000:]}")

    def version_dir(self, n=0):
        return self.root / "lightning_logs" / f"version_{n}"

    def summary(self):
        """The fit summary's 'key  value' lines and its metrics, as two dicts of strings."""
        return parse_fit_summary(self.stdout)

    def test_metrics(self):
        return parse_table(self.stdout, "Test metric")


def run_binary(binary, args, root=None, timeout=180, env=None):
    """Runs the binary (with --default-root-dir root when given) and returns a Run."""
    import time

    full = [binary] + list(args)
    if root is not None:
        Path(root).mkdir(parents=True, exist_ok=True)
        full += ["--default-root-dir", str(root)]
    start = time.monotonic()
    try:
        proc = subprocess.run(full, capture_output=True, text=True, timeout=timeout, cwd=root, env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{full} did not finish within {timeout} s; stdout so far:\n{e.stdout}\nstderr:\n{e.stderr}")
    return Run(full, root, proc, time.monotonic() - start)


def write_sentences(path):
    """22 KB of sentences over a 23-word vocabulary (the GPT example's test text): enough structure to
    learn in 20 steps. Returns `path`."""
    import random

    rng = random.Random(0)
    words = ("the quick brown fox jumps over the lazy dog while a small cat sleeps in the warm sun near an old red "
             "barn").split()
    path.write_text("".join(" ".join(rng.choice(words) for _ in range(12)) + ".\n" for _ in range(400)))
    return path


def cluster_free_env(**extra):
    """This environment without any launcher's variables (SLURM, MPI, torchrun), plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "OMPI_", "PMI_", "PMIX_")) and k not in
           ("RANK", "LOCAL_RANK", "GLOBAL_RANK", "NODE_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
            "MASTER_ADDR", "MASTER_PORT")}
    env.update(extra)
    return env


def print_plan(binary, args=(), env=None):
    """The binary's --print-plan as a dict ("key" padded to 24 columns, then the value)."""
    run = subprocess.run([binary, "--print-plan", "--num-threads", "1", *args], capture_output=True, text=True,
                         timeout=60, cwd="/", env=env)
    assert run.returncode == 0, run.stderr
    return {line[:24].strip(): line[24:].strip() for line in run.stdout.splitlines() if line}


def libtorch_version(binary):
    """(major, minor) of the LibTorch the binary was built against, from its plan."""
    major, minor = print_plan(binary)["libtorch"].split(".")[:2]
    return int(major), int(minor)


def merge_flags(*groups):
    """Concatenates flag lists; a later `--flag value` (or `--switch`) replaces an earlier one, since
    CLI11 refuses a repeated option."""
    merged = {}
    for group in groups:
        i = 0
        while i < len(group):
            flag = group[i]
            assert flag.startswith("--"), group
            if i + 1 < len(group) and not group[i + 1].startswith("--"):
                merged[flag] = [group[i + 1]]
                i += 2
            else:
                merged[flag] = []
                i += 1
    return [token for flag, values in merged.items() for token in [flag] + values]


# The globals a torch.save of plain values and tensors references (what weights_only allows).
ALLOWED_GLOBALS = {("torch._utils", "_rebuild_tensor_v2"), ("collections", "OrderedDict")}


def _restricted_pickle_module():
    import pickle
    import types

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if (module, name) in ALLOWED_GLOBALS:
                return super().find_class(module, name)
            raise pickle.UnpicklingError(f"checkpoint references the global {module}.{name}")

    restricted = types.ModuleType("restricted_pickle")
    restricted.Unpickler = Unpickler
    restricted.load = pickle.load
    restricted.__dict__.update({k: getattr(pickle, k) for k in ("UnpicklingError", "HIGHEST_PROTOCOL")})
    return restricted


def load_checkpoint(path):
    """torch.load of a Volt checkpoint that allows no globals beyond a plain torch.save's:
    weights_only=True where this torch can (torch >= 2.0; 1.13's weights-only unpickler lacks the
    BINFLOAT opcode that any float, e.g. Adam's lr, needs), else an unpickler that refuses every
    global but ALLOWED_GLOBALS (torch.load itself resolves the `torch.*Storage` names)."""
    import pickle

    import torch

    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as e:
        if not torch.__version__.startswith("1.") or "Unsupported operand 71" not in str(e):
            raise
    # 1.13's torch.load replaces any pickle_module by pickle when weights_only is off, so call its
    # zip loader directly.
    from torch import serialization

    with open(path, "rb") as f, serialization._open_zipfile_reader(f) as archive:
        return serialization._load(archive, None, _restricted_pickle_module(), encoding="utf-8")


def whole_state_dict(path):
    """The parameters of the checkpoint at `path`; a sharded one's (fsdp full_shard with
    --state-dict-type sharded) joined from the piece each process's shard file beside it holds,
    which also reads every shard."""
    import torch

    checkpoint = load_checkpoint(path)
    state = dict(checkpoint["state_dict"])
    index = checkpoint.get("sharded_optimizer_states")
    if index is not None:
        pieces = {}
        for file in index["files"]:
            for name, piece in load_checkpoint(Path(path).parent / file)["parameters"].items():
                pieces.setdefault(name, []).append(piece)
        for name, parts in pieces.items():
            parts.sort(key=lambda piece: piece["begin"])
            state[name] = torch.cat([piece["values"].reshape(-1) for piece in parts]).reshape(parts[0]["shape"])
    return state


def pickle_globals(path):
    """The (module, name) globals that a torch.save archive's pickle references."""
    import pickletools
    import zipfile

    with zipfile.ZipFile(path) as archive:
        pkl = [n for n in archive.namelist() if n.endswith("/data.pkl")]
        assert len(pkl) == 1, archive.namelist()
        data = archive.read(pkl[0])
    found = set()
    strings = []
    for opcode, arg, _ in pickletools.genops(data):
        if opcode.name == "GLOBAL":
            module, name = arg.split(" ", 1)
            found.add((module, name))
        elif opcode.name == "STACK_GLOBAL":
            found.add((strings[-2], strings[-1]))
        elif isinstance(arg, str):
            strings.append(arg)
    return found


def assert_clean_exit(run):
    """No signal, no abort, no backtrace or internal error on either stream."""
    assert run.returncode >= 0, f"killed by signal {-run.returncode}: {run!r}"
    assert run.returncode not in (70, 134, 136, 139), f"internal error / crash exit code: {run!r}"
    for marker in CRASH_MARKERS:
        assert marker not in run.stderr, f"{marker!r} on stderr: {run!r}"
        assert marker not in run.stdout, f"{marker!r} on stdout: {run!r}"


def assert_ok(run):
    assert_clean_exit(run)
    assert run.returncode == 0, repr(run)


def parse_fit_summary(stdout):
    """Parses the 'Fit summary' block: ({'stop reason': ..., ...}, {'val/acc': '0.8', ...})."""
    lines = stdout.splitlines()
    assert "Fit summary" in lines, f"no fit summary in:\n{stdout}"
    i = lines.index("Fit summary") + 1
    fields, metrics = {}, {}
    in_metrics = False
    while i < len(lines) and lines[i].startswith("  "):
        line = lines[i]
        if line.strip() == "metrics":
            in_metrics = True
        elif in_metrics and line.startswith("    "):
            name, value = line.split()
            metrics[name] = value
        else:
            key, value = re.match(r"^  (\S.*?)\s{2,}(\S.*)$", line).groups()
            fields[key] = value
        i += 1
    return fields, metrics


def parse_table(stdout, header):
    """Parses a Lightning-style metrics table ('Test metric  DataLoader 0') into {name: str}."""
    lines = stdout.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(header)]
    assert starts, f"no '{header}' table in:\n{stdout}"
    i = starts[-1] + 2  # header, rule
    out = {}
    while i < len(lines) and not lines[i].startswith("---"):
        name, value = lines[i].split()
        out[name] = value
        i += 1
    return out


def read_metrics_csv(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        return reader.fieldnames, rows


def finite(text):
    return text != "" and math.isfinite(float(text))
