"""Write a 'Volt-like' sharded checkpoint in DCP's own layout (.metadata + __<rank>_0.distcp) without
Python's pickle module: .metadata from minipickle.py (fixed protocol 2), each .distcp = concatenated
per-item torch.save zip archives (ITEM=torchsave: torch.save; ITEM=libtorch: torch._C._pickle_save, the
Python binding of LibTorch's torch::pickle_save). Same flat-range pieces / boxes as exp1.
usage: exp5_distcp_write.py OUTDIR W {torchsave|libtorch}"""
import io, os, sys, math, pickle
import torch
from common import reference, flat_range_boxes, box_slice, ST_DTYPE
from minipickle import metadata_pickle

out, W, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
os.makedirs(out, exist_ok=True)
model, optim = reference()
torch.save({"model": model, "optim": optim}, os.path.join(out, "..", "reference.pt"))


def item_bytes(t):
    if mode == "libtorch":
        return bytes(torch._C._pickle_save(t))
    buf = io.BytesIO(); torch.save(t, buf); return buf.getvalue()


params = list(model.keys()); numels = [model[k].numel() for k in params]
per = math.ceil(sum(numels) / W); starts = [sum(numels[:i]) for i in range(len(params))]
tensors, storage, planner = {}, {}, {}
for rank in range(W):
    fn, blob = f"__{rank}_0.distcp", bytearray()
    for i, p in enumerate(params):
        s, n = starts[i], numels[i]
        b, e = max(rank * per, s) - s, min((rank + 1) * per, s + n) - s
        entries = [(f"model.{p}", model[p], ("model", p))] + [
            (f"optim.state.{p}.{f}", optim[f"{p}.{f}"], ("optim", "state", p, f)) for f in ("exp_avg", "exp_avg_sq")]
        if rank == 0:
            entries.append((f"optim.state.{p}.step", optim[f"{p}.step"], ("optim", "state", p, "step")))
        for name, full, path in entries:
            rng = (0, 1) if full.dim() == 0 else (b, e)
            tensors.setdefault(name, (ST_DTYPE[full.dtype], list(full.shape), []))
            planner[name] = path
            for o, sz in flat_range_boxes(list(full.shape), *rng):
                data = item_bytes(box_slice(full, o, sz).contiguous().clone())
                storage[(name, tuple(o))] = (fn, len(blob), len(data))
                tensors[name][2].append((o, sz))
                blob += data
    open(os.path.join(out, fn), "wb").write(blob)
raw = metadata_pickle(tensors, storage, planner)
open(os.path.join(out, ".metadata"), "wb").write(raw)
md = pickle.loads(raw)       # sanity: Python unpickles it into the real classes
print(out, sorted(os.listdir(out)), ".metadata", len(raw), "bytes;", type(md).__name__,
      md.state_dict_metadata["model.fc1.weight"].chunks[:2])
