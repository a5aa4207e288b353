"""Volt's safetensors files and Python's safetensors package understand each other.

Run by CTest (test `safetensors_interop_py`), which sets SAFETENSORS_INTEROP_TOOL to the path of the
C++ `safetensors_interop_tool`. Needs /usr/bin/python3 with torch (Debian's python3-torch) and
PyPI's safetensors 0.8.0, which scripts/setup.sh installs into a folder of its own
(VOLT_SAFETENSORS_PYTHONPATH, /opt/volt/python-safetensors); this module puts it on sys.path.

Tensors go to and come from the tool as torch.save archives, which Volt reads and writes exactly
(test_checkpoint_interop.py), and are compared byte for byte, so NaN, -0.0 and the last bit of a
bfloat16 count.
"""

import json
import os
import subprocess
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from volt_testkit import import_from

TOOL = os.environ.get("SAFETENSORS_INTEROP_TOOL")
SAFETENSORS_PATH = Path(os.environ.get("VOLT_SAFETENSORS_PYTHONPATH", "/opt/volt/python-safetensors"))
safetensors, _ = import_from(SAFETENSORS_PATH, "safetensors", "safetensors.torch")


def run_tool(*args):
    assert TOOL, (
        "SAFETENSORS_INTEROP_TOOL is not set: run this through ctest "
        "(ctest -R safetensors_interop_py) or set it to the built safetensors_interop_tool")
    result = subprocess.run([TOOL, *map(str, args)], capture_output=True, text=True, timeout=120)
    return result


def every_dtype():
    """One tensor of every dtype LibTorch 1.13 and the format share, with awkward values and shapes."""
    base = torch.arange(-6, 6).reshape(3, 4)
    f32 = base.float() * 0.25
    f32[0, 0], f32[0, 1], f32[0, 2] = float("nan"), float("-inf"), -0.0
    f64 = base.double() / 3
    f64[2, 3] = torch.finfo(torch.float64).max
    return OrderedDict([
        ("model.embed.weight", f64),
        ("f32", f32),
        ("f16", (base.float() * 0.5).half()),
        ("bf16", (base.float() / 7).bfloat16()),  # rounded: every bit must survive
        ("i64", base * 2**40),
        ("i32", base.int() * 100000),
        ("i16", base.short() * 1000),
        ("i8", base.to(torch.int8) * 20),
        ("u8", torch.arange(0, 250, 20).to(torch.uint8)),
        ("bool", base % 3 == 0),
        ("scalar", torch.tensor(2.5)),
        ("scalar_bool", torch.tensor(True)),
        ("empty", torch.zeros(0, 3, dtype=torch.bfloat16)),
        ("ünïcode.näme", torch.ones(2, dtype=torch.float16)),
    ])


def assert_identical(expected, actual):
    assert set(actual) == set(expected), (sorted(actual), sorted(expected))
    for name, tensor in expected.items():
        got = actual[name]
        assert got.dtype == tensor.dtype, name
        assert got.shape == tensor.shape, name
        assert torch.equal(got.contiguous().reshape(-1).view(torch.uint8),
                           tensor.contiguous().reshape(-1).view(torch.uint8)), (name, tensor, got)


def volt_input(tmp_path, tensors, metadata):
    path = tmp_path / "in.pt"
    torch.save({"tensors": tensors, "metadata": metadata}, path)
    return path


def volt_output(path):
    loaded = torch.load(path)
    return loaded["tensors"], loaded["metadata"]


def test_python_loads_every_dtype_volt_writes(tmp_path):
    tensors = every_dtype()
    tensors["transposed"] = torch.arange(6.0).reshape(2, 3).t()  # Volt writes it in C order
    metadata = {"format": "pt", "written_by": "volt"}
    out = tmp_path / "volt.safetensors"
    result = run_tool("to-safetensors", volt_input(tmp_path, tensors, metadata), out)
    assert result.returncode == 0, result.stderr
    assert_identical(tensors, safetensors.torch.load_file(out))
    with safetensors.safe_open(str(out), framework="pt") as f:
        assert f.metadata() == metadata


def test_volt_writes_the_bytes_python_writes(tmp_path):
    tensors = every_dtype()
    metadata = {"format": "pt"}  # one key: Python's writer orders several arbitrarily
    ours = tmp_path / "volt.safetensors"
    theirs = tmp_path / "python.safetensors"
    result = run_tool("to-safetensors", volt_input(tmp_path, tensors, metadata), ours)
    assert result.returncode == 0, result.stderr
    safetensors.torch.save_file(tensors, theirs, metadata=metadata)
    assert ours.read_bytes() == theirs.read_bytes()


def test_volt_reads_every_dtype_python_writes(tmp_path):
    tensors = every_dtype()
    metadata = {"format": "pt", "epoch": "3", "note": "ünïcode and \"quotes\""}
    path = tmp_path / "python.safetensors"
    safetensors.torch.save_file(tensors, path, metadata=metadata)
    result = run_tool("to-torch", path, tmp_path / "out.pt")
    assert result.returncode == 0, result.stderr
    got, got_metadata = volt_output(tmp_path / "out.pt")
    assert_identical(tensors, got)
    assert got_metadata == metadata


def write_sharded_folder(folder, tensors, max_shard_bytes):
    """A sharded folder as transformers' save_pretrained writes it (huggingface_hub's split: a tensor
    that would tip a shard over starts the next one), with the index written as it writes it."""
    shards, current, size = [], OrderedDict(), 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = OrderedDict(), 0
        current[name] = tensor
        size += nbytes
    shards.append(current)
    weight_map = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        safetensors.torch.save_file(dict(shard), folder / file, metadata={"format": "pt"})
        weight_map.update({name: file for name in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return len(shards)


def test_volt_reads_a_sharded_folder_written_as_save_pretrained_writes_it(tmp_path):
    tensors = every_dtype()
    folder = tmp_path / "model"
    folder.mkdir()
    assert write_sharded_folder(folder, tensors, max_shard_bytes=64) >= 3
    result = run_tool("to-torch", folder, tmp_path / "out.pt")
    assert result.returncode == 0, result.stderr
    got, _ = volt_output(tmp_path / "out.pt")
    assert_identical(tensors, got)


def test_python_reads_the_sharded_folder_volt_writes(tmp_path):
    tensors = every_dtype()
    folder = tmp_path / "model"
    result = run_tool("to-folder", volt_input(tmp_path, tensors, {"format": "pt"}), folder, 64)
    assert result.returncode == 0, result.stderr
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) >= 3
    assert files == [f"model-{i:05d}-of-{len(files):05d}.safetensors" for i in range(1, len(files) + 1)]
    assert result.stdout.split() == files + ["model.safetensors.index.json"]
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    got = {}
    for file in files:
        with safetensors.safe_open(str(folder / file), framework="pt") as f:
            assert f.metadata() == {"format": "pt"}
            for name in f.keys():
                assert index["weight_map"][name] == file
                got[name] = f.get_tensor(name)
    assert_identical(tensors, got)


def test_volt_slices_rows_of_a_file_python_wrote(tmp_path):
    table = torch.arange(40, dtype=torch.float32).reshape(10, 4)
    path = tmp_path / "python.safetensors"
    safetensors.torch.save_file({"table": table, "other": torch.ones(3)}, path)
    result = run_tool("slice", path, "table", 3, 7, tmp_path / "out.pt")
    assert result.returncode == 0, result.stderr
    got, _ = volt_output(tmp_path / "out.pt")
    assert_identical({"table": table[3:7]}, got)
    with safetensors.safe_open(str(path), framework="pt") as f:  # the reference's own slice agrees
        assert torch.equal(f.get_slice("table")[3:7], got["table"])


def test_volt_refuses_a_truncated_python_file_naming_it(tmp_path):
    path = tmp_path / "python.safetensors"
    safetensors.torch.save_file({"w": torch.ones(16)}, path)
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(Exception):  # the reference refuses it too
        safetensors.torch.load_file(path)
    result = run_tool("to-torch", path, tmp_path / "out.pt")
    assert result.returncode == 2, result.stderr
    assert str(path) in result.stderr
    assert "beyond the byte buffer" in result.stderr
    assert "HINT:" in result.stderr
