"""Load the HF-layout sharded checkpoint on ONE process (no process group) with dcp.load, into a plain
model + Adam; then the dcp_to_torch_save equivalent and the HF consolidation helper.
usage: exp2_hf_load_single.py CKPT_DIR"""
import os, sys, tempfile
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import HuggingFaceStorageReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
from common import Net, compare

d = sys.argv[1]
ref = torch.load(os.path.join(d, "..", "reference.pt"))
ok = True

print("[a] dcp.load(no_dist=True) into a fresh plain model + Adam (state from the checkpoint)")
m = Net()
for p in m.parameters():
    p.data.zero_()
opt = torch.optim.Adam(m.parameters(), lr=1e-2)
opt.zero_grad(); m(torch.randn(2, 4)).sum().backward(); opt.step()   # materialize Adam state
m.load_state_dict({k: torch.zeros_like(v) for k, v in m.state_dict().items()})
msd = m.state_dict()
osd = opt.state_dict()            # int-keyed: rename to FQN keys for the flat checkpoint names
names = [n for n, _ in m.named_parameters()]
state = {names[i]: s for i, s in osd["state"].items()}
dcp.load({"model": msd, "optim": {"state": state}},
         storage_reader=HuggingFaceStorageReader(d), no_dist=True)
for k in ref["model"]:
    ok &= compare(f"model.{k}", msd[k], ref["model"][k])
for k, v in ref["optim"].items():
    p, f = k.rsplit(".", 1)
    ok &= compare(f"optim.{k}", state[p][f], v)

print("[b] full optimizer state_dict (param_groups are not tensors -> absent) needs allow_partial_load")
full_osd = {"state": state, "param_groups": osd["param_groups"]}
try:
    dcp.load({"optim": full_osd}, storage_reader=HuggingFaceStorageReader(d), no_dist=True)
    print("  loaded without allow_partial_load (unexpected)")
except BaseException as e:
    print("  without it:", type(e).__name__, [l for l in str(e).splitlines() if "Missing key" in l][:1])
dcp.load({"optim": full_osd}, storage_reader=HuggingFaceStorageReader(d), no_dist=True,
         planner=DefaultLoadPlanner(allow_partial_load=True))
print("  with DefaultLoadPlanner(allow_partial_load=True): loaded; param_groups kept:", full_osd["param_groups"][0]["lr"])

print("[c] dcp_to_torch_save equivalent: _load_state_dict(_EmptyStateDictLoadPlanner, no_dist) + torch.save")
sd = {}
_load_state_dict(sd, storage_reader=HuggingFaceStorageReader(d), planner=_EmptyStateDictLoadPlanner(), no_dist=True)
tmp = tempfile.mkdtemp(dir="/tmp/dcp-research")
torch.save(sd, os.path.join(tmp, "full.pt"))
sd = torch.load(os.path.join(tmp, "full.pt"))
print("  keys are flat:", sorted(sd)[:3], "...")
for k in ref["model"]:
    ok &= compare(f"consolidated model.{k}", sd[f"model.{k}"], ref["model"][k])
for k, v in ref["optim"].items():
    ok &= compare(f"consolidated optim.state.{k}", sd[f"optim.state.{k}"], v)

print("[d] format_utils.dcp_to_torch_save itself (hard-wired FileSystemReader -> needs .metadata)")
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
try:
    dcp_to_torch_save(d, os.path.join(tmp, "x.pt")); print("  worked")
except BaseException as e:
    print("  fails:", type(e).__name__, str(e).splitlines()[0][:120])

print("[e] _consolidate_hf_safetensors.consolidate_safetensors_files -> one full safetensors file")
from torch.distributed.checkpoint._consolidate_hf_safetensors import consolidate_safetensors_files
from safetensors.torch import load_file
outd = os.path.join(tmp, "consolidated"); os.makedirs(outd)
keys = [f"model.{k}" for k in ref["model"]] + [f"optim.state.{k}" for k in ref["optim"]]
consolidate_safetensors_files(d, outd, fqn_to_index_mapping=dict.fromkeys(keys, 1))
print("  wrote", sorted(os.listdir(outd)))
full = load_file(os.path.join(outd, "model-00001-of-00001.safetensors"))
for k in ref["model"]:
    ok &= compare(f"hf-consolidated model.{k}", full[f"model.{k}"], ref["model"][k])
for k, v in ref["optim"].items():
    ok &= compare(f"hf-consolidated optim.state.{k}", full[f"optim.state.{k}"], v)
print("ALL OK" if ok else "SOME MISMATCH")
