#!/usr/bin/python3
"""PyTorch DistributedDataParallel (Gloo) side of bench/dp.py: the models of
torch_train.py, W processes x T threads, a global batch split evenly, the
same SGD-momentum step. Prints one JSON object (rank 0)."""
import argparse, json, os, socket, sys, time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_train import make  # noqa: E402


def worker(rank, a, port, q):
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=a.workers)
    torch.manual_seed(1)
    m = make(a.model)
    ddp = nn.parallel.DistributedDataParallel(m) if a.workers > 1 else m
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    b = a.batch // a.workers
    x = torch.randn(b, 1, 28, 28)
    y = torch.randint(0, 10, (b,))
    lossf = nn.CrossEntropyLoss()
    warm = a.steps // 5 + 2
    for s in range(warm + a.steps):
        if s == warm:
            dist.barrier()
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        lossf(ddp(x), y).backward()
        opt.step()
    dist.barrier()
    dt = time.perf_counter() - t0
    if rank == 0:
        q.put({"impl": "pytorch-ddp", "version": torch.__version__, "model": a.model, "batch": a.batch,
               "workers": a.workers, "threads": a.threads, "steps": a.steps,
               "samples_per_sec": round(a.steps * a.batch / dt, 1)})
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0)
    a = ap.parse_args()
    a.batch = a.batch or (64 if a.model == "cnn" else 256)
    a.steps = a.steps or (60 if a.model == "cnn" else 200)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    mp.spawn(worker, args=(a, port, q), nprocs=a.workers, join=True)
    print(json.dumps(q.get()))


if __name__ == "__main__":
    main()
