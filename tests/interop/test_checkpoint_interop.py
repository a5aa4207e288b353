"""Volt's checkpoints and Python's torch.save / torch.load understand each other.

Run by CTest (test `checkpoint_interop_py`), which sets CHECKPOINT_INTEROP_TOOL to the path of
the C++ `checkpoint_interop_tool`. Needs /usr/bin/python3 with torch (Debian's python3-torch).
"""

import collections
import json
import os
import pickletools
import re
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from volt_testkit import require

TOOL = os.environ.get("CHECKPOINT_INTEROP_TOOL")
# PyPI's torch 2.x, which scripts/setup.sh installs in a folder of its own for tests/e2e/test_torchrun.py
# (keep in step with VOLT_TORCHRUN_PYTHONPATH there); its wheel loads the CUDA toolkit's libraries.
TORCH2_PYTHONPATH = Path(os.environ.get("VOLT_TORCHRUN_PYTHONPATH", "/opt/volt/python-torchrun"))
CUDA_LIBRARIES = Path("/usr/local/cuda/lib64")

# Globals Python's own torch.save of a dict of plain values and tensors references.
ALLOWED_GLOBALS = {"torch._utils _rebuild_tensor_v2", "collections OrderedDict"}
STORAGE_GLOBAL = re.compile(r"^torch [A-Za-z0-9]*Storage$")

# The opcodes torch 2.x's weights-only unpickler (torch/_weights_only_unpickler.py) handles.
WEIGHTS_ONLY_OPCODES = {
    "APPEND", "APPENDS", "BINFLOAT", "BINGET", "BININT", "BININT1", "BININT2", "BINPERSID",
    "BINPUT", "BINUNICODE", "BUILD", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_SET", "EMPTY_TUPLE",
    "GLOBAL", "LONG1", "LONG_BINGET", "LONG_BINPUT", "MARK", "NEWFALSE", "NEWOBJ", "NEWTRUE",
    "NONE", "PROTO", "REDUCE", "SETITEM", "SETITEMS", "SHORT_BINSTRING", "STOP", "TUPLE",
    "TUPLE1", "TUPLE2", "TUPLE3",
}

PLAIN_TYPES = (dict, list, tuple, str, int, float, bool, type(None), torch.Tensor)


def torch_major():
    return int(torch.__version__.split(".")[0])


def run_tool(*args):
    assert TOOL, (
        "CHECKPOINT_INTEROP_TOOL is not set: run this through ctest "
        "(ctest -R checkpoint_interop_py) or set it to the built checkpoint_interop_tool")
    return subprocess.run([TOOL, *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def ours(tmp_path):
    """A checkpoint written by Volt, and the directory with the raw parameter dumps."""
    ckpt = tmp_path / "volt.ckpt"
    dump = tmp_path / "dump"
    dump.mkdir()
    result = run_tool("write", str(ckpt), str(dump))
    assert result.returncode == 0, result.stderr
    return ckpt, dump


def walk(value, path="<root>"):
    """Yields (path, value) for every value nested in `value`."""
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from walk(item, f"{path}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from walk(item, f"{path}[{index}]")


def pickle_of(ckpt):
    with zipfile.ZipFile(ckpt) as archive:
        names = archive.namelist()
        (pkl,) = [name for name in names if name.endswith("/data.pkl")]
        return names, archive.read(pkl)


def test_python_reads_our_checkpoint_into_plain_values(ours):
    ckpt, _ = ours
    checkpoint = torch.load(ckpt)
    for path, value in walk(checkpoint):
        assert type(value) in PLAIN_TYPES, f"{path} is a {type(value)}"
    assert checkpoint["epoch"] == 1
    assert checkpoint["global_step"] == 10
    assert isinstance(checkpoint["pytorch-lightning_version"], str)
    assert checkpoint["hyper_parameters"] == {
        "lr": 0.001, "name": "x", "flag": True, "layers": [1, 2], "scheduler": None}
    assert checkpoint["lr_schedulers"] == []
    assert checkpoint["loops"]["fit_loop"]["batch_progress"]["total"]["completed"] == 10
    optimizer = checkpoint["optimizer_states"][0]
    assert optimizer["param_groups"][0]["betas"] == (0.9, 0.999)
    assert optimizer["param_groups"][0]["params"] == [0, 1, 2, 3]
    assert sorted(optimizer["state"]) == [0, 1, 2, 3]
    assert torch.equal(optimizer["state"][0]["exp_avg"], torch.full((3, 4), 0.125))


def test_our_state_dict_equals_the_raw_parameter_dumps_exactly(ours):
    ckpt, dump = ours
    state_dict = torch.load(ckpt)["state_dict"]
    manifest = json.loads((dump / "manifest.json").read_text())
    assert list(state_dict) == list(manifest)  # Same names, in module order.
    for name, shape in manifest.items():
        raw = np.fromfile(dump / f"{name}.bin", dtype="<f4").reshape(shape)
        tensor = state_dict[name]
        assert tensor.dtype == torch.float32
        assert list(tensor.shape) == shape
        assert not tensor.requires_grad
        assert torch.equal(tensor, torch.from_numpy(raw)), name


def test_a_python_model_loads_our_state_dict(ours):
    ckpt, _ = ours
    state_dict = torch.load(ckpt)["state_dict"]

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(4, 3)
            self.fc2 = torch.nn.Linear(3, 2)
            self.register_buffer("scale", torch.zeros(2))

    net = Net()
    net.load_state_dict(state_dict, strict=True)
    assert torch.equal(net.fc2.bias, state_dict["fc2.bias"])


def test_our_archive_has_torch_save_record_names(ours):
    ckpt, _ = ours
    names, _ = pickle_of(ckpt)
    assert "archive/data.pkl" in names
    assert "archive/version" in names
    assert "archive/data/0" in names
    assert all(name.startswith("archive/") for name in names), names


def test_our_pickle_references_only_the_globals_torch_save_does(ours):
    ckpt, _ = ours
    _, data = pickle_of(ckpt)
    ops = list(pickletools.genops(data))
    globals_ = {arg for op, arg, _ in ops if op.name == "GLOBAL"}
    assert not any(op.name == "STACK_GLOBAL" for op, _, _ in ops)
    unexpected = {g for g in globals_ if g not in ALLOWED_GLOBALS and not STORAGE_GLOBAL.match(g)}
    assert not unexpected, f"globals the weights-only loader rejects: {unexpected}"
    assert "torch._utils _rebuild_tensor_v2" in globals_
    opcodes = {op.name for op, _, _ in ops}
    assert opcodes <= WEIGHTS_ONLY_OPCODES, opcodes - WEIGHTS_ONLY_OPCODES


# torch.load(weights_only=True) of the checkpoint in another interpreter; prints what it read as JSON.
WEIGHTS_ONLY_LOAD = """
import json, sys, torch
checkpoint = torch.load(sys.argv[1], weights_only=True)
print(json.dumps({"torch": torch.__version__, "lr": checkpoint["hyper_parameters"]["lr"],
                  "scale": checkpoint["state_dict"]["scale"].tolist()}))
"""


def test_python_weights_only_load_reads_our_checkpoint(ours):
    ckpt, _ = ours
    if torch_major() >= 2:
        checkpoint = torch.load(ckpt, weights_only=True)
        assert checkpoint["hyper_parameters"]["lr"] == 0.001
        assert torch.equal(checkpoint["state_dict"]["scale"], torch.tensor([0.5, -1.25]))
        return
    # torch 1.13's weights-only unpickler lacks BINFLOAT, so it cannot read any float (not even
    # Python's own checkpoints): the load runs under PyPI's torch 2.x instead.
    require((TORCH2_PYTHONPATH / "torch").is_dir(),
            f"torch {torch.__version__} cannot load weights_only, and no torch 2.x is installed in "
            f"{TORCH2_PYTHONPATH}: run scripts/setup.sh (or set VOLT_TORCHRUN_PYTHONPATH)")
    require(CUDA_LIBRARIES.is_dir(), f"PyPI's torch wheel needs the CUDA toolkit's libraries ({CUDA_LIBRARIES})")
    env = dict(os.environ, PYTHONPATH=str(TORCH2_PYTHONPATH), PYTHONDONTWRITEBYTECODE="1",
               LD_LIBRARY_PATH=":".join(filter(None, [str(CUDA_LIBRARIES), os.environ.get("LD_LIBRARY_PATH")])))
    loaded = subprocess.run(["/usr/bin/python3", "-c", WEIGHTS_ONLY_LOAD, str(ckpt)], capture_output=True, text=True,
                            env=env, timeout=180)
    assert loaded.returncode == 0, loaded.stderr
    result = json.loads(loaded.stdout.splitlines()[-1])
    assert result["torch"].startswith("2."), result  # the torch 2.x of that folder, not Debian's
    assert result["lr"] == 0.001
    assert result["scale"] == [0.5, -1.25]


def python_checkpoint():
    """What a Python Lightning run might save: a real state_dict (an OrderedDict with
    `_metadata`), and plain values of every kind."""
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    state_dict = model.state_dict()
    assert isinstance(state_dict, collections.OrderedDict) and hasattr(state_dict, "_metadata")
    base = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    return {
        "epoch": 4,
        "global_step": -(2**40),
        "big": 2**62,
        "state_dict": state_dict,
        "hyper_parameters": {"lr": 0.1, "eps": 1e-8, "third": 1 / 3, "flag": False,
                             "name": "résumé", "layers": [[1, 2], [3.5, "x"], []], "none": None},
        "tensors": {
            "int64": torch.tensor([-3, 0, 2**40]),
            "uint8": torch.tensor([0, 255], dtype=torch.uint8),
            "bool": torch.tensor([True, False]),
            "view": base.t()[1:],  # A view: non-contiguous, with an offset, sharing `base`.
            "base": base,
            "scalar": torch.tensor(2.5),
        },
    }


def expected_json(value):
    """The JSON the tool prints for `value`."""
    if isinstance(value, torch.Tensor):
        return {"shape": list(value.shape),
                "values": value.detach().to(torch.float64).flatten().tolist()}
    if isinstance(value, dict):
        return {str(key): expected_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [expected_json(item) for item in value]
    return value


def without_dtype(value):
    if isinstance(value, dict):
        return {key: without_dtype(item) for key, item in value.items() if key != "dtype"}
    if isinstance(value, list):
        return [without_dtype(item) for item in value]
    return value


def test_cpp_reads_a_checkpoint_python_wrote_with_identical_values(tmp_path):
    ckpt = tmp_path / "python.ckpt"
    checkpoint = python_checkpoint()
    torch.save(checkpoint, ckpt)
    result = run_tool("read", str(ckpt))
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout, object_pairs_hook=collections.OrderedDict)
    # Same values, and dicts in the same order (the state_dict's order is the module's).
    assert json.dumps(without_dtype(printed)) == json.dumps(expected_json(checkpoint))
    dtypes = {name: t["dtype"] for name, t in printed["tensors"].items()}
    assert dtypes == {"int64": "Long", "uint8": "Byte", "bool": "Bool", "view": "Double",
                      "base": "Double", "scalar": "Float"}


def test_cpp_reads_our_own_checkpoint_back(ours):
    ckpt, _ = ours
    result = run_tool("read", str(ckpt))
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert without_dtype(printed) == expected_json(torch.load(ckpt))


def test_cpp_refuses_a_python_checkpoint_that_pickles_a_module(tmp_path):
    ckpt = tmp_path / "module.ckpt"
    torch.save({"model": torch.nn.Linear(2, 2)}, ckpt)
    result = run_tool("read", str(ckpt))
    assert result.returncode == 2, result
    assert "torch.nn.modules.linear.Linear" in result.stderr
    assert str(ckpt) in result.stderr
    assert "HINT:" in result.stderr


def test_cpp_refuses_the_legacy_format_with_a_hint(tmp_path):
    ckpt = tmp_path / "legacy.ckpt"
    torch.save({"a": 1}, ckpt, _use_new_zipfile_serialization=False)
    result = run_tool("read", str(ckpt))
    assert result.returncode == 2, result
    assert "legacy" in result.stderr and "HINT:" in result.stderr


def test_cpp_reads_a_python_checkpoint_saved_with_pickle_protocol_4(tmp_path):
    ckpt = tmp_path / "proto4.ckpt"
    checkpoint = {"w": torch.ones(2, 2), "names": ["a", "b"], "step": 3}
    torch.save(checkpoint, ckpt, pickle_protocol=4)
    result = run_tool("read", str(ckpt))
    assert result.returncode == 0, result.stderr
    assert without_dtype(json.loads(result.stdout)) == expected_json(checkpoint)

