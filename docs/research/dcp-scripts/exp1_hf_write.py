"""Write a 'Volt-like' sharded checkpoint in the layout HuggingFaceStorageReader reads, with raw bytes
(no torch.save, no pickle, no safetensors package). Each rank owns a flat element range of one flat
buffer over all parameters (like Volt's fsdp full_shard); each piece is cut into boxes, and box k of
every tensor goes to that rank's file k (a safetensors file may hold a name only once).
usage: exp1_hf_write.py OUTDIR WORLD_SIZE"""
import json, os, sys, math
import torch
from common import reference, write_safetensors, flat_range_boxes, box_slice

out, W = sys.argv[1], int(sys.argv[2])
os.makedirs(out, exist_ok=True)
model, optim = reference()
torch.save({"model": model, "optim": optim}, os.path.join(out, "..", f"reference.pt"))

# one flat buffer over the parameters, cut into W equal pieces (Volt-like); padded at the end
params = list(model.keys())
numels = [model[k].numel() for k in params]
total = sum(numels)
per = math.ceil(total / W)
starts = [sum(numels[:i]) for i in range(len(params))]

def piece(rank, name):  # the element range [b, e) of param `name` owned by `rank`
    s = starts[params.index(name)]; n = model[name].numel()
    b, e = max(rank * per, s), min((rank + 1) * per, s + n)
    return (b - s, e - s) if b < e else (0, 0)

for rank in range(W):
    files = {}  # box index -> {dcp_name: (tensor, offsets)}
    for p in params:
        b, e = piece(rank, p)
        entries = [(f"model.{p}", model[p])]
        for field in ("exp_avg", "exp_avg_sq"):           # elementwise optimizer state: same piece
            entries.append((f"optim.state.{p}.{field}", optim[f"{p}.{field}"]))
        for name, full in entries:
            for k, (o, s) in enumerate(flat_range_boxes(list(full.shape), b, e)):
                files.setdefault(k, {})[name] = (box_slice(full, o, s).contiguous(), o)
        if rank == 0:                                       # replicated 0-d 'step': rank 0 only
            files.setdefault(0, {})[f"optim.state.{p}.step"] = (optim[f"{p}.step"], [])
    for k, entries in files.items():
        info = {name: {"saved_offsets": o} for name, (t, o) in entries.items()}
        meta = {"DCP_SHARDING_INFO": json.dumps(info), "DCP_VERSION": "1.0", "format": "pt"}
        fn = f"shard-{rank + 1:05d}-model-{k + 1:05d}-of-{len(files):05d}.safetensors"
        hj = write_safetensors(os.path.join(out, fn), {n: t for n, (t, _) in entries.items()}, meta)
        if rank == 0 and k == 0:
            open(os.path.join(out, "..", f"example_header_ws{W}.json"), "w").write(
                json.dumps(json.loads(hj), indent=1))
print(sorted(os.listdir(out)))
