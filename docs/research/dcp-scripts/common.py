"""Shared helpers for the DCP interop experiments (torch 2.15 from /opt/volt/python-torchrun)."""
import json, struct, os
import torch, torch.nn as nn

ST_DTYPE = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
            torch.float64: "F64", torch.int64: "I64", torch.int32: "I32"}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 6)
        self.fc2 = nn.Linear(6, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def reference():
    """Deterministic model + Adam state after 2 steps: what 'Volt' would hold, consolidated."""
    torch.manual_seed(0)
    m = Net()
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    for _ in range(2):
        opt.zero_grad()
        m(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
    model = {k: v.detach().clone() for k, v in m.state_dict().items()}
    names = dict((id(p), n) for n, p in m.named_parameters())
    optim = {}
    for p, st in opt.state.items():
        for k, v in st.items():
            optim[f"{names[id(p)]}.{k}"] = v.detach().clone()
    return model, optim


def tensor_bytes(t):
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).reshape(-1).tolist()) if t.numel() else b""


def write_safetensors(path, tensors, metadata=None):
    """Raw-bytes safetensors writer (what a C++ writer does): tensors = {name: torch.Tensor}."""
    header, blobs, off = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata          # str -> str only
    for name, t in tensors.items():
        b = tensor_bytes(t)
        header[name] = {"dtype": ST_DTYPE[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)           # pad header to 8 bytes (as safetensors does)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    return hj


def flat_range_boxes(shape, begin, end):
    """Decompose the row-major element range [begin, end) of a tensor of `shape` into boxes
    (offsets, sizes); at most 2*(ndim-1)+1 boxes. A 0-d tensor is one box ([], [])."""
    if len(shape) == 0:
        return [([], [])] if begin < end else []
    if begin >= end:
        return []
    if len(shape) == 1:
        return [([begin], [end - begin])]
    inner = 1
    for s in shape[1:]:
        inner *= s
    r0, c0 = divmod(begin, inner)
    r1, c1 = divmod(end, inner)
    boxes = []
    if r0 == r1:  # inside one row
        return [([r0] + o, [1] + s) for o, s in flat_range_boxes(shape[1:], c0, c1)]
    if c0:
        boxes += [([r0] + o, [1] + s) for o, s in flat_range_boxes(shape[1:], c0, inner)]
        r0 += 1
    if r1 > r0:
        boxes.append(([r0] + [0] * (len(shape) - 1), [r1 - r0] + list(shape[1:])))
    if c1:
        boxes += [([r1] + o, [1] + s) for o, s in flat_range_boxes(shape[1:], 0, c1)]
    return boxes


def box_slice(t, offsets, sizes):
    return t[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))]


def compare(name, a, b):
    ok = a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    print(f"  {'OK ' if ok else 'BAD'} {name} {tuple(a.shape)} {a.dtype}")
    return ok
