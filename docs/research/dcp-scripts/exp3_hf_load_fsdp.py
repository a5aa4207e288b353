"""Load the HF-layout (or, if CKPT_DIR/.metadata exists, the DCP-layout) sharded checkpoint at world size W (gloo, CPU) into an FSDP2 (fully_shard) model
+ Adam via get_state_dict/set_state_dict, and compare the full tensors bit-exactly on every rank.
usage: exp3_hf_load_fsdp.py CKPT_DIR W"""
import os, sys
import torch, torch.distributed as dist, torch.multiprocessing as mp


def run(rank, W, d):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    dist.init_process_group("gloo", rank=rank, world_size=W)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh
    from common import Net, compare
    mesh = init_device_mesh("cpu", (W,))
    torch.manual_seed(123)
    m = Net()
    fully_shard(m.fc1, mesh=mesh); fully_shard(m.fc2, mesh=mesh); fully_shard(m, mesh=mesh)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    m(torch.randn(2, 4)).sum().backward(); opt.step(); opt.zero_grad()   # materialize Adam state
    msd, osd = get_state_dict(m, opt)
    if rank == 0:
        print(f"[W={W}] local shard of fc1.weight:", type(msd["fc1.weight"]).__name__,
              tuple(msd["fc1.weight"].to_local().shape), "placements", msd["fc1.weight"].placements,
              "| step type:", type(osd["state"]["fc1.weight"]["step"]).__name__)
    sd = {"model": msd, "optim": osd}
    from torch.distributed.checkpoint import FileSystemReader
    reader = FileSystemReader(d) if os.path.exists(os.path.join(d, ".metadata")) else HuggingFaceStorageReader(d)
    dcp.load(sd, storage_reader=reader,
             planner=DefaultLoadPlanner(allow_partial_load=True))   # param_groups: not in checkpoint
    set_state_dict(m, opt, model_state_dict=msd, optim_state_dict=osd)
    ref = torch.load(os.path.join(d, "..", "reference.pt"))
    full = lambda t: t.full_tensor() if hasattr(t, "full_tensor") else t
    msd2, osd2 = get_state_dict(m, opt)
    ok = True
    for k, v in ref["model"].items():
        ok &= compare(f"r{rank} model.{k}", full(msd2[k]), v) if rank == 0 else torch.equal(full(msd2[k]), v)
    for k, v in ref["optim"].items():
        p, f = k.rsplit(".", 1)
        a = full(osd2["state"][p][f])
        ok &= compare(f"r{rank} optim.{k}", a, v) if rank == 0 else torch.equal(a.view(-1).view(torch.uint8), v.view(-1).view(torch.uint8))
    print(f"[W={W}] rank {rank}: {'ALL OK' if ok else 'MISMATCH'}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    d, W = sys.argv[1], int(sys.argv[2])
    mp.spawn(run, args=(W, d), nprocs=W)
