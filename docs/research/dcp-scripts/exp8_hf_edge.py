"""Edge cases of HuggingFaceStorageReader: a BF16/I64 file without __metadata__ (whole tensors, offset 0),
and a replicated tensor written by two ranks (same name, same offsets) - what happens."""
import json, os, shutil
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import HuggingFaceStorageReader
from common import write_safetensors, compare

d = "/tmp/dcp-research/edge1"; shutil.rmtree(d, ignore_errors=True); os.makedirs(d)
torch.manual_seed(1)
w = torch.randn(5, 3).to(torch.bfloat16); ids = torch.arange(7, dtype=torch.int64) * 3
write_safetensors(f"{d}/whole.safetensors", {"w": w, "ids": ids})          # no __metadata__ at all
sd = {"w": torch.zeros(5, 3, dtype=torch.bfloat16), "ids": torch.zeros(7, dtype=torch.int64)}
dcp.load(sd, storage_reader=HuggingFaceStorageReader(d), no_dist=True)
print("[1] no __metadata__, BF16 + I64:"); compare("w", sd["w"], w); compare("ids", sd["ids"], ids)

d = "/tmp/dcp-research/edge2"; shutil.rmtree(d, ignore_errors=True); os.makedirs(d)
step = torch.tensor(5.0)
for r, rows in ((0, slice(0, 2)), (1, slice(2, 5))):
    meta = {"DCP_SHARDING_INFO": json.dumps({"w": {"saved_offsets": [rows.start, 0]}, "step": {"saved_offsets": []}})}
    write_safetensors(f"{d}/r{r}.safetensors", {"w": w[rows].contiguous(), "step": step}, meta)
sd = {"w": torch.zeros(5, 3, dtype=torch.bfloat16), "step": torch.tensor(0.0)}
try:
    dcp.load(sd, storage_reader=HuggingFaceStorageReader(d), no_dist=True)
    print("[2] replicated 'step' in both files: loads;"); compare("w", sd["w"], w); compare("step", sd["step"], step)
except BaseException as e:
    print("[2] replicated 'step' in both files: FAILS", type(e).__name__, str(e)[:200])

d = "/tmp/dcp-research/edge3"; shutil.rmtree(d, ignore_errors=True); os.makedirs(d)
meta = {"DCP_SHARDING_INFO": json.dumps({"w": {"saved_offsets": [0, 0]}})}
write_safetensors(f"{d}/r0.safetensors", {"w": w[:2].contiguous(), "x": ids}, meta)  # 'x' missing from info
try:
    dcp.load({"w": torch.zeros(2, 3, dtype=torch.bfloat16)}, storage_reader=HuggingFaceStorageReader(d), no_dist=True)
    print("[3] a tensor missing from DCP_SHARDING_INFO: loads")
except BaseException as e:
    print("[3] a tensor missing from DCP_SHARDING_INFO: FAILS", type(e).__name__, repr(e)[:150].replace("\n", " "))

d = "/tmp/dcp-research/edge4"; shutil.rmtree(d, ignore_errors=True); os.makedirs(d)
meta = {"DCP_SHARDING_INFO": json.dumps({"w": {"saved_offsets": [2, 0]}})}
write_safetensors(f"{d}/r1.safetensors", {"w": w[2:].contiguous()}, meta)   # rows 0-1 never written
sd = {"w": torch.zeros(5, 3, dtype=torch.bfloat16)}
try:
    dcp.load(sd, storage_reader=HuggingFaceStorageReader(d), no_dist=True)
    print("[4] rows 0-1 missing from every file: loads silently; rows 0-1 stay", sd["w"][:2].float().tolist())
except BaseException as e:
    print("[4] missing rows: FAILS", type(e).__name__)
