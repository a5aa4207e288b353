"""The PyTorch and Lightning sides of bench/gpt_vs_pytorch.sh: the GPT of examples/gpt (GPT-2's
architecture, tied embeddings, GELU tanh) with the same recipe (AdamW betas 0.9/0.95, weight decay
0.1 on tensors of 2 or more dimensions only, linear warmup then cosine decay to a tenth, per step),
started from the weights bench_gpt_throughput wrote (--init, safetensors), trained on the same
byte windows of --text in the same order (DistributedSampler, seed 0, as Volt's
sampler draws it), 1 thread per process.

    python3 bench/pytorch_gpt.py --framework pytorch|lightning --processes N --steps S --warmup W \
        --init init.safetensors --text corpus.txt [--n-layer 4 --n-head 4 --n-embd 128 --block-size 128
        --batch-size 16]
Prints, from rank 0, `<framework> processes=N step_ms=... tokens_per_s=... flops_per_s=... steps=S`
and `losses l1 l2 ...` (every step's loss) like the Volt side. Plain PyTorch runs several
processes as DistributedDataParallel over Gloo (torch.multiprocessing); Lightning (1.9.5, on
PYTHONPATH) with strategy="ddp" on the CPU.
"""
import argparse
import json
import math
import os
import socket
import struct
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64}


def read_safetensors(path):
    """A safetensors file as {name: tensor} (the format is an 8-byte header length, a JSON header
    and raw little-endian bytes; only the dtypes Volt writes for these weights)."""
    with open(path, "rb") as f:
        blob = f.read()
    (length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + length])
    data = blob[8 + length:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        array = np.frombuffer(data[begin:end], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
        out[name] = torch.from_numpy(array.copy())
    return out


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.attn.c_proj = nn.Linear(n_embd, n_embd)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.mlp.c_proj = nn.Linear(4 * n_embd, n_embd)

    def attention(self, x):
        b, t, e = x.shape
        q, k, v = self.attn.c_attn(x).split(e, dim=2)
        q, k, v = (z.view(b, t, self.n_head, e // self.n_head).transpose(1, 2) for z in (q, k, v))
        # What Volt's attention computes on LibTorch 1.13: softmax(QKᵀ/√d + causal mask) V.
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        y = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        return self.attn.c_proj(y.transpose(1, 2).contiguous().view(b, t, e))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, n_positions, vocab_size=256):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(n_positions, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, eps=1e-5)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


class Wrapper(nn.Module):
    """Names the model `transformer`, as Volt's module registers it."""

    def __init__(self, args):
        super().__init__()
        self.transformer = Gpt(args.n_layer, args.n_head, args.n_embd, args.block_size)

    def forward(self, idx):
        return self.transformer(idx)


def make_model(args):
    model = Wrapper(args)
    model.load_state_dict(read_safetensors(args.init), strict=True)
    return model


def windows(args):
    """Volt's gpt::token_windows: windows of block_size + 1 bytes every block_size bytes (each
    shares its first byte with the previous one's last), so every byte is a target once."""
    tokens = torch.from_numpy(np.fromfile(args.text, dtype=np.uint8).astype(np.int64))
    w = tokens.unfold(0, args.block_size + 1, args.block_size)
    return TensorDataset(w[:, :-1].contiguous(), w[:, 1:].contiguous())


def optimizer_and_schedule(model, args):
    decayed = [p for p in model.parameters() if p.dim() >= 2]
    plain = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decayed, "weight_decay": 0.1}, {"params": plain, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    warmup, total, floor = args.warmup_steps, args.steps, 0.1

    def factor(step):  # Volt's LinearWarmupCosineLR, as a multiple of lr
        if step < warmup:
            return step / warmup
        progress = min(1.0, (step - warmup) / (total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def flops_per_token(args):
    e, l, t = args.n_embd, args.n_layer, args.block_size
    weights = 256 * e + l * (12 * e * e + 13 * e) + 2 * e  # every parameter but the position embedding
    return 6 * weights + 12 * l * e * t


def report(name, world, stamps, losses, args):
    w = args.warmup
    step_ms = 1000 * (stamps[-1] - stamps[w]) / (len(stamps) - 1 - w)
    tokens = args.batch_size * args.block_size * world
    print(f"{name} processes={world} step_ms={step_ms:.4f} tokens_per_s={tokens * 1000 / step_ms:.1f} "
          f"flops_per_s={flops_per_token(args) * tokens * 1000 / step_ms:.4g} steps={len(stamps)}")
    print("losses " + " ".join(f"{x:.6f}" for x in losses), flush=True)


def pytorch_worker(rank, world, port, args):
    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    model = make_model(args)
    train = model if world == 1 else nn.parallel.DistributedDataParallel(model)
    opt, schedule = optimizer_and_schedule(model, args)
    data = windows(args)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    stamps, losses, epoch = [], [], 0
    while len(stamps) < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            logits = train(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            schedule.step()
            losses.append(loss.item())
            stamps.append(time.perf_counter())
            if len(stamps) == args.steps:
                break
        epoch += 1
    if rank == 0:
        report("pytorch", world, stamps, losses, args)
    if world > 1:
        dist.destroy_process_group()


def allow_torch_shard_import():
    """Debian's torch 1.13 cannot import torch.distributed._shard on Python 3.11: a dataclass there
    has an instance as a field default, which 3.11 refuses ("mutable default"), and Lightning
    imports it whenever torch.distributed is available. The tests that run Lightning in one
    process hide torch.distributed; ddp needs it, so such a default becomes a default_factory that
    copies it, which is what the field means."""
    import copy
    import dataclasses

    original = dataclasses._get_field

    def lenient(cls, name, *rest):
        try:
            return original(cls, name, *rest)
        except ValueError as error:
            if "mutable default" not in str(error):
                raise
            default = cls.__dict__[name]
            setattr(cls, name, dataclasses.field(default_factory=lambda: copy.deepcopy(default)))
            return original(cls, name, *rest)

    dataclasses._get_field = lenient


def run_lightning(args):
    allow_torch_shard_import()
    import pytorch_lightning as pl

    # With torch.distributed._shard importable, Lightning 1.9.5 registers sharded-tensor state-dict
    # hooks on the module class, which torch 1.13 cannot register that way (a weak reference to a
    # proxy). No sharded tensor is involved here.
    pl.LightningModule._register_sharded_tensor_state_dict_hooks_if_available = lambda self: None

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = make_model(args)
            self.losses = []

        def forward(self, x):
            return self.model(x)

        def training_step(self, batch, _):
            x, y = batch
            logits = self.model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
            return loss

        def configure_optimizers(self):
            opt, schedule = optimizer_and_schedule(self.model, args)
            return [opt], [{"scheduler": schedule, "interval": "step"}]

        def train_dataloader(self):
            data = windows(args)
            # The sampler the other sides use (Lightning's own, with replace_sampler_ddp, draws
            # another order); Lightning calls its set_epoch.
            sampler = DistributedSampler(data, num_replicas=self.trainer.world_size, rank=self.trainer.global_rank,
                                         shuffle=True, seed=0)
            return DataLoader(data, batch_size=args.batch_size, sampler=sampler)

    class Clock(pl.Callback):
        def __init__(self):
            self.stamps, self.losses = [], []

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.losses.append(outputs["loss"].item())
            self.stamps.append(time.perf_counter())

    torch.set_num_threads(1)
    pl.seed_everything(0, workers=False)
    clock = Clock()
    # Lightning 1.9's "ddp" looks for unused parameters every step (find_unused_parameters=True);
    # a user tuning for speed turns that off, as PyTorch's and Volt's ddp have it.
    strategy = pl.strategies.DDPStrategy(find_unused_parameters=False) if args.processes > 1 else None
    trainer = pl.Trainer(accelerator="cpu", devices=args.processes, strategy=strategy, max_steps=args.steps,
                         replace_sampler_ddp=False,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[clock], num_sanity_val_steps=0)
    trainer.fit(Module())
    if trainer.global_rank == 0:
        report("lightning", args.processes, clock.stamps, clock.losses, args)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", choices=["pytorch", "lightning"], required=True)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10, help="steps left out of the timing")
    parser.add_argument("--init", required=True, help="the initial weights bench_gpt_throughput wrote")
    parser.add_argument("--text", required=True)
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup-steps", type=int, default=10)
    args = parser.parse_args()
    if args.steps <= args.warmup + 1:
        sys.exit(f"--steps {args.steps} must exceed --warmup {args.warmup} + 1")
    if args.framework == "lightning":
        run_lightning(args)
    elif args.processes == 1:
        pytorch_worker(0, 1, 0, args)
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        torch.multiprocessing.spawn(pytorch_worker, args=(args.processes, port, args), nprocs=args.processes)


if __name__ == "__main__":
    main()
