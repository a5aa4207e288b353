"""Load a DCP-layout checkpoint (.metadata + .distcp) on one process: dcp.load(no_dist) into a plain
model + Adam, and format_utils.dcp_to_torch_save; compare bit-exactly with the reference.
usage: exp6_fs_load_single.py CKPT_DIR REFERENCE.pt"""
import os, sys, tempfile
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from common import Net, compare

d, refp = sys.argv[1], sys.argv[2]
ref = torch.load(refp, weights_only=False)
ok = True
m = Net()
opt = torch.optim.Adam(m.parameters(), lr=1e-2)
m(torch.randn(2, 4)).sum().backward(); opt.step()
msd = {k: torch.zeros_like(v) for k, v in m.state_dict().items()}
names = [n for n, _ in m.named_parameters()]
state = {names[i]: {f: torch.zeros_like(v) for f, v in s.items()} for i, s in opt.state_dict()["state"].items()}
print("[a] dcp.load(no_dist=True) into a plain model + Adam state")
dcp.load({"model": msd, "optim": {"state": state}}, storage_reader=FileSystemReader(d), no_dist=True)
for k, v in ref["model"].items():
    ok &= compare(f"model.{k}", msd[k], v)
for k, v in ref["optim"].items():
    p, f = k.rsplit(".", 1); ok &= compare(f"optim.{k}", state[p][f], v)
print("[b] format_utils.dcp_to_torch_save")
out = os.path.join(tempfile.mkdtemp(dir="/tmp/dcp-research"), "full.pt")
dcp_to_torch_save(d, out)
sd = torch.load(out, weights_only=False)
print("  top-level keys:", sorted(sd), "| optim keys:", sorted(sd.get("optim", {})))
for k, v in ref["model"].items():
    ok &= compare(f"torch_save model.{k}", sd["model"][k], v)
for k, v in ref["optim"].items():
    p, f = k.rsplit(".", 1); ok &= compare(f"torch_save optim.state.{k}", sd["optim"]["state"][p][f], v)
print("ALL OK" if ok else "SOME MISMATCH")
