"""PyTorch side of the reverse direction: FSDP2 model + Adam saved with dcp.save (default
FileSystemWriter) at world size W (gloo, CPU). Also saves the full reference tensors.
usage: exp4_dcp_save.py OUTDIR W [fs|hf]  (hf: HuggingFaceStorageWriter(save_distributed, enable_consolidation), model only)"""
import os, sys
import torch, torch.distributed as dist, torch.multiprocessing as mp


WRITER = "fs"


def run(rank, W, d, writer):
    global WRITER
    WRITER = writer
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29534")
    dist.init_process_group("gloo", rank=rank, world_size=W)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh
    from common import Net
    mesh = init_device_mesh("cpu", (W,))
    torch.manual_seed(7)
    m = Net()
    fully_shard(m.fc1, mesh=mesh); fully_shard(m.fc2, mesh=mesh); fully_shard(m, mesh=mesh)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    for _ in range(2):
        m(torch.randn(8, 4)).pow(2).mean().backward(); opt.step(); opt.zero_grad()
    msd, osd = get_state_dict(m, opt)
    if WRITER == "hf":   # PyTorch's own HF writer, every rank writes its shard (model only: tensors)
        from torch.distributed.checkpoint import HuggingFaceStorageWriter
        dcp.save(msd, storage_writer=HuggingFaceStorageWriter(d, save_distributed=True, enable_consolidation=True))
    else:
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=d)
    full = lambda t: t.full_tensor() if hasattr(t, "full_tensor") else t
    ref = {"model": {k: full(v) for k, v in msd.items()},
           "optim": {f"{p}.{f}": full(v) for p, st in osd["state"].items() for f, v in st.items()},
           "param_groups": osd["param_groups"]}
    if rank == 0:
        torch.save(ref, d.rstrip("/") + ".reference.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    d, W = sys.argv[1], int(sys.argv[2])
    WRITER = sys.argv[3] if len(sys.argv) > 3 else "fs"
    mp.spawn(run, args=(W, d, WRITER), nprocs=W)
