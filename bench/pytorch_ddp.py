"""PyTorch's side of the ddp benchmark: the same MLP, data, optimizer and batch as
bench/ddp_throughput.cpp, under torch.nn.parallel.DistributedDataParallel over Gloo.

    python3 bench/pytorch_ddp.py --processes 2 --steps 400 --warmup 50 [--zero | --fsdp MODE]
Prints `pytorch processes=N step_ms=... samples_per_s=...` from rank 0. With --zero, Adam runs as
torch.distributed.optim.ZeroRedundancyOptimizer (each process keeps 1/N of its state, ZeRO-1;
the line starts `pytorch-zero`), PyTorch's own sharding that runs on CPU in torch 1.13, and every
rank prints `memory rank=R optimizer_state=BYTES`. With --fsdp shard_grad_op|full_shard (torch
2.x, whose FSDP runs on CPU over Gloo: PYTHONPATH=/opt/volt/python-torchrun), the model is
wrapped in FullyShardedDataParallel with that sharding strategy instead (`pytorch-fsdp`).
"""
import argparse
import gzip
import os
import socket
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DATA = "/usr/share/datasets/fashion-mnist"


def load(data_dir):
    with gzip.open(os.path.join(data_dir, "train-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(os.path.join(data_dir, "train-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    x = (torch.from_numpy(images.astype(np.float32)) / 255.0 - 0.2860) / 0.3530
    return x, torch.from_numpy(labels.astype(np.int64))


def worker(rank, world, port, args):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    x, y = load(args.data_dir)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    if args.fsdp:
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
        # full_shard: each Linear a unit of its own, as Volt's benchmark wraps each in a volt::FsdpUnit.
        policy = None
        if args.fsdp == "full_shard":
            from torch.distributed.fsdp.wrap import ModuleWrapPolicy
            policy = ModuleWrapPolicy({torch.nn.Linear})
        ddp = FullyShardedDataParallel(model, sharding_strategy=ShardingStrategy[args.fsdp.upper()],
                                       device_id=torch.device("cpu"), auto_wrap_policy=policy)
    else:
        ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    if args.zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        optimizer = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    else:
        optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    sampler = torch.utils.data.distributed.DistributedSampler(torch.utils.data.TensorDataset(x, y), world, rank,
                                                              shuffle=True, seed=0)
    times = []
    step = 0
    epoch = 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        order = torch.tensor(list(iter(sampler)))
        for start in range(0, len(order), 64):
            index = order[start:start + 64]
            loss = torch.nn.functional.cross_entropy(ddp(x.index_select(0, index)), y.index_select(0, index))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            times.append(time.perf_counter())
            step += 1
            if step >= args.steps:
                break
        epoch += 1
    if args.zero or args.fsdp:
        state = optimizer.optim.state if hasattr(optimizer, "optim") else optimizer.state
        held = sum(t.numel() * t.element_size() for s in state.values() for t in s.values()
                   if torch.is_tensor(t) and t.dim() > 0)
        # One rank at a time: lines written at once by several processes interleave.
        for r in range(world):
            if r == rank:
                print(f"memory rank={rank} optimizer_state={held}", flush=True)
            dist.barrier()
    if rank == 0:
        per_step = (times[-1] - times[args.warmup]) / (len(times) - 1 - args.warmup)
        name = "pytorch-zero" if args.zero else "pytorch-fsdp" if args.fsdp else "pytorch"
        print(f"{name} processes={world} step_ms={per_step * 1000:.4f} samples_per_s={64 * world / per_step:.1f}",
              flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--data-dir", default=DATA)
    parser.add_argument("--zero", action="store_true", help="Adam as ZeroRedundancyOptimizer (sharded state)")
    parser.add_argument("--fsdp", choices=["shard_grad_op", "full_shard"],
                        help="wrap the model in torch 2.x's FullyShardedDataParallel with this sharding strategy")
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(args.processes, port, args), nprocs=args.processes, join=True)


if __name__ == "__main__":
    main()
