"""A sharded Volt checkpoint in PyTorch 2.x's torch.distributed.checkpoint (issue #32).

Run by CTest (test `dcp_interop_py`), which sets VOLT_GPT_EXAMPLE, VOLT_CHECKPOINT_TOOL and
PYTHONPATH to PyPI's torch 2.x and safetensors (scripts/setup.sh). examples/gpt trains 2 steps under
fsdp full_shard on 2 processes with state_dict_type sharded; `volt checkpoint to-dcp` writes that
checkpoint's pieces, unconsolidated, as the chunks HuggingFaceStorageReader reads, and `dcp.load`
gives Volt's consolidated tensors (`volt checkpoint to-safetensors`) bit-exactly: into a plain state
dict on one process, and into FSDP2 (`fully_shard`) models at world sizes 2 and 4, which reshard
the 2 processes' pieces. The other way: FSDP2 on 3 processes (uneven pieces) saves model and
Adam state with dcp.save's default writer (.metadata + .distcp), and `volt checkpoint from-dcp`
gives every tensor whole, bit-exactly; a .metadata missing a piece is refused. A Volt fit resumes
from that folder (ckpt_path) with PyTorch's weights and Adam state bit-exactly, refuses a renamed
parameter or optimizer field with the errors of its own files, and resumes under fsdp on 2
processes. About 40 s on 2 cores, most of it importing torch in 8 processes.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from volt_testkit import free_port, require

try:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import torch.multiprocessing as mp
    from safetensors.torch import load_file
    from torch.distributed.checkpoint import HuggingFaceStorageReader
except ImportError as error:
    require(False, f"torch 2.x and safetensors do not import (PYTHONPATH={os.environ.get('PYTHONPATH')}): {error}")
require(hasattr(dcp, "HuggingFaceStorageReader"), f"torch {torch.__version__} has no HuggingFaceStorageReader")

GPT = os.environ.get("VOLT_GPT_EXAMPLE")
TOOL = os.environ.get("VOLT_CHECKPOINT_TOOL")
INTEROP_TOOL = os.environ.get("CHECKPOINT_INTEROP_TOOL")


def run(args, cwd):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI_", "PMIX_", "PYTHON"))}
    env["OMP_NUM_THREADS"] = "1"
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=180, cwd=cwd, env=env)
    assert result.returncode == 0, f"{args} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    assert GPT and TOOL, "run through ctest (ctest -R dcp_interop_py): VOLT_GPT_EXAMPLE and VOLT_CHECKPOINT_TOOL"
    root = tmp_path_factory.mktemp("dcp")
    run([GPT, "--text", "/usr/share/common-licenses/GPL-3", "--n-layer", "2", "--n-head", "2", "--n-embd", "32",
         "--block-size", "32", "--devices", "2", "--batch-size", "4", "--strategy", "fsdp", "--sharding-strategy",
         "full_shard", "--state-dict-type", "sharded", "--max-steps", "2", "--sample-tokens", "0",
         "--limit-val-batches", "0", "--num-threads", "1", "--no-progress-bar", "--default-root-dir", root], root)
    [ckpt] = list(root.rglob("last.ckpt"))
    assert list(ckpt.parent.glob("last.ckpt.*.shard1")), "the checkpoint is not sharded"
    print(run([TOOL, "to-dcp", ckpt, root / "dcp", "--layout", "safetensors"], root))
    print(run([TOOL, "to-dcp", ckpt, root / "native"], root))
    run([TOOL, "to-safetensors", ckpt, root / "whole.safetensors"], root)
    return root / "dcp", load_file(root / "whole.safetensors")


def volt_adam_state(ckpt):
    """Adam's state in a sharded Volt checkpoint, whole, by parameter name (the checkpoint's
    volt_optimizer_parameter_names): each process's pieces put at the elements its shard's marker
    names. And rank 0's param_groups, each with "names", its parameters' names."""
    import math

    top = torch.load(ckpt, weights_only=False)
    names = top["volt_optimizer_parameter_names"][0]
    state, groups = {}, None
    for file in top["sharded_optimizer_states"]["files"]:
        adam = torch.load(ckpt.parent / file, weights_only=False)["optimizer_states"][0]
        groups = groups or adam["param_groups"]
        marker = adam["volt_shard"]
        for id, fields in adam["state"].items():
            entry = state.setdefault(names[id], {})
            shape, begin = marker["shapes"][id], marker["pieces"][2 * id]
            for key, value in fields.items():
                if key not in marker["elementwise"]:
                    entry[key] = value
                    continue
                flat = entry.setdefault(key, torch.full((math.prod(shape),), float("nan")))
                flat[begin:begin + value.numel()] = value.reshape(-1)
    first = 0
    for group in groups:
        group["names"] = names[first:first + len(group["params"])]
        first += len(group["params"])
    return names, state, groups


@pytest.fixture(scope="module")
def native(exported):
    """The native layout (.metadata + .distcp) of the same checkpoint, and what it must hold: the
    consolidated weights, and Adam's state joined from the shards."""
    folder, whole = exported
    [ckpt] = list(folder.parent.rglob("last.ckpt"))
    names, state, groups = volt_adam_state(ckpt)
    shapes = {name: tensor.shape for name, tensor in whole.items()}
    state = {name: {k: v.reshape(shapes[name]) if k != "step" else v for k, v in fields.items()}
             for name, fields in state.items()}
    for fields in state.values():
        for value in fields.values():
            assert not value.isnan().any(), "the shards' pieces leave a gap"
    return folder.parent / "native", whole, names, state, groups


def test_the_native_layout_consolidates_with_dcp_to_torch_save(native, tmp_path):
    """PyTorch's own consolidation of the native layout: the weights and Adam's state as Volt holds
    them, nested as dcp.save({"model": ..., "optim": ...}) nests them."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    folder, whole, names, state, groups = native
    assert sorted(p.name for p in folder.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    dcp_to_torch_save(folder, tmp_path / "whole.pt")
    saved = torch.load(tmp_path / "whole.pt", weights_only=False)
    assert sorted(saved["model"]) == sorted(whole)
    for name, tensor in whole.items():
        assert torch.equal(saved["model"][name], tensor), name
    assert sorted(saved["optim"]["state"]) == sorted(state)
    for name, fields in state.items():
        for key, value in fields.items():
            assert torch.equal(saved["optim"]["state"][name][key], value), (name, key)
    # examples/gpt's two groups (weight decay on the matrices only), parameters by name.
    assert [group["params"] for group in saved["optim"]["param_groups"]] == [group["names"] for group in groups]
    for group, volt in zip(saved["optim"]["param_groups"], groups):
        assert group["lr"] == volt["lr"] and group["weight_decay"] == volt["weight_decay"] and group["foreach"] is None


def test_the_pieces_are_chunks_that_tile_each_tensor_unconsolidated(exported):
    folder, whole = exported
    files = sorted(p.name for p in folder.iterdir())
    assert "model.safetensors" in files and "shard0-0.safetensors" in files and "shard1-0.safetensors" in files, files
    # The blocks' weights are only in the shards, each process's piece apart.
    from safetensors import safe_open
    with safe_open(folder / "model.safetensors", "pt") as f:
        in_model = set(f.keys())
    assert "transformer.h.0.attn.c_attn.weight" not in in_model and "transformer.wte.weight" in in_model


def test_dcp_load_on_one_process_gives_the_consolidated_tensors(exported):
    folder, whole = exported
    state = {name: torch.zeros_like(tensor) for name, tensor in whole.items()}
    dcp.load(state, storage_reader=HuggingFaceStorageReader(str(folder)), no_dist=True)
    for name, tensor in whole.items():
        assert torch.equal(state[name], tensor), name


class Named(torch.nn.Module):
    """A module whose parameters have the given names and shapes (nested by the dots)."""

    def __init__(self, shapes):
        super().__init__()
        for name, shape in shapes.items():
            owner = self
            *path, leaf = name.split(".")
            for part in path:
                if not hasattr(owner, part):
                    owner.add_module(part, torch.nn.Module())
                owner = getattr(owner, part)
            owner.register_parameter(leaf, torch.nn.Parameter(torch.zeros(shape)))


def leave_cleanly():
    """Ends a spawned process that did its work: every process past its last collective, the group
    destroyed, and out without the interpreter's finalization, in which Gloo's threads abort a
    process now and then ("terminate called without an active exception"; pytorch/pytorch#179291).
    What the test needs was written (files, the failures queue) before."""
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def load_native(model, native_folder, expected, failures, where, no_dist=False):
    """dcp.load of the native layout into `model` and an Adam over it with Volt's groups, as a PyTorch
    user resumes (get_state_dict, dcp.load, set_state_dict); every weight, Adam field and group's
    hyperparameters are compared whole with `expected` (whole weights, Adam's state by name, groups)."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict, get_state_dict, set_state_dict)
    whole, state, groups = expected
    parameters = dict(model.named_parameters())
    optimizer = torch.optim.Adam([{"params": [parameters[name] for name in group["names"]]} for group in groups],
                                 lr=1.0, weight_decay=0.5)
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.load({"model": model_state, "optim": optim_state}, checkpoint_id=native_folder, no_dist=no_dist)
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state)
    options = StateDictOptions(full_state_dict=True)
    loaded_model = get_model_state_dict(model, options=options)
    loaded_optim = get_optimizer_state_dict(model, optimizer, options=options)
    for name, tensor in whole.items():
        if not torch.equal(loaded_model[name], tensor):
            failures.put(f"{where}: model {name}")
    for name, fields in state.items():
        for key, value in fields.items():
            if not torch.equal(loaded_optim["state"][name][key], value):
                failures.put(f"{where}: optim {name}.{key}")
    for loaded, volt in zip(optimizer.param_groups, groups):
        if (loaded["lr"], loaded["weight_decay"], tuple(loaded["betas"])) != (volt["lr"], volt["weight_decay"],
                                                                               tuple(volt["betas"])):
            failures.put(f"{where}: param group {loaded}")


def load_under_fsdp2(rank, world, port, folder, whole_path, native_folder, expected_path, failures):
    """Both layouts into FSDP2 models at `world` processes: the safetensors one's weights, and the
    native one's weights and Adam state."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        whole = load_file(whole_path)
        mesh = init_device_mesh("cpu", (world,))
        model = Named({name: tensor.shape for name, tensor in whole.items()})
        fully_shard(model, mesh=mesh)
        state = get_model_state_dict(model)
        dcp.load(state, storage_reader=HuggingFaceStorageReader(folder))
        for name, tensor in whole.items():
            value = state[name]
            value = value.full_tensor() if hasattr(value, "full_tensor") else value
            if not torch.equal(value, tensor):
                failures.put(f"world size {world}, rank {rank}: {name}")
        model = Named({name: tensor.shape for name, tensor in whole.items()})
        fully_shard(model, mesh=mesh)
        load_native(model, native_folder, torch.load(expected_path, weights_only=False), failures,
                    f"native, world size {world}, rank {rank}")
        leave_cleanly()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_the_native_layout_refuses_a_prefix_and_a_folder_that_holds_a_checkpoint(native, tmp_path):
    folder = native[0]
    [ckpt] = list(folder.parent.rglob("last.ckpt"))
    for args, expected in [([tmp_path / "x", "--prefix", "model."], "HINT: add --layout safetensors"),
                           ([folder], "already holds a distributed checkpoint (.metadata)")]:
        result = subprocess.run([str(a) for a in [TOOL, "to-dcp", ckpt] + args], capture_output=True, text=True,
                                timeout=60)
        assert result.returncode != 0 and expected in result.stdout + result.stderr, result


def test_the_native_layout_loads_into_a_plain_model_and_adam_on_one_process(native):
    folder, whole, names, state, groups = native
    failures = mp.get_context("spawn").SimpleQueue()
    load_native(Named({name: tensor.shape for name, tensor in whole.items()}), folder, (whole, state, groups), failures,
                "one process", no_dist=True)
    found = []
    while not failures.empty():
        found.append(failures.get())
    assert not found, found


@pytest.mark.parametrize("world", [2, 4])
def test_dcp_load_into_fsdp2_reshards_the_pieces_bit_exactly(exported, native, tmp_path, world):
    """Both layouts: the safetensors one's weights, the native one's weights and Adam state."""
    folder, whole = exported
    native_folder, _, _, state, groups = native
    whole_path, expected_path = tmp_path / "whole.safetensors", tmp_path / "expected.pt"
    from safetensors.torch import save_file
    save_file(whole, whole_path)
    torch.save((whole, state, groups), expected_path)
    failures = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(load_under_fsdp2, args=(world, free_port(), str(folder), str(whole_path), str(native_folder),
                                               str(expected_path), failures),
                       nprocs=world, start_method="spawn")
    found = []
    while not failures.empty():
        found.append(failures.get())
    assert not found, found


# ---- the other way: a checkpoint PyTorch 2.x's dcp.save wrote, read by Volt ---------------------

class Net(torch.nn.Module):
    """5 rows in fc1 over 3 processes: FSDP2's Shard(0) pieces are uneven (2, 2, 1)."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 5)
        self.fc2 = torch.nn.Linear(5, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def save_under_fsdp2(rank, world, port, folder, reference_path):
    """FSDP2 (fully_shard) + Adam, 2 steps, then dcp.save of model and optimizer with the default writer;
    rank 0 also writes every tensor whole (model.*, optim.state.*) as the reference."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from safetensors.torch import save_file
        from torch.distributed.checkpoint.state_dict import get_state_dict
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        torch.manual_seed(7)
        model = Net()
        fully_shard(model.fc1, mesh=mesh)
        fully_shard(model.fc2, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        for _ in range(2):
            model(torch.randn(8, 4)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        model_state, optim_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=folder)
        full = {f"model.{k}": v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model_state.items()}
        for param, state in optim_state["state"].items():
            for field, v in state.items():
                full[f"optim.state.{param}.{field}"] = v.full_tensor() if hasattr(v, "full_tensor") else v
        if rank == 0:
            save_file({k: v.detach().contiguous() for k, v in full.items()}, reference_path)
        leave_cleanly()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.fixture(scope="module")
def pytorch_dcp(tmp_path_factory):
    assert TOOL, "run through ctest (ctest -R dcp_interop_py): VOLT_CHECKPOINT_TOOL"
    root = tmp_path_factory.mktemp("pytorch_dcp")
    folder, reference = root / "dcp", root / "reference.safetensors"
    mp.start_processes(save_under_fsdp2, args=(3, free_port(), str(folder), str(reference)), nprocs=3,
                       start_method="spawn")
    assert (folder / ".metadata").exists() and len(list(folder.glob("*.distcp"))) == 3, list(folder.iterdir())
    return root, folder, load_file(reference)


def test_volt_reads_a_pytorch_fsdp_checkpoint_model_and_optimizer_bit_exactly(pytorch_dcp):
    root, folder, reference = pytorch_dcp
    print(run([TOOL, "from-dcp", folder, root / "all.safetensors"], root))
    ours = load_file(root / "all.safetensors")
    assert sorted(ours) == sorted(reference)
    assert "optim.state.fc1.weight.step" in ours and ours["optim.state.fc1.weight.step"].dim() == 0
    for name, tensor in reference.items():
        assert ours[name].dtype == tensor.dtype and torch.equal(ours[name], tensor), name
    # --prefix: the model's state dict, named as the model names it (what a fine-tuning run loads).
    run([TOOL, "from-dcp", folder, root / "model.safetensors", "--prefix", "model."], root)
    model = load_file(root / "model.safetensors")
    assert sorted(model) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    assert torch.equal(model["fc1.weight"], reference["model.fc1.weight"])


def test_a_checkpoint_missing_a_piece_is_refused_naming_the_tensor(pytorch_dcp, tmp_path):
    import pickle
    import shutil
    _, folder, _ = pytorch_dcp
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    with open(broken / ".metadata", "rb") as f:
        metadata = pickle.load(f)
    chunks = metadata.state_dict_metadata["model.fc1.weight"].chunks
    del chunks[-1]  # the last process's rows
    with open(broken / ".metadata", "wb") as f:
        pickle.dump(metadata, f)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    result = subprocess.run([TOOL, "from-dcp", broken, tmp_path / "out.safetensors"], capture_output=True, text=True,
                            timeout=60, env=env)
    assert result.returncode != 0
    message = result.stdout + result.stderr
    assert "the pieces of model.fc1.weight hold 16 of its 20 elements" in message, message
    assert "HINT:" in message, message
    assert not (tmp_path / "out.safetensors").exists()


def test_a_fit_fine_tuning_from_it_reads_each_parameters_elements_and_a_wrong_shape_is_named(pytorch_dcp, tmp_path):
    """DcpWeights, what a module returns as initial_weights to fine-tune from a PyTorch checkpoint: the
    elements a process asks for (here rows 1-3 of fc1.weight, a range that crosses FSDP2's pieces)."""
    import json
    root, folder, reference = pytorch_dcp
    assert INTEROP_TOOL, "run through ctest: CHECKPOINT_INTEROP_TOOL"
    out = run([INTEROP_TOOL, "dcp-weights", folder, "model.", "fc1.weight", "5,4", 4, 16], root)
    values = torch.tensor(json.loads(out)["values"], dtype=torch.float64)
    assert torch.equal(values, reference["model.fc1.weight"].reshape(-1)[4:16].double())
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    wrong = subprocess.run([INTEROP_TOOL, "dcp-weights", folder, "model.", "fc1.weight", "4,5", "0", "20"],
                           capture_output=True, text=True, timeout=60, env=env)
    assert wrong.returncode == 2, wrong
    assert "model.fc1.weight has shape [5, 4], but the model's parameter fc1.weight has shape [4, 5]" in wrong.stderr
    assert "HINT:" in wrong.stderr


def renamed_copy(folder, dst, renames):
    """A copy of a DCP folder whose entries `renames` maps to other names (in .metadata only)."""
    import dataclasses
    import pickle
    import shutil
    shutil.copytree(folder, dst)
    with open(dst / ".metadata", "rb") as f:
        metadata = pickle.load(f)
    for old, new in renames.items():
        metadata.state_dict_metadata[new] = metadata.state_dict_metadata.pop(old)
    metadata.storage_data = {dataclasses.replace(k, fqn=renames.get(k.fqn, k.fqn)): v
                             for k, v in metadata.storage_data.items()}
    with open(dst / ".metadata", "wb") as f:
        pickle.dump(metadata, f)
    return dst


def test_a_volt_fit_resumes_from_it_with_pytorchs_weights_and_adam_state_bit_exactly(pytorch_dcp, tmp_path):
    """Trainer::fit(ckpt_path=the folder): right after the restore the module holds PyTorch's weights and
    Adam (one group over fc1.weight, fc1.bias, fc2.weight, fc2.bias, PyTorch's order) its moments and
    step, bit for bit; the fit goes on from global step 2 (the optimizer's step count)."""
    _, folder, reference = pytorch_dcp
    assert INTEROP_TOOL, "run through ctest: CHECKPOINT_INTEROP_TOOL"
    dump = tmp_path / "restored.ckpt"
    run([INTEROP_TOOL, "dcp-fit", folder, tmp_path / "run", 1, "auto", 4, dump], tmp_path)
    restored = torch.load(dump, weights_only=True)
    assert (restored["start_step"], restored["end_step"]) == (2, 4), restored
    optimizer = restored["optimizer"]
    [group] = optimizer["param_groups"]
    assert group["params"] == [0, 1, 2, 3] and group["lr"] == 1e-2, group
    for i, name in enumerate(["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]):
        weight, theirs = restored["weights"][name], reference[f"model.{name}"]
        assert weight.dtype == theirs.dtype and torch.equal(weight, theirs), name
        for field in ("exp_avg", "exp_avg_sq"):
            ours, theirs = optimizer["state"][i][field], reference[f"optim.state.{name}.{field}"]
            assert ours.dtype == theirs.dtype and torch.equal(ours, theirs), (name, field)
        assert optimizer["state"][i]["step"].item() == reference[f"optim.state.{name}.step"].item() == 2.0


def test_a_checkpoint_that_does_not_fit_is_refused_as_volts_own_files_are(pytorch_dcp, tmp_path):
    _, folder, _ = pytorch_dcp
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SLURM_"))}
    cases = [({"model.fc1.weight": "model.fc9.weight"}, [f"checkpoint '{tmp_path / 'broken0'}' does not fit module",
                                                          "missing: 'fc1.weight'", "unexpected: 'fc9.weight'"]),
             ({"optim.state.fc2.bias.exp_avg_sq": "optim.state.fc2.bias.square_avg"},
              ["state[3]['exp_avg_sq'] is missing", "build the optimizer as the run that wrote the checkpoint did"])]
    for i, (renames, expected) in enumerate(cases):
        broken = renamed_copy(folder, tmp_path / f"broken{i}", renames)
        result = subprocess.run([INTEROP_TOOL, "dcp-fit", broken, tmp_path / f"run{i}", "1", "auto", "4",
                                 tmp_path / "unused.ckpt"], capture_output=True, text=True, timeout=60, env=env)
        assert result.returncode == 2, result
        for text in expected + ["HINT:"]:
            assert text in result.stderr, (text, result.stderr)


def test_a_fit_under_fsdp_at_another_world_size_resumes_from_it_and_trains_on(pytorch_dcp, tmp_path):
    """Saved by 3 processes, resumed by 2 under strategy fsdp: each cuts the whole optimizer state to its
    piece, and the fit takes 2 more steps from step 2."""
    _, folder, _ = pytorch_dcp
    dump = tmp_path / "fsdp.ckpt"
    run([INTEROP_TOOL, "dcp-fit", folder, tmp_path / "run", 2, "fsdp", 4, dump], tmp_path)
    restored = torch.load(dump, weights_only=True)
    assert (restored["world_size"], restored["start_step"], restored["end_step"]) == (2, 2, 4), restored
